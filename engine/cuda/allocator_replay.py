"""Replaying a trace's allocations and frees through the caching allocator model (engine.cuda.allocator): what
`torch.cuda.memory_reserved()` / `memory_allocated()` would read after every event, and their peaks.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import sub
from typing import NamedTuple, Protocol

from .allocator import AllocatorSettings, Block, CachingAllocatorModel, OutOfMemory, parse_alloc_conf, round_size


class AllocEvent(Protocol):
    """What a replay reads of an event (a MemEvent): which storage, and its bytes (+ allocated, − freed)."""

    @property
    def storage(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class AllocPair(NamedTuple):
    """An allocation (nbytes > 0) or free (nbytes < 0) of a storage, without the rest of a MemEvent."""

    storage: int
    nbytes: int


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
    events: Iterable[AllocEvent],
    settings: AllocatorSettings | str | None = None,
    *,
    capacity: int | None = None,
    memory_fraction: float | None = None,
    device_total: int | None = None,
    extra_allocations: dict[int, list[int]] | None = None,
) -> AllocatorReplay:
    """Replay MemEvents (or AllocPairs) through the allocator model.

    `capacity`: bytes cudaMalloc can obtain (GPU total minus context); when an allocation cannot be served even
    after freeing cached blocks, the first such event is recorded as `oom_index` and the replay goes on unbounded.
    `extra_allocations`: {position: [nbytes, …]} allocations made just before the event at that position (e.g. library
    workspaces, kept); a negative entry frees an earlier extra allocation of that size (a sharded rank's gathered
    parameters).
    """
    s = settings if isinstance(settings, AllocatorSettings) else parse_alloc_conf(settings)
    m = CachingAllocatorModel(s, capacity=capacity, memory_fraction=memory_fraction, device_total=device_total)
    live: dict[int, tuple[Block, int]] = {}  # storage -> its block and its rounded request
    reserved, allocated, requested, segments = array("q"), array("q"), array("q"), array("q")
    oom_i, oom_req, oom_res = None, 0, 0
    req_total = 0
    extra = extra_allocations or {}
    keep = []
    extra_peak_a = extra_peak_q = 0  # what is live before an event with extras (its extras allocated)

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
    pop_live = live.pop
    for pos, ev in enumerate(events):
        storage, nbytes = ev.storage, ev.nbytes
        if extra and pos in extra:  # (elsewhere the peaks read from the arrays already hold what is live before)
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
            extra_peak_a = max(extra_peak_a, m.allocated)
            extra_peak_q = max(extra_peak_q, req_total)
        if nbytes > 0:
            if storage in live:  # a storage id reused without a free: treat as a new storage
                blk, rq = pop_live(storage)
                req_total -= rq
                free(blk)
            rq = round_size(nbytes, rs)
            try:  # (do_malloc, inline)
                live[storage] = (malloc(rq), rq)
            except OutOfMemory as e:
                unbounded(e, pos)
                live[storage] = (malloc(rq), rq)
            req_total += rq
        elif nbytes < 0:
            got = pop_live(storage, None)
            if got is not None:
                free(got[0])
                req_total -= got[1]
        add_reserved(m.reserved)
        add_allocated(m.allocated)
        add_requested(req_total)
        add_segments(m.segments)
    # the peaks, each at its first event (as a running maximum finds them)
    peak_r = max(reserved, default=0)
    peak_r_i = reserved.index(peak_r) if peak_r else 0
    peak_a_at = max(allocated, default=0)
    peak_a_i = allocated.index(peak_a_at) if peak_a_at else 0
    cached_at_peak = peak_r - allocated[peak_r_i] if peak_r else 0
    seg_at_peak = segments[peak_r_i] if peak_r else 0
    return AllocatorReplay(
        reserved=reserved,
        allocated=allocated,
        requested=requested,
        segments=segments,
        peak_reserved=peak_r,
        peak_reserved_index=peak_r_i,
        peak_allocated=max(peak_a_at, extra_peak_a),
        peak_allocated_index=peak_a_i,
        peak_requested=max(max(requested, default=0), extra_peak_q),
        cached_at_peak=cached_at_peak,
        max_cached=max(0, max(map(sub, reserved, allocated), default=0)),
        segments_at_peak=seg_at_peak,
        max_segments=max(segments, default=0),
        cuda_mallocs=m.cuda_mallocs,
        cuda_frees=m.cuda_frees,
        oom_index=oom_i,
        oom_request_bytes=oom_req,
        oom_reserved_bytes=oom_res,
        settings=s,
    )
