"""The second step's forward/backward copied from the first (engine.trace.step_replay): the same trace as running it,
and running it whenever the first step leaves something behind that a copy would not reproduce."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch
from torch import nn

import engine.trace.recorded_step as recorded_step
import engine.trace.step_replay as step_replay
import engine.trace.tracer as tracer
from benchmarks.zoo_models import ZOO, FunctionSource
from engine.config.train_config import TrainConfig
from engine.measure.cpu_profiler import measure_cpu
from engine.measure.real_fallback import run_for_real


def _shape(trace):
    """The peak and, per (step, phase), the multiset of events (the order of frees that happen at once, when
    Python drops several objects together, is not defined)."""
    groups = defaultdict(Counter)
    run = peak = 0
    for e in trace.events:
        groups[(e.step, e.phase)][(e.nbytes, e.category, e.module, e.op)] += 1
        run += e.nbytes
        peak = max(peak, run)
    return peak, dict(groups)


@pytest.fixture
def replays(monkeypatch):
    seen = []
    real_call = step_replay.StepReplay.__call__

    def spy(self, step):
        seen.append(real_call(self, step))
        return seen[-1]

    monkeypatch.setattr(step_replay.StepReplay, "__call__", spy)
    return seen


def _both(source, cfg, monkeypatch):
    """(copied, run again) traces; the models here are the tests' own code, whose second step is run by default
    (engine.trace.tracer): `fold_own_code` has it copied, as known code's is, so that the copy's checks are tested."""
    cfg = cfg.with_(fold_own_code=True)
    monkeypatch.setattr(recorded_step, "REPLAY_STEPS", True)
    copied, _ = tracer.trace_model(source, cfg, real_run=run_for_real)
    monkeypatch.setattr(recorded_step, "REPLAY_STEPS", False)
    run, _ = tracer.trace_model(source, cfg, real_run=run_for_real)
    return copied, run


# Generation has no second step to copy (engine.trace.text_generation skips decode steps its own way).
CASES = [c for c in ZOO if c.fast and not c.cfg.generating] + [
    c for c in ZOO if c.label == "gpt2 seq64 checkpointing adamw"]


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_copied_step_equals_the_step_run_again(case, replays, monkeypatch):
    copied, run = _both(case.source(), case.cfg, monkeypatch)
    assert _shape(copied) == _shape(run)
    if "data-dependent" in case.label:  # measured by a real run instead: nothing is copied
        assert replays == []
    elif case.cfg.precision != "amp-fp16":  # GradScaler makes its scale at the first step: that one runs again
        assert replays[0] is True


@pytest.mark.parametrize("cfg", [
    TrainConfig(batch_size=2, seq_len=32, grad_accum=2, optimizer="adamw"),  # CUDA target, two micro-batches
    TrainConfig(batch_size=2, seq_len=32, checkpointing=True, precision="amp-bf16"),
    TrainConfig(batch_size=2, seq_len=32, mode="inference"),
], ids=["accumulation", "checkpointing amp-bf16", "inference"])
def test_copied_step_on_the_cuda_target(cfg, replays, monkeypatch):
    copied, run = _both("gpt2", cfg, monkeypatch)
    assert _shape(copied) == _shape(run) and replays[0] is True


def test_a_gradient_made_as_a_view_of_a_larger_buffer_is_copied_without_a_tensor_made_and_dropped(replays,
                                                                                                   monkeypatch):
    """ViT's final LayerNorm: its weight's gradient is a view of a larger buffer. The copy made a tensor of the
    gradient's own size first and dropped it (an allocation and a free the step does not make); it now makes the
    buffer alone, and the copied step is the step run again, event for event in order."""
    cfg = TrainConfig(batch_size=1, image_size=64, optimizer="adamw", gpu="H100")
    copied, run = _both("vit-b16", cfg, monkeypatch)
    assert replays[0] is True
    assert [(e.nbytes, e.step, e.phase, e.module, e.op) for e in copied.events] == \
        [(e.nbytes, e.step, e.phase, e.module, e.op) for e in run.events]


class _CachesAtFirstCall(nn.Module):
    """Fills a cache at its first forward and keeps it: the second step allocates less than the first."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.ones(4096, 64, device=x.device)
        return self.fc(x) + self.cache[: x.shape[0]]


