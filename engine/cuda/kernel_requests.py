"""The requests each kernel call made of the CUDA caching allocator, in order, read from the allocator's own trace.

A cuDNN kernel does not take its scratch as one block: a convolution backward asks for grad_input, a workspace,
frees it, asks for grad_weight, another workspace, frees it. The caching allocator's reserved memory depends on
those exact sizes and that order, so calibration keeps them (`KernelRecord.requests`, encoded with
`engine.cuda.gpu_profile.OUTPUT` for each allocation the call returned and the bytes of each one it freed before
returning).

How they are found, exactly and cheaply: while the steps run, the allocator records its event trace
(`torch.cuda.memory._record_memory_history`, no stacks); around each kernel op the op recorder reads the allocator's
cumulative counters `allocation.all.allocated` and `allocation.all.freed` (an `OpSpan`). Every `alloc` event of the
trace is one step of the first counter and every `free_requested` event one step of the second, so, counting back
from the counters' values when the trace is taken, each op's span picks out exactly its own events. A trace that
lost the events of an op (recording began later, or the ring buffer of `max_entries` overwrote them) leaves that op
unpaired (None): it is never paired with another op's events.

`requests_from_trace` and `attach_requests` are pure (plain dicts in, plain tuples out) and tested against real
H200 traces; `TraceRecording` and `counters` are the thin torch side, used by `engine.measure.calibrate` and by
benchmarks/gpu/record_ops.py on a CUDA machine.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .alloc_history import device_events, history_on, start_history, stop_history
from .gpu_profile import OUTPUT

TRACE_MAX_ENTRIES = 4_000_000  # trace events kept (no stacks: about a hundred bytes each)


@dataclass(frozen=True)
class OpSpan:
    """One op call in the allocator's cumulative counters: its allocations are numbers [alloc_start, alloc_end) of
    `allocation.all.allocated`, its frees numbers [free_start, free_end) of `allocation.all.freed`."""

    alloc_start: int
    alloc_end: int
    free_start: int
    free_end: int


@dataclass(frozen=True)
class RecordedTrace:
    """One device's trace events and the two counters read when it was taken (nothing allocated in between)."""

    events: Sequence[Mapping[str, Any]]
    allocated: int
    freed: int


def requests_from_trace(
    events: Sequence[Mapping[str, Any]], spans: Sequence[OpSpan], allocated: int, freed: int,
) -> list[tuple[int, ...] | None]:
    """Each span's requests in the order they were made: OUTPUT for an allocation still live when the op ended,
    the requested bytes (the trace event's `size`) of one freed inside it. None for a span the trace cannot pair:
    some of its events are not in the trace, or the events in its place are not its own alone."""
    alloc_pos = [i for i, e in enumerate(events) if e.get("action") == "alloc"]
    free_pos = [i for i, e in enumerate(events) if e.get("action") == "free_requested"]
    if len(alloc_pos) > allocated or len(free_pos) > freed:  # the counters do not describe this trace
        return [None for _ in spans]
    a_base, f_base = allocated - len(alloc_pos), freed - len(free_pos)  # counter values of the first events kept
    return [_pair(events, alloc_pos, free_pos, s, a_base, f_base) for s in spans]


def _pair(
    events: Sequence[Mapping[str, Any]], alloc_pos: list[int], free_pos: list[int], s: OpSpan, a_base: int,
    f_base: int,
) -> tuple[int, ...] | None:
    a0, a1, f0, f1 = s.alloc_start - a_base, s.alloc_end - a_base, s.free_start - f_base, s.free_end - f_base
    if a0 < 0 or f0 < 0 or a1 < a0 or f1 < f0 or a1 > len(alloc_pos) or f1 > len(free_pos):
        return None  # events lost before the trace's first one (or counters read after the trace was taken)
    mine = alloc_pos[a0:a1] + free_pos[f0:f1]
    if not mine:
        return ()
    lo, hi = min(mine), max(mine)
    # between its first and last event, the op's own events alone: no other alloc or free can hide in its place
    if bisect.bisect_right(alloc_pos, hi) - bisect.bisect_left(alloc_pos, lo) != a1 - a0 \
            or bisect.bisect_right(free_pos, hi) - bisect.bisect_left(free_pos, lo) != f1 - f0:
        return None
    frees = [(p, events[p].get("addr")) for p in free_pos[f0:f1]]
    used: set[int] = set()
    out: list[int] = []
    mine_allocs = alloc_pos[a0:a1]
    for p in mine_allocs:
        e = events[p]
        hit = next((q for q, addr in frees if q > p and q not in used and addr == e.get("addr")), None)
        if hit is None:
            out.append(OUTPUT)
        else:
            used.add(hit)
            size = int(e.get("size", 0))
            if size <= 0:
                return None  # a scratch request of no bytes cannot be encoded apart from an output
            if any(p < q < hit for q in mine_allocs):
                # still held when a later request came (cuDNN RNN's workspace across its reserve): the encoding
                # frees each scratch before the next request, so it cannot say this; the op's peak stands instead
                return None
            out.append(size)
    return tuple(out)


def attach_requests(rows: list[dict[str, Any]], spans: Sequence[tuple[int, OpSpan]],
                    trace: RecordedTrace | None) -> int:
    """Give each op row `rows[i]` of `spans` its `"requests"` list from `trace`; how many rows got one."""
    if trace is None or not spans:
        return 0
    found = requests_from_trace(trace.events, [s for _, s in spans], trace.allocated, trace.freed)
    n = 0
    for (i, _), req in zip(spans, found, strict=True):
        if req:
            rows[i]["requests"] = list(req)
            n += 1
    return n


# ------------------------------------------------------------------------------------------------ torch side


def counters(device: int) -> tuple[int, int]:
    """The caching allocator's cumulative allocations and frees on `device` so far."""
    import torch

    st = torch.cuda.memory_stats(device)
    return int(st.get("allocation.all.allocated", 0)), int(st.get("allocation.all.freed", 0))


class TraceRecording:
    """Records the allocator's trace on `device` while the block runs, unless a recording is already on (then it
    is left as it is and read). `taken()` gives the trace and counters at that moment; None where this PyTorch
    cannot record (calibration then keeps each kernel's peak alone). On leaving, a recording this started stops."""

    def __init__(self, device: int, max_entries: int = TRACE_MAX_ENTRIES) -> None:
        self.device, self.max_entries = device, max_entries
        self.available = False
        self._started = False

    def __enter__(self) -> TraceRecording:
        try:
            if history_on():
                self.available = True  # someone records already: read theirs, change nothing
                return self
            start_history(self.max_entries, stacks="python", context=None)
            self.available = self._started = True
        except (AttributeError, TypeError, RuntimeError):
            self.available = False  # an old PyTorch, or a build without the CUDA allocator's history
        return self

    def taken(self) -> RecordedTrace | None:
        if not self.available:
            return None
        import torch

        try:
            torch.cuda.synchronize(self.device)
            allocated, freed = counters(self.device)
            events = device_events(torch.cuda.memory._snapshot(self.device), self.device)
        except (AttributeError, TypeError, RuntimeError):
            return None
        return RecordedTrace(events=events, allocated=allocated, freed=freed)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._started:
            self._started = False
            stop_history()


__all__ = ["OpSpan", "RecordedTrace", "requests_from_trace", "attach_requests", "counters", "TraceRecording",
           "TRACE_MAX_ENTRIES"]
