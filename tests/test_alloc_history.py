"""The one place that starts and stops PyTorch's allocator history (engine.cuda.alloc_history), through calibration's
TraceRecording: it starts a recording only where none is on, with the arguments calibration needs, stops only the
one it started, and reads the device's events of a real H200 snapshot (tests/data) back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cuda.alloc_history import device_events, history_on
from engine.cuda.kernel_requests import TraceRecording
from engine.snapshots.file import load_snapshot_file

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def snapshot() -> dict[str, Any]:
    return load_snapshot_file(DATA / "resnet18-b8-adam.pickle.gz")


class _FakeCuda:
    """torch.cuda's recording calls as a CUDA machine answers them, with a real snapshot's content."""

    def __init__(self, snapshot: dict[str, Any], on: bool) -> None:
        self.calls: list[dict[str, Any]] = []
        self.snap, self.on = snapshot, on

    def record(self, enabled: str | None = "all", **kw: Any) -> None:
        self.calls.append({"enabled": enabled, **kw})
        self.on = enabled is not None


@pytest.fixture
def fake(monkeypatch, snapshot, request):
    f = _FakeCuda(snapshot, getattr(request, "param", False))
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: f.on, raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", f.record)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device=None: f.snap)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {
        "allocation.all.allocated": 10_000, "allocation.all.freed": 9_000})
    return f


def test_device_events_of_a_real_snapshot(snapshot):
    events = device_events(snapshot, 0)
    assert events is snapshot["device_traces"][0] and len(events) > 1000
    assert {e["action"] for e in events} >= {"alloc", "free_requested"}
    assert device_events(snapshot, 1) == [] and device_events({}, 0) == []


def test_a_recording_is_started_for_the_block_and_stopped_after_it(fake, snapshot):
    with TraceRecording(0, max_entries=1234) as rec:
        assert fake.calls == [{"enabled": "all", "context": None, "stacks": "python", "max_entries": 1234}]
        taken = rec.taken()
    assert taken is not None and taken.events is snapshot["device_traces"][0]
    assert (taken.allocated, taken.freed) == (10_000, 9_000)
    assert fake.calls[-1] == {"enabled": None} and not fake.on


@pytest.mark.parametrize("fake", [True], indirect=True)
def test_a_recording_already_on_is_read_and_left_on(fake, snapshot):
    assert history_on()
    with TraceRecording(0) as rec:
        assert rec.taken() is not None
    assert fake.calls == [] and fake.on


def test_a_pytorch_without_cuda_history_records_nothing():
    if hasattr(torch._C, "_cuda_record_memory_history"):
        pytest.skip("this PyTorch records the CUDA allocator's history")
    assert not history_on()
    with TraceRecording(0) as rec:
        assert not rec.available and rec.taken() is None
