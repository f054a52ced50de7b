"""Replaying a trace's allocations and frees through the caching allocator model (engine.cuda.allocator): what
`torch.cuda.memory_reserved()` / `memory_allocated()` would read after every event, and their peaks.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .allocator import AllocatorSettings, Block, CachingAllocatorModel, OutOfMemory, parse_alloc_conf, round_size


class AllocEvent(Protocol):
    """What a replay reads of an event (a MemEvent): which storage, and its bytes (+ allocated, − freed)."""

    @property
    def storage(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class AllocatorReplay:
    """The allocator's state after every event of a trace, and its peaks."""

    reserved: array[int]  # bytes reserved after each event (aligned with trace.events)
    allocated: array[int]  # torch.cuda.memory_allocated() after each event (block sizes)
    requested: array[int]  # live bytes after each event with every request rounded up to 512 bytes
    segments: array[int]  # segments alive after each event
    peak_reserved: int
    peak_reserved_index: int
    peak_allocated: int
    peak_allocated_index: int  # the first event after which allocated is highest: the live peak's instant
    peak_requested: int
    cached_at_peak: int  # reserved - allocated at the reserved peak: free blocks the allocator keeps cached
    max_cached: int  # the largest reserved - allocated over the replay
    segments_at_peak: int
    max_segments: int
    cuda_mallocs: int
    cuda_frees: int
    oom_index: int | None = None  # first event whose allocation could not be served within the capacity
    oom_request_bytes: int = 0
    oom_reserved_bytes: int = 0
    settings: AllocatorSettings = field(default_factory=AllocatorSettings)

    def at(self, index: int) -> int:
        """Reserved bytes after the event at position `index`."""
        return int(self.reserved[index])


def replay(
    events: Iterable[AllocEvent | tuple[int, int]],
    settings: AllocatorSettings | str | None = None,
    *,
    capacity: int | None = None,
    memory_fraction: float | None = None,
    device_total: int | None = None,
    extra_allocations: dict[int, list[int]] | None = None,
) -> AllocatorReplay:
    """Replay MemEvents (or (storage, nbytes) pairs) through the allocator model.

    `capacity`: bytes cudaMalloc can obtain (GPU total minus context); when an allocation cannot be served even
    after freeing cached blocks, the first such event is recorded as `oom_index` and the replay goes on unbounded.
    `extra_allocations`: {position: [nbytes, …]} allocations made just before the event at that position (e.g. library
    workspaces, kept); a negative entry frees an earlier extra allocation of that size (a sharded rank's gathered
    parameters).
    """
    s = settings if isinstance(settings, AllocatorSettings) else parse_alloc_conf(settings)
    m = CachingAllocatorModel(s, capacity=capacity, memory_fraction=memory_fraction, device_total=device_total)
    live: dict[int, Block] = {}
    live_req: dict[int, int] = {}
    reserved, allocated, requested, segments = array("q"), array("q"), array("q"), array("q")
    peak_r = peak_a = peak_q = 0
    peak_r_i = peak_a_i = 0
    cached_at_peak = max_cached = seg_at_peak = max_seg = 0
    oom_i, oom_req, oom_res = None, 0, 0
    req_total = 0
    extra = extra_allocations or {}
    keep = []

    def unbounded(e: OutOfMemory, pos: int) -> None:
        """The first out-of-memory noted; from then on the replay goes on as if memory were unlimited."""
        nonlocal oom_i, oom_req, oom_res
        if oom_i is None:
            oom_i, oom_req, oom_res = pos, e.request, m.reserved
        m.capacity = None
        m.allowed_max = None

    rs = s if any(s.roundup_power2_divisions) else None
    malloc, free = m.malloc_rounded, m.free  # (rounded here, as m.malloc rounds: rs is m's rounding)

    def do_malloc(size: int, pos: int) -> Block:
        """malloc of a rounded request, unbounded from the first out-of-memory on."""
        try:
            return malloc(size)
        except OutOfMemory as e:
            unbounded(e, pos)
            return malloc(size)

    add_reserved, add_allocated, add_requested, add_segments = (reserved.append, allocated.append,
                                                                requested.append, segments.append)
    peak_a_at = 0  # allocated after the event at peak_a_i
    for pos, ev in enumerate(events):
        if isinstance(ev, tuple):
            storage, nbytes = ev
        else:
            storage, nbytes = ev.storage, ev.nbytes
        if extra and pos in extra:  # (elsewhere the peaks below already hold what is live before the event)
            for extra_bytes in extra[pos]:
                if extra_bytes > 0:
                    rq = round_size(extra_bytes, rs)
                    keep.append((extra_bytes, do_malloc(rq, pos)))
                    req_total += rq
                else:  # a free of an earlier extra allocation of that size
                    j = next((j for j, (n, _b) in enumerate(keep) if n == -extra_bytes), None)
                    if j is not None:
                        free(keep.pop(j)[1])
                        req_total -= round_size(-extra_bytes, rs)
            # the extras are live before the event runs (a workspace taken inside a GEMM, then the op after it frees)
            peak_a = max(peak_a, m.allocated)
            peak_q = max(peak_q, req_total)
        if nbytes > 0:
            if storage in live:  # a storage id reused without a free: treat as a new storage
                req_total -= live_req.pop(storage)
                free(live.pop(storage))
            rq = round_size(nbytes, rs)
            try:  # (do_malloc, inline)
                live[storage] = malloc(rq)
            except OutOfMemory as e:
                unbounded(e, pos)
                live[storage] = malloc(rq)
            live_req[storage] = rq
            req_total += rq
        elif nbytes < 0:
            b = live.pop(storage, None)
            if b is not None:
                free(b)
                req_total -= live_req.pop(storage)
        r, a, sg = m.reserved, m.allocated, m.segments
        add_reserved(r)
        add_allocated(a)
        add_requested(req_total)
        add_segments(sg)
        if r > peak_r:
            peak_r, peak_r_i, cached_at_peak, seg_at_peak = r, pos, r - a, sg
        if a > peak_a:
            peak_a = a
        if a > peak_a_at:
            peak_a_i, peak_a_at = pos, a
        if req_total > peak_q:
            peak_q = req_total
        if r - a > max_cached:
            max_cached = r - a
        if sg > max_seg:
            max_seg = sg
    return AllocatorReplay(
        reserved=reserved,
        allocated=allocated,
        requested=requested,
        segments=segments,
        peak_reserved=peak_r,
        peak_reserved_index=peak_r_i,
        peak_allocated=peak_a,
        peak_allocated_index=peak_a_i,
        peak_requested=peak_q,
        cached_at_peak=cached_at_peak,
        max_cached=max_cached,
        segments_at_peak=seg_at_peak,
        max_segments=max_seg,
        cuda_mallocs=m.cuda_mallocs,
        cuda_frees=m.cuda_frees,
        oom_index=oom_i,
        oom_request_bytes=oom_req,
        oom_reserved_bytes=oom_res,
        settings=s,
    )
