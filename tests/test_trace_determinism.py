"""The same estimate twice gives the same figures, event for event: C++ releases some batches of storages in
hash-map order (the autocast cache's weight casts at autocast's exit), which changed the AMP timelines from run to
run; the recorder keeps the frees of every autocast's exit (a checkpoint's recompute's too) in allocation order
(engine.trace.recorder.StorageRecorder.frees_in_allocation_order, held around every autocast's exit by
autocast_exits_in_allocation_order while a step is recorded)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

import vramscope
from engine.trace.recorder import StorageRecorder


def _free_in_reverse(rec: StorageRecorder, ordered: bool) -> tuple[list[int], list[int]]:
    ts = [torch.empty(16 * (i + 1), dtype=torch.uint8) for i in range(4)]
    keys = [rec.track(t, "empty") for t in ts]
    rec.op = "clear"
    with rec.frees_in_allocation_order() if ordered else contextlib.nullcontext():
        while ts:
            ts.pop()  # the last made is freed first
    return [e.storage for e in rec.events[len(keys):]], keys


def test_frees_held_for_ordering_are_recorded_in_allocation_order():
    frees, keys = _free_in_reverse(StorageRecorder(), ordered=True)
    assert frees == keys


def test_other_frees_keep_the_order_they_were_made_in():
    frees, keys = _free_in_reverse(StorageRecorder(), ordered=False)
    assert frees == keys[::-1]  # a kernel's frees (cuDNN's workspace before its input copy) are the model's order


def test_an_amp_step_gives_the_same_timeline_every_time():
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    x = torch.randn(64, 512)
    options = dict(device="cpu", optimizer="adamw", precision="amp-fp16")
    first = vramscope.estimate(model, x, **options).to_json()
    for _ in range(3):
        again = vramscope.estimate(model, x, **options).to_json()
        assert again["timeline"] == first["timeline"]
        assert again["peak_bytes"] == first["peak_bytes"]


def test_a_users_own_amp_step_gives_the_same_timeline_every_time():
    def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 512)
    first = vramscope.estimate_step(train_step, model, opt, x, device="cpu").to_json()
    for _ in range(3):
        again = vramscope.estimate_step(train_step, model, opt, x, device="cpu").to_json()
        assert again["timeline"] == first["timeline"]


def test_a_checkpointed_amp_step_gives_the_same_trace_every_time():
    """A checkpoint's recompute runs the block under its own autocast in the backward: that autocast's exit frees
    its casts in hash-map order too (StorageRecorder.autocast_exits_in_allocation_order holds every autocast's)."""
    from engine.config.train_config import TrainConfig
    from engine.trace.tracer import trace_model

    cfg = TrainConfig(batch_size=4, optimizer="adamw", gpu="A100 80GB", checkpointing=True, precision="amp-fp16")

    def events() -> list[tuple[object, ...]]:
        trace, _info = trace_model("resources/templates/small-gpt.json", cfg)
        names: dict[int, int] = {}
        return [(names.setdefault(e.storage, len(names)), e.nbytes, e.phase, e.module, e.op) for e in trace.events]

    first = events()
    for _ in range(3):
        assert events() == first


def test_torch_autocast_is_left_as_it_was_after_a_trace():
    before = torch.amp.autocast_mode.autocast.__exit__
    rec = StorageRecorder()
    with rec.autocast_exits_in_allocation_order():
        assert torch.amp.autocast_mode.autocast.__exit__ is not before
    assert torch.amp.autocast_mode.autocast.__exit__ is before
