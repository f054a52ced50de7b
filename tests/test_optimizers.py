"""engine.config.optimizers' table against torch itself: every entry builds its optimizer, keeps the state it declares
after a real step, has the fused kernel it claims, and appears wherever an optimizer can be chosen.

An optimizer added to the table with a wrong or missing figure fails here, and so does one a real step's readers
(a memory snapshot's annotations and frames) would not name.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.snapshot_synth import make_snapshot
from engine.config.optimizers import EIGHT_BIT_OPTIMIZERS, NAME_OF_STEP_FILE, OPTIMIZER_TABLE
from engine.config.train_config import OPTIMIZERS, TrainConfig
from engine.sketch.layer_math import optimizer_state_bytes
from engine.snapshots.frames import classify
from engine.snapshots.reader import snapshot_estimate
from engine.trace.step import make_optimizer

ENTRIES = list(OPTIMIZER_TABLE.values())


def _stepped(name: str, **cfg) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    opt = make_optimizer(model.parameters(), TrainConfig(optimizer=name, device="cpu", **cfg))
    model(torch.randn(3, 8)).sum().backward()
    if opt is not None:
        opt.step()
    return model, opt


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_entry_is_complete(spec):
    assert spec.label and spec.state_what
    library = torch.optim if spec.library == "torch" else pytest.importorskip("bitsandbytes").optim
    assert spec.torch_class is None or isinstance(getattr(library, spec.torch_class), type)
    assert spec.name in OPTIMIZERS  # the config (and so the CLI's --optimizer and the app's menu) accepts it


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_state_per_parameter_is_what_torch_keeps(spec):
    model, opt = _stepped(spec.name)
    if spec.torch_class is None:
        assert opt is None and spec.state_per_param == 0
        return
    assert type(opt).__name__ == spec.torch_class
    for p in model.parameters():
        full = [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.shape == p.shape]
        assert len(full) == spec.state_per_param, (spec.name, [k for k in opt.state[p]])
    n = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(n, spec.name) == spec.state_per_param * n * (spec.state_bytes or 4)


@pytest.mark.parametrize("spec", [o for o in ENTRIES if o.fused], ids=[o.name for o in ENTRIES if o.fused])
def test_fused_entries_build_a_fused_step(spec):
    _model, opt = _stepped(spec.name, fused=True)
    assert opt is not None and opt.defaults.get("fused") is True


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_adaptive_means_second_moments(spec):
    # the planner offers SGD with momentum instead of an optimizer that keeps more than one buffer or a moment
    assert spec.adaptive == (spec.cpu_step_temporaries > 0)
    if spec.adaptive:
        assert spec.state_per_param >= 1 and spec.name != "sgd-momentum"


@pytest.mark.parametrize("spec", [o for o in ENTRIES if o.state_bytes], ids=[o.name for o in ENTRIES if o.state_bytes])
def test_fixed_state_bytes_are_what_the_library_keeps(spec):
    """8-bit optimizers: a tensor of at least 4096 values keeps its states in state_bytes per value (bitsandbytes'
    min_8bit_size; smaller ones stay float32, as the tiny model above shows)."""
    big = nn.Linear(128, 64, bias=False)
    opt = make_optimizer(big.parameters(), TrainConfig(optimizer=spec.name, device="cpu"))
    big(torch.randn(3, 128)).sum().backward()
    opt.step()
    full = [v for v in opt.state[big.weight].values() if isinstance(v, torch.Tensor) and v.shape == big.weight.shape]
    assert len(full) == spec.state_per_param and all(v.element_size() == spec.state_bytes for v in full)


STEPPED = [o for o in ENTRIES if o.torch_class is not None]


def _library(spec):
    return torch.optim if spec.library == "torch" else pytest.importorskip("bitsandbytes").optim


@pytest.mark.parametrize("spec", STEPPED, ids=[o.name for o in STEPPED])
def test_a_snapshot_of_its_step_names_it(spec):
    """The name torch's profiling hook gives the entry's real step (a snapshot keeps it as an annotation), read by the
    snapshot reader: the entry itself, or the table's entry of the same class (SGD's momentum is told from its
    state), never "adam assumed"."""
    model = nn.Linear(128, 64)  # 8192 weights: an 8-bit optimizer keeps 8-bit state for it
    opt = make_optimizer(model.parameters(), TrainConfig(optimizer=spec.name, device="cpu"))
    model(torch.randn(3, 128)).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    (annotation,) = {e.name for e in prof.events() if e.name.startswith("Optimizer.step#")}
    assert annotation == f"Optimizer.step#{spec.torch_class}.step"
    data, _expected = make_snapshot(600, layers=4)
    for a in data["external_annotations"]:
        a["name"] = annotation
    est = snapshot_estimate(data)
    named = OPTIMIZER_TABLE[est.config.optimizer]
    assert named.torch_class == spec.torch_class, (spec.name, est.config.optimizer)
    assert not any("adam assumed" in n for n in est.notes)


@pytest.mark.parametrize("spec", [o for o in STEPPED if o.library == "torch"],
                         ids=[o.name for o in STEPPED if o.library == "torch"])
def test_the_frames_of_its_step_name_it(spec):
    """A snapshot without annotations: its torch/optim/<file>.py in the frames, the class's real source file."""
    path = Path(inspect.getsourcefile(getattr(torch.optim, spec.torch_class)))
    assert path.stem == spec.step_file
    facts = classify([{"name": "step", "filename": str(path), "line": 1}])
    assert facts.hint == "optimizer" and OPTIMIZER_TABLE[NAME_OF_STEP_FILE[facts.optimizer_file]].torch_class \
        == spec.torch_class


def test_derived_sets_follow_the_table():
    assert set(EIGHT_BIT_OPTIMIZERS) == {o.name for o in ENTRIES if o.library == "bitsandbytes"}
    assert EIGHT_BIT_OPTIMIZERS  # the tracer decomposes these steps (engine.trace.recorded_step)
    for o in ENTRIES:
        if o.eight_bit is not None:  # the planner's offer: an 8-bit entry of the same kind
            offered = OPTIMIZER_TABLE[o.eight_bit]
            assert offered.state_bytes == 1 and offered.two_moments == o.two_moments and o.library == "torch"
