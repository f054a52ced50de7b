"""The GPU a user types is resolved once, when the configuration is built (TrainConfig), to one catalogue entry
that the estimator, the device model, the planner and the CLI all read; an unknown GPU fails there, with one
message, whichever front door it came through."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

import engine.config.gpus as gpus
import main as entry
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.cuda.device_model import device_detail
from engine.cuda.gpu_profile import list_profiles
from engine.models.sources import resolve_source
from engine.planning.planner import recommend
from engine.results.types import Estimate
from engine.trace.tracer import trace_model

TINY = f"{Path(__file__).resolve().parent / 'fixtures' / 'cli_models.py'}:tiny"


def _spellings(g: gpus.GpuSpec) -> list[str]:
    """Every way the catalogue accepts a GPU: its name, its aliases, in any case, with the vendor's prefix."""
    out = [g.name, *g.aliases]
    return out + [s.lower() for s in out] + [s.upper() for s in out] + [f"NVIDIA {g.name}"]


@pytest.mark.parametrize("spec", gpus.list_gpus(), ids=lambda g: g.name)
def test_every_accepted_spelling_gives_the_catalogue_entry_and_its_canonical_name(spec):
    for typed in _spellings(spec):
        for cfg in (TrainConfig(gpu=typed), TrainConfig.from_options({"gpu": typed, "batch_size": 2})):
            assert cfg.gpu_spec is spec, typed
            assert cfg.gpu == spec.name, typed
            # the canonical name survives a copy, a saved file and a trip to the engine process
            assert cfg.with_(batch_size=3).gpu_spec is spec
            assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))).gpu_spec is spec
            assert pickle.loads(pickle.dumps(cfg)).gpu_spec == spec


def test_two_spellings_of_one_gpu_are_one_configuration():
    assert TrainConfig(gpu="h100") == TrainConfig(gpu="NVIDIA H100 80GB HBM3")
    assert TrainConfig(gpu="h100").to_json() == TrainConfig(gpu="H100 80GB").to_json()
    assert TrainConfig().gpu_spec is None and TrainConfig(gpu="").gpu is None


