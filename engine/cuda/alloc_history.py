"""Starting and stopping PyTorch's record of the CUDA caching allocator's history
(`torch.cuda.memory._record_memory_history`), and reading one device's events back from a snapshot of it.

Three places record it: the per-kernel requests of calibration (`engine.cuda.kernel_requests.TraceRecording`), the
real CUDA profile (`engine.measure.cuda_profiler`) and a user's own training loop (`engine.snapshots.record.record`).
torch is imported when called, so this module costs nothing where no GPU is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def history_on() -> bool:
    """Whether a recording is already on; False where this PyTorch cannot say (an old one, or a CPU build)."""
    import torch

    is_on = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return is_on is not None and bool(is_on())


def start_history(max_entries: int, *, stacks: str = "all", context: str | None = "all") -> None:
    """Record every allocator event from now on, keeping the newest `max_entries`; `stacks` and `context` say
    which call stacks each event keeps ("all" is PyTorch's default for both; context None keeps none)."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks=stacks, max_entries=max_entries)


def stop_history() -> None:
    """Stop recording (the events recorded so far are dropped with it)."""
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)


def device_events(snapshot: Mapping[str, Any], device: int) -> Sequence[Mapping[str, Any]]:
    """Device `device`'s trace events in a `torch.cuda.memory._snapshot()`; none where it has no trace."""
    traces = snapshot.get("device_traces") or []
    events: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    return events


__all__ = ["history_on", "start_history", "stop_history", "device_events"]
