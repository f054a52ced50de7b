"""A real allocator trace (a `torch.cuda.memory._dump_snapshot()` pickle) replayed through the allocator model.

The snapshot's `device_traces` hold every alloc and free PyTorch's caching allocator served, with the segments it
cudaMalloc'd and freed and each out-of-memory it raised. Feeding the same requests to `CachingAllocatorModel`
(with the real segment addresses, which the driver chose, not the allocator) and comparing what each reserves
after every event checks the model's rules apart from anything a traced step adds. It also says where the two
first part: the event, the real and modelled reserved bytes then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cuda.allocator import AllocatorSettings, Block, CachingAllocatorModel, OutOfMemory, parse_alloc_conf
from .file import alloc_conf_of


@dataclass(frozen=True)
class TraceCheck:
    """The real allocator and the model over one trace."""

    events: int  # alloc / free events replayed
    real_peak_reserved: int  # bytes, from the trace's segment_alloc / segment_free events
    model_peak_reserved: int
    real_ooms: tuple[int, ...]  # trace positions of the real out-of-memory errors
    model_ooms: tuple[int, ...]  # positions where the model could not serve the request within the cap
    first_difference: int | None  # first position where reserved differs (None: equal after every event compared)
    compared: bool = True  # False: the trace cannot be compared event by event (see notes); only OOMs count
    real_at_difference: int = 0
    model_at_difference: int = 0
    differing_events: int = 0  # events after which reserved differs
    unmatched_segments: int = 0  # model segments cudaMalloc'd where the trace had none at that point
    final_real_segments: tuple[int, ...] = ()  # segment sizes in the snapshot when it was dumped, sorted
    final_model_segments: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def peak_error(self) -> float:
        """(model − real) / real at the peak reserved."""
        return (self.model_peak_reserved - self.real_peak_reserved) / max(1, self.real_peak_reserved)


def snapshot_settings(snapshot: dict[str, Any]) -> AllocatorSettings:
    """The allocator options the snapshot was recorded with (its PYTORCH_CUDA_ALLOC_CONF)."""
    return parse_alloc_conf(alloc_conf_of(snapshot))


def check_trace(
    snapshot: dict[str, Any], *, device: int = 0, allowed_max: int | None = None, real_addresses: bool = True
) -> TraceCheck:
    """Replay device `device`'s trace through the model and compare reserved bytes event by event.

    `allowed_max`: the byte cap `set_per_process_memory_fraction` set when it was recorded (OOM traces).
    `real_addresses`: give each modelled segment the address the real one got (the driver's choice); False
    lets the model pick its own, as it does when it predicts a step.
    """
    trace: list[dict[str, Any]] = snapshot["device_traces"][device]
    notes: list[str] = []
    pending: list[tuple[int, int]] = []  # segment_alloc events not yet claimed by the model: (size, addr)
    unmatched = 0

    def segment_address(size: int, small: bool) -> int | None:
        nonlocal unmatched
        for i, (sz, addr) in enumerate(pending):
            if sz == size:
                del pending[i]
                return addr
        unmatched += 1
        return None

    model = CachingAllocatorModel(
        snapshot_settings(snapshot), segment_address=segment_address if real_addresses else None
    )
    if allowed_max is not None:
        model.allowed_max = allowed_max
    live: dict[int, Block] = {}
    started_inside = bool(trace) and trace[0]["action"] != "segment_alloc"
    if started_inside:
        notes.append("the recording began after the first allocations: earlier segments are not in the trace")
    expandable = any(e["action"] in ("segment_map", "segment_unmap") for e in trace)
    if expandable:
        notes.append("expandable segments (segment_map/unmap): reserved is not compared event by event")
    compared = not started_inside and not expandable
    real = real_peak = model_peak = 0
    real_ooms: list[int] = []
    model_ooms: list[int] = []
    first: int | None = None
    at_real = at_model = 0
    differing = events = 0
    for pos, e in enumerate(trace):
        action = e["action"]
        if action == "segment_alloc":
            real += int(e["size"])
            pending.append((int(e["size"]), int(e["addr"])))
            continue
        if action == "segment_free":
            real -= int(e["size"])
            # the driver may hand this address out again: an unclaimed entry for it is stale
            pending[:] = [p for p in pending if p[1] != int(e["addr"])]
            continue
        if action == "oom":
            real_ooms.append(pos)
            try:
                # the request that failed: the model must fail it too (and frees cached blocks trying)
                live[-pos] = model.malloc(int(e["size"]))
                model.free(live.pop(-pos))
            except OutOfMemory:
                model_ooms.append(pos)
            continue
        if action == "alloc":
            try:
                live[int(e["addr"])] = model.malloc(int(e["size"]))
            except OutOfMemory:
                model_ooms.append(pos)
                continue
        elif action == "free_completed":
            b = live.pop(int(e["addr"]), None)
            if b is not None:
                model.free(b)
        else:
            continue
        events += 1
        real_peak = max(real_peak, real)
        model_peak = max(model_peak, model.reserved)
        if model.reserved != real and compared:
            differing += 1
            if first is None:
                first, at_real, at_model = pos, real, model.reserved
    real_segments = tuple(sorted(int(s["total_size"]) for s in snapshot["segments"] if s.get("device", 0) == device))
    return TraceCheck(
        events=events,
        real_peak_reserved=real_peak,
        model_peak_reserved=model_peak,
        real_ooms=tuple(real_ooms),
        model_ooms=tuple(model_ooms),
        first_difference=first,
        compared=compared,
        real_at_difference=at_real,
        model_at_difference=at_model,
        differing_events=differing,
        unmatched_segments=unmatched,
        final_real_segments=real_segments,
        final_model_segments=tuple(sorted(model.segment_sizes())),
        notes=tuple(notes),
    )
