"""The same estimate twice gives the same figures, event for event: C++ releases some batches of storages in
hash-map order (the autocast cache's weight casts at autocast's exit), which changed the AMP timelines from run to
run; the recorder keeps such a run of frees in allocation order (engine.tracker.StorageRecorder._record_free)."""

from __future__ import annotations

import torch
from torch import nn

import vramscope
from engine.tracker import PtrRecorder, StorageRecorder


def _free_in_reverse(rec: StorageRecorder) -> list[int]:
    ts = [torch.empty(16 * (i + 1), dtype=torch.uint8) for i in range(4)]
    keys = [rec.track(t, "empty") for t in ts]
    rec.op = "clear"
    while ts:
        ts.pop()  # the last made is freed first
    start = len(keys)
    return [e.storage for e in rec.events[start:]], keys


def test_a_run_of_frees_under_one_op_is_kept_in_allocation_order():
    frees, keys = _free_in_reverse(StorageRecorder())
    assert frees == keys


def test_a_real_runs_recorder_keeps_the_order_it_saw():
    frees, keys = _free_in_reverse(PtrRecorder())
    assert frees == keys[::-1]


def test_frees_are_not_moved_across_an_allocation_or_another_op():
    rec = StorageRecorder()
    a, b = torch.empty(8), torch.empty(8)
    ka, kb = rec.track(a, "empty"), rec.track(b, "empty")
    rec.op = "first"
    del b
    c = torch.empty(8)
    kc = rec.track(c, "empty")
    rec.op = "second"
    del a
    assert [(e.storage, e.op) for e in rec.events[2:]] == [(kb, "first"), (kc, "empty"), (ka, "second")]
    del c


def test_an_amp_step_gives_the_same_timeline_every_time():
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    x = torch.randn(64, 512)
    options = dict(device="cpu", optimizer="adamw", precision="amp-fp16")
    first = vramscope.estimate(model, x, **options).to_json()
    for _ in range(3):
        again = vramscope.estimate(model, x, **options).to_json()
        assert again["timeline"] == first["timeline"]
        assert again["peak_bytes"] == first["peak_bytes"]
