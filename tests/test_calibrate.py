"""GPU calibration profiles: the no-GPU path, learning from recorded ops, save / load / apply, export and import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config.gpus import find_gpu
from engine.config.train_config import TrainConfig
from engine.cuda import gpu_profile as gp
from engine.planning.estimator import estimate
from main import main

DATA = Path(__file__).parent / "data" / "h200-kernel-ops.jsonl.gz"
MIB = 1 << 20


@pytest.fixture()
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(d))
    gp.reload_profiles()
    yield d
    gp.reload_profiles()


def test_no_gpu_is_one_line_and_exit_2(capsys, data_dir):
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU on this machine" in err[0] and "--import" in err[0]


def test_from_ops_learns_the_builtin_profile(tmp_path, capsys, data_dir):
    out = tmp_path / "h200.json"
    assert main(["calibrate", "--from-ops", str(DATA), "--output", str(out)]) == 0
    learned = gp.load_profile(out)
    builtin = gp.load_profile(gp.builtin_dir() / "nvidia-h200.json")
    assert learned.kernels == builtin.kernels and learned.gpu_name == "NVIDIA H200"


def test_a_user_profile_is_applied_to_its_gpu(data_dir):
    """A synthetic profile for another GPU (the H200's measured kernels, an invented context) is what estimates
    for that GPU use: its kernels are measured, not modelled, and its context replaces the table's."""
    a100 = find_gpu("A100 80GB")
    rows = gp.read_ops(DATA)
    prof = gp.profile_from_ops(rows, gpu_name=a100.name, compute_capability=a100.compute_capability,
                               context_bytes=700 * MIB, source="synthetic, for a test")
    before = estimate("resnet18", TrainConfig(batch_size=8, gpu=a100.name))
    assert before.cuda_kernels.profile is None and before.cuda_kernels.modelled_calls > 0
    path = gp.save_profile(prof)
    assert path.parent == data_dir / "gpu_profiles"
    after = estimate("resnet18", TrainConfig(batch_size=8, gpu=a100.name))
    k = after.cuda_kernels
    assert k.profile == a100.name and k.modelled_calls == 0 and k.measured_calls > 0
    assert after.gpu.cuda_context_bytes == 700 * MIB
    h200 = estimate("resnet18", TrainConfig(batch_size=8, gpu="H200"))
    assert after.replay.max_memory_allocated == h200.replay.max_memory_allocated  # the same kernels
    # the band narrows: measured kernels and context leave less to model
    assert (after.gpu.nvidia_smi_high_bytes - after.gpu.nvidia_smi_low_bytes
            < before.gpu.nvidia_smi_high_bytes - before.gpu.nvidia_smi_low_bytes)


def test_export_import_and_list(tmp_path, capsys, data_dir):
    out = tmp_path / "exported.json"
    assert main(["calibrate", "--export", "H200", str(out)]) == 0
    assert json.loads(out.read_text())["kind"] == "vramscope-gpu-profile"
    assert main(["calibrate", "--import", str(out)]) == 0
    assert (data_dir / "gpu_profiles" / "nvidia-h200.json").is_file()
    capsys.readouterr()
    assert main(["calibrate", "--list", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [f["where"] for f in found if f["gpu"] == "NVIDIA H200"] == ["user", "built-in"]


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"kind": "something else"}', "not a VRAMScope GPU profile"),
    ('{"kind": "vramscope-gpu-profile", "version": 1, "gpu": {}}', "broken GPU profile"),
])
def test_a_broken_profile_is_one_line(tmp_path, capsys, data_dir, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["calibrate", "--import", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "bad.json" in err[0]
    assert main(["calibrate", "--export", "T4", str(tmp_path / "t4.json")]) == 2
    assert "no calibration profile for T4" in capsys.readouterr().err