class _Spy:
    """engine.config.gpus.find_gpu, recording every name it is asked to resolve."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.real = gpus.find_gpu

    def __call__(self, name: str) -> gpus.GpuSpec:
        self.asked.append(name)
        return self.real(name)


def test_the_typed_name_is_resolved_once_and_every_consumer_reads_the_same_entry(monkeypatch):
    spy = _Spy()
    for mod in [m for m in sys.modules.values() if getattr(m, "find_gpu", None) is gpus.find_gpu]:
        monkeypatch.setattr(mod, "find_gpu", spy)  # engine.config.gpus and every module that imported the name
    typed = "nvidia h200"
    cfg = TrainConfig.from_options({"gpu": typed, "batch_size": 4})
    spec = cfg.gpu_spec
    assert spec is not None and spec.name == "H200 141GB"
    # the device model (what the estimator adds for a CUDA target) reads cfg's entry
    source = resolve_source(TINY)
    trace, info = trace_model(source, cfg)
    from engine.trace.summary import summarise

    est = summarise(trace, info, cfg)
    detail = device_detail(trace, est, cfg)
    assert detail.gpu is spec
    assert detail.figures.gpu_name == spec.name and detail.figures.gpu_total_bytes == spec.memory_bytes
    # the planner: its fit verdicts compare with that GPU's usable memory
    seen: list[TrainConfig] = []

    def fake(c: TrainConfig) -> Estimate:
        seen.append(c)
        return est

    recommend(source, cfg, base=est, estimator=fake)
    assert seen and all(c.gpu_spec is spec for c in seen)
    # whatever copies were made, the user's text was parsed once; every later lookup was of the catalogue's own
    # name (a copy of the configuration) or of a calibration profile's GPU (matched to the target), never of a
    # name some view typed again
    assert spy.asked.count(typed) == 1
    profiles = {p.gpu_name for _, p in list_profiles()}
    assert set(spy.asked) - {typed, spec.name} <= profiles


def test_the_cli_reports_the_resolved_gpu(capsys):
    rc = entry.main(["estimate", TINY, "--gpu", "rtx-4090", "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    d = json.loads(out)
    spec = gpus.find_gpu("RTX 4090")
    assert d["config"]["gpu"] == spec.name
    assert d["gpu"]["gpu_name"] == spec.name and d["gpu"]["gpu_total_bytes"] == spec.memory_bytes


def test_an_unknown_gpu_fails_where_the_configuration_is_built_with_one_message(capsys):
    with pytest.raises(UserError) as built:
        TrainConfig(gpu="voodoo2")
    message = str(built.value)
    assert message.startswith("--gpu: unknown GPU 'voodoo2'") and "\n" not in message
    with pytest.raises(UserError) as loaded:
        TrainConfig.from_json({**TrainConfig().to_json(), "gpu": "voodoo2"})
    assert str(loaded.value) == message
    for command in (["estimate", TINY, "--gpu", "voodoo2"], ["plan", TINY, "--gpu", "voodoo2"],
                    ["max-batch", TINY, "--gpu", "voodoo2"]):
        rc = entry.main(command)
        out, err = capsys.readouterr()
        assert rc == 2, command
        assert err.strip().splitlines() == [f"error: {message}"], (command, err)
        assert out == ""


def test_the_app_targets_the_same_entries_as_the_engine(qtbot, fake_nvml):
    """The panel's targets are the catalogue's entries and this machine's GPU as engine.config.gpus.local_gpu names it:
    what the gauge compares with and what the configuration carries are the same entry."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    import gui.config_panel as config_panel
    from tests.fake_nvml import FakeGpu

    h200 = gpus.find_gpu("H200")
    fake_nvml.gpus = [FakeGpu("NVIDIA H200", 143771, 700)]  # as on a machine with an H200 (NVML's name for it)
    panel = config_panel.ConfigPanel()
    qtbot.addWidget(panel)
    panel.show()
    local = panel.target.findData(config_panel.LOCAL_TARGET)
    assert local >= 0 and h200.name in panel.target.itemText(local)
    panel.target.setCurrentIndex(local)
    assert panel.target_gpu_bytes() == h200.usable_bytes
    assert panel.config().gpu_spec is h200
    # a configuration typed elsewhere ('t4' in a saved sketch) selects the catalogue's T4 item
    t4 = gpus.find_gpu("t4")
    panel.set_config(TrainConfig(gpu="t4"))
    assert panel.target.currentData() == t4.name and panel.target_gpu_bytes() == t4.usable_bytes
    # the user picks the CPU with the keyboard: no GPU, no budget
    panel.target.setFocus()
    QTest.keyClick(panel.target, Qt.Key.Key_End)
    assert panel.config().device == "cpu" and panel.config().gpu_spec is None
    assert panel.target_gpu_bytes() is None


def test_this_machines_gpu_is_the_one_torch_computes_on(monkeypatch, fake_nvml):
    """What is measured here (context, kernels) counts for the target only when the target is the card torch runs
    on: its current CUDA device as CUDA_VISIBLE_DEVICES numbers it, not NVML's index 0 (mixed-GPU machines)."""
    import torch

    from tests.fake_nvml import FakeGpu

    h200, a100 = gpus.find_gpu("h200"), gpus.find_gpu("a100 80gb")
    fake_nvml.gpus = [FakeGpu("NVIDIA A100-SXM4-80GB", 81920, 400), FakeGpu("NVIDIA H200", 143771, 700)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")  # CUDA_VISIBLE_DEVICES=1
    assert gpus.local_gpu(0) == a100
    assert gpus.cuda_device_gpu() == h200
    assert gpus.is_this_machines_gpu(h200) and not gpus.is_this_machines_gpu(a100)
    assert not gpus.is_this_machines_gpu(None)

    # before CUDA starts, asking must not start it (get_device_name would): NVML names the visible device
    def starts_cuda(device=None):
        raise AssertionError("started CUDA to name the device")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", starts_cuda)
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda device: 1)  # CUDA_VISIBLE_DEVICES=1
    assert gpus.cuda_device_gpu() == h200 and not gpus.is_this_machines_gpu(a100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.cuda_device_gpu() is None and not gpus.is_this_machines_gpu(h200)
