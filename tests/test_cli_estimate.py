"""`main.py estimate` and `max-batch`: the JSON contract, and a one-line message with exit 2 for every mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import main as entry
from engine.config.train_config import TrainConfig
from engine.models.sources import resolve_source
from engine.planning.estimator import estimate

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
TINY = f"{FIX / 'cli_models.py'}:tiny"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = entry.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_has_the_documented_fields_and_equals_the_engine(capsys):
    rc, out, _ = run(capsys, "estimate", TINY, "--batch-size", "16", "--device", "cpu", "--json")
    assert rc == 0
    d = json.loads(out)
    est = estimate(resolve_source(TINY), TrainConfig(batch_size=16, device="cpu"))
    assert d["peak_bytes"] == est.peak_bytes and isinstance(d["peak_bytes"], int)
    assert d["parameters"] == 32 * 64 + 64 + 64 * 10 + 10
    assert sum(d["breakdown_at_peak"].values()) == d["peak_bytes"]
    assert {"name", "type", "parameters", "activation_bytes", "share_of_peak"} <= set(d["per_module"][0])
    assert d["timeline"] and {"phase", "step", "by_category", "total"} <= set(d["timeline"][0])
    assert d["config"]["batch_size"] == 16


def test_cuda_target_adds_gpu_figures(capsys):
    rc, out, _ = run(capsys, "estimate", TINY, "--gpu", "T4", "--json")
    assert rc == 0
    d = json.loads(out)
    g = d["gpu"]  # each GPU figure once, under "gpu" (GpuFigures' fields), none copied to the top level
    assert g["reserved_bytes"] >= d["peak_bytes"]
    assert g["nvidia_smi_bytes"] > g["reserved_bytes"]
    assert g["fits"] is True and g["verdict"] == "fits" and g["gpu_name"] == "T4"
    assert g["nvidia_smi_low_bytes"] <= g["nvidia_smi_bytes"] <= g["nvidia_smi_high_bytes"]
    assert g["measured_bytes"] + g["modelled_bytes"] == g["nvidia_smi_bytes"]
    assert not {"reserved_bytes", "nvidia_smi_bytes", "fits", "verdict", "assumed_gpu", "nvidia_smi_range"} & set(d)
    est = estimate(resolve_source(TINY), TrainConfig(gpu="T4"))
    assert est.gpu is not None and g["nvidia_smi_bytes"] == est.gpu.nvidia_smi_bytes


def test_readable_summary_uses_binary_units(capsys):
    rc, out, _ = run(capsys, "estimate", TINY, "--device", "cpu")
    assert rc == 0 and "Peak" in out and "KiB" in out and "Breakdown at the peak" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["estimate", "missing_file.py:fn"], "not found"),
        (["estimate", "missing.json"], "not found"),
        (["estimate", "resnet19"], "resnet18"),
        (["estimate", f"{FIX / 'user_models.py'}:small_cn"], "small_cnn"),
        (["estimate", f"{FIX / 'user_models.py'}:raises"], "user_models.py:"),
        (["estimate", f"{FIX / 'cli_models.py'}:mismatch", "--device", "cpu"], "module '2' (Linear)"),
        (["estimate", TINY, "--batch-size", "0"], "batch size"),
        (["estimate", TINY, "--batch-size", "-3"], "batch size"),
        (["estimate", TINY, "--precision", "fp8"], "precision"),
        (["estimate", TINY, "--optimizer", "adamm"], "adam"),
        (["estimate", TINY, "-o", "/nonexistent-dir/out.json"], "cannot write"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0]
    assert "Traceback" not in err


def test_bad_json_files(tmp_path, capsys):
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xff not json {")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"hello": "world"}))
    for path in (garbage, wrong):
        rc, _, err = run(capsys, "estimate", str(path))
        assert rc == 2 and err.count("\n") == 1 and str(path.name) in err, err


def test_output_file_is_written_atomically(tmp_path, capsys):
    target = tmp_path / "est.json"
    rc, _, _ = run(capsys, "estimate", TINY, "--device", "cpu", "-o", str(target))
    assert rc == 0
    assert json.loads(target.read_text())["peak_bytes"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["est.json"]


def test_user_code_error_in_a_subprocess_has_no_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "estimate", f"{FIX / 'user_models.py'}:raises"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "ValueError" in p.stderr and "user_models.py:" in p.stderr


def test_max_batch_is_the_largest_that_fits(capsys):
    cfg = TrainConfig(batch_size=1, device="cpu")
    src = resolve_source(TINY)
    budget = estimate(src, cfg.with_(batch_size=700)).peak_bytes + 1
    rc, out, _ = run(capsys, "max-batch", TINY, "--device", "cpu", "--budget", str(budget / 1024**3), "--json")
    assert rc == 0
    d = json.loads(out)
    n = d["batch_size"]
    assert estimate(src, cfg.with_(batch_size=n)).peak_bytes <= budget
    assert budget < estimate(src, cfg.with_(batch_size=n + 1)).peak_bytes
    assert d["peak_bytes"] == estimate(src, cfg.with_(batch_size=n)).peak_bytes


def test_model_code_errors_of_any_type_are_one_line(tmp_path, capsys):
    f = tmp_path / "m.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.l = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        assert x.shape[-1] == 16, 'expected 16 features'\n"
        "        return self.l(x)\n"
        "def build(b):\n    return M(), torch.randn(b, 8)\n"
    )
    rc, _, err = run(capsys, "estimate", f"{f}:build", "--device", "cpu")
    assert rc == 2 and err.count("\n") == 1 and "AssertionError: expected 16 features" in err


def test_constructor_reading_tensor_values_is_built_for_real(tmp_path, capsys):
    f = tmp_path / "dpr.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "def build(b):\n"
        "    rates = [x.item() for x in torch.linspace(0, 0.1, 3)]  # the timm idiom\n"
        "    return nn.Sequential(*[nn.Dropout(r) for r in rates], nn.Linear(16, 4)), torch.randn(b, 16)\n"
    )
    rc, out, _ = run(capsys, "estimate", f"{f}:build", "--device", "cpu", "--json")
    assert rc == 0
    assert json.loads(out)["parameters"] == 16 * 4 + 4


def test_non_finite_budget_is_refused(capsys):
    rc, _, err = run(capsys, "max-batch", TINY, "--budget", "nan")
    assert rc == 2 and "budget" in err