def test_a_step_that_leaves_something_behind_is_run_again(replays, monkeypatch):
    src = FunctionSource("cache", lambda cfg: (_CachesAtFirstCall(), torch.randn(cfg.batch_size, 64)))
    cfg = TrainConfig(batch_size=8, device="cpu", optimizer="adam")
    copied, run = _both(src, cfg, monkeypatch)
    assert replays[0] is False
    assert _shape(copied) == _shape(run)
    _trace, _info, measured = measure_cpu(src, cfg)
    assert _shape(copied)[0] == pytest.approx(measured, rel=1e-4)  # and the figure is the real run's


class _CountsCalls(nn.Module):
    """Does more from its second call on, counted in a plain attribute: no tensor is left behind to see."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        if self.calls > 1:
            h = h + (x.unsqueeze(2) * x.unsqueeze(1)).mean(2)
        return h


class _SharedGradBuffer(nn.Module):
    """The gradient of `a.reshape(-1) + b.reshape(-1)` reaches both parameters as views of one buffer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(256, 256))
        self.b = nn.Parameter(torch.randn(256, 256))

    def forward(self, x):
        return x @ (self.a.reshape(-1) + self.b.reshape(-1)).view(256, 256)


@pytest.mark.parametrize("model", [_CountsCalls, _SharedGradBuffer], ids=["call counter", "shared gradient buffer"])
def test_declines_what_a_copy_would_get_wrong(model, replays, monkeypatch):
    src = FunctionSource(model.__name__, lambda cfg: (model(), torch.randn(cfg.batch_size, 256)))
    cfg = TrainConfig(batch_size=64, device="cpu", optimizer="adam")
    copied, run = _both(src, cfg, monkeypatch)
    assert replays[0] is False
    assert _shape(copied) == _shape(run)
    _trace, _info, measured = measure_cpu(src, cfg)
    assert _shape(copied)[0] == pytest.approx(measured, rel=1e-4)


def test_rnn_weights_relisted_at_the_first_call_do_not_stop_the_copy(replays, monkeypatch):
    src = FunctionSource("gru", lambda cfg: (nn.GRU(32, 64, num_layers=2), torch.randn(10, cfg.batch_size, 32)))
    copied, run = _both(src, TrainConfig(batch_size=4, device="cpu", optimizer="adam"), monkeypatch)
    assert replays[0] is True and _shape(copied) == _shape(run)


_CALLS = [0]


class _GlobalCount(nn.Module):
    """Does more at its second call, counted in a global: state the copy's checks cannot see."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(512, 2048)

    def forward(self, x):
        _CALLS[0] += 1
        h = torch.relu(self.fc(x))
        if _CALLS[0] % 2 == 0:
            h = torch.sigmoid(h.unsqueeze(0).expand(64, *h.shape)).mean(0)
        return h


def test_the_users_own_code_has_its_second_step_run_not_copied(replays, monkeypatch):
    """Copied, the estimate was 42,123,280 B against the real 130,711,576 B (-68 %)."""
    src = FunctionSource("global-count", lambda cfg: (_GlobalCount(), torch.randn(cfg.batch_size, 512)))
    cfg = TrainConfig(batch_size=64, device="cpu", optimizer="adamw")
    _CALLS[0] = 0
    trace, info = tracer.trace_model(src, cfg)
    assert replays == [] and any("both steps (the model is the user's own code" in n for n in info.notes)
    _CALLS[0] = 0
    _trace, _info, measured = measure_cpu(src, cfg)
    assert _shape(trace)[0] == pytest.approx(measured, rel=1e-4)
