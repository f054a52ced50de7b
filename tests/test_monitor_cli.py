"""The `monitor` subcommand: no-driver JSON in a real subprocess, and table/JSON/recording over the NVML stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli.monitor as cli_monitor
from engine.monitor.nvml import NvmlSource
from engine.monitor.recording import load_recording
from main import main
from tests.fake_nvml import FakeNvml, fake_details, three_gpus

ROOT = Path(__file__).resolve().parent.parent


def test_once_json_without_driver_in_a_subprocess():
    r = subprocess.run([sys.executable, "main.py", "monitor", "--once", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    if d.get("error") is None:
        pytest.skip("this machine has an NVIDIA driver")
    assert d == {"gpus": [], "error": d["error"]} and isinstance(d["error"], str) and d["error"]
    assert "Traceback" not in r.stderr


@pytest.fixture
def fake(monkeypatch):
    f = FakeNvml(three_gpus())
    monkeypatch.setattr(cli_monitor, "NvmlSource", lambda: NvmlSource(f, process_details=fake_details))
    monkeypatch.setattr(cli_monitor.time, "sleep", lambda s: None)  # the loop's schedule is counted, not waited
    return f


def test_once_table(fake, capsys):
    assert main(["monitor", "--once"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA A100-SXM4-80GB" in out and "29.30 GiB / 80.00 GiB (37%)" in out  # 30000 MiB used
    assert "312 W / 400 W" in out and "MIG ×2" in out
    assert "(access denied)" in out and "python train.py --bs 64" in out


def test_watch_json_with_recordings(fake, capsys, tmp_path):
    csv_path, jsonl_path = tmp_path / "s.csv", tmp_path / "s.jsonl"
    rc = main(["monitor", "--json", "--interval", "0.1", "--duration", "0.3",
               "--csv", str(csv_path), "--jsonl", str(jsonl_path)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # t = 0, 0.1, 0.2 (s); the next tick would pass 0.3 s
    first = json.loads(lines[0])
    assert first["gpus"][0]["memory_total"] == 81920 * 2**20
    assert load_recording(csv_path) == load_recording(jsonl_path) and len(load_recording(csv_path)) == 3


def test_bad_options_are_one_line_errors(capsys):
    assert main(["monitor", "--interval", "0.01"]) == 2
    assert main(["monitor", "--duration", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: interval 0.01 s is below the minimum" in err and "Traceback" not in err
