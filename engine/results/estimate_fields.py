"""The typed groups an Estimate carries beside its figures: generation's, the ranks' (sharding), the allocator
replay's counts, the CUDA kernels' costing, what a real run measured, a memory snapshot's findings and the error it
was dumped at, a user's own step, and whether the trace folded a repeated stack of blocks.

Each group reads and writes its part of the estimate JSON's "extra" object exactly as the dict it replaces did
(the same keys in the same order), so files written before and after read the same (engine.results.types).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from ..config.train_config import GenerateProgram, KvCache, Strategy, TrainConfig

# Where a trace's events come from: the fake-tensor tracer, a real run on the CPU or a CUDA GPU, a real run's
# memory snapshot; an estimate's can also be the analytic pass.
TraceSource = Literal["tracer", "profiler-cpu", "profiler-cuda", "snapshot"]
Source = Literal[TraceSource, "analytic"]
# How the step was recorded (ModelInfo.method): on fake tensors, for real on the CPU or a GPU, or read from a
# snapshot.
Method = Literal["fake", "real-cpu", "real-cuda", "snapshot"]
# Where a CUDA target's GPU comes from: named (--gpu, or the catalogue default), or found on this machine.
GpuOrigin = Literal["named", "this machine's GPU 0"]
Verdict = Literal["fits", "tight", "does not fit"]


def _plain(v: Any) -> Any:
    """A field's value as the JSON had it: tuples as lists, dicts copied."""
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return dict(v)
    return v


def _flat_json(obj: Any) -> dict[str, Any]:
    """A flat dataclass as a dict in its fields' order (tuples as lists)."""
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


@dataclass(frozen=True)
class GenerationFigures:
    """What a generation run peaks at: over the prefill, and over the decode step of the last token."""

    prompt_len: int
    new_tokens: int
    cache: KvCache
    program: GenerateProgram  # "generate": model.generate(); "loop": the hand-written prefill-then-decode loop
    decoding: str  # generate()'s: "greedy", or "sampling" with its top-k / top-p
    prefill_peak_bytes: int
    decode_peak_bytes: int  # the peak of the last decode step (the largest: the cache only grows)
    kv_cache_bytes: int  # the KV cache's bytes at the end
    decode_steps_traced: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return _flat_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GenerationFigures:
        # an estimate saved before there was a choice of program modelled the loop, greedily
        return cls(prompt_len=d["prompt_len"], new_tokens=d["new_tokens"], cache=d["cache"],
                   program=d.get("program", "loop"), decoding=d.get("decoding", "greedy"),
                   prefill_peak_bytes=d["prefill_peak_bytes"], decode_peak_bytes=d["decode_peak_bytes"],
                   kv_cache_bytes=d["kv_cache_bytes"], decode_steps_traced=tuple(d["decode_steps_traced"]))

    def describe_program(self) -> str:
        """Which generation program the figures modelled, in words."""
        if self.program == "loop":
            return "a hand-written prefill-then-decode loop"
        return f"model.generate(), {self.decoding}"


@dataclass(frozen=True)
class TraceFold:
    """Whether a repeated stack of blocks was traced at a few blocks' depth and written out for all of them
    (engine.trace.folded_trace), or why every block was traced."""

    folded: bool
    stack: str = ""  # the folded ModuleList's or Sequential's path
    blocks: int = 0  # its length
    traced_blocks: int = 0  # how many of them were traced
    reason: str = ""  # not folded: why
    period: int = 1  # folded by units of this many blocks (their pattern repeats: gemma-2's sliding and full layers)

    def to_json(self) -> dict[str, Any]:
        if self.folded:
            out: dict[str, Any] = {"folded": True, "stack": self.stack, "blocks": self.blocks,
                                   "traced_blocks": self.traced_blocks}
            if self.period > 1:  # (said only when it is: older JSON without it reads as period 1)
                out["period"] = self.period
            return out
        return {"folded": False, "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceFold:
        if d.get("folded"):
            return cls(True, str(d.get("stack", "")), int(d.get("blocks", 0)), int(d.get("traced_blocks", 0)),
                       period=int(d.get("period", 1)))
        return cls(False, reason=str(d.get("reason", "")))


@dataclass(frozen=True)
class KernelFigures:
    """What a CUDA target's kernels' scratch was costed from: a calibration profile's measured calls, modelled
    ones, and how far the modelled ones can move the peak."""

    profile: str | None  # the profile's GPU name (None: no profile, every kernel modelled)
    live: bool  # costed by running the kernels on this machine's GPU
    profile_path: str | None
    measured_calls: int
    modelled_calls: int
    largest_measured_bytes: int
    largest_modelled_bytes: int
    up_bytes: int  # the largest gap between a call's figure and its upper bound
    down_bytes: int  # … and its lower bound

    def to_json(self) -> dict[str, Any]:
        return _flat_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelFigures:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class ShardingFigures:
    """One rank's share of a sharded (data- and/or tensor-parallel) step (engine.parallel.sharding)."""

    strategy: Strategy
    world_size: int
    tp: int
    dp: int  # data-parallel degree = world_size / tp
    shard_degree: int  # ranks the sharded states are split over
    sharded: dict[str, bool]  # {"parameters": bool, "gradients": bool, "optimizer_state": bool}
    peak_bytes: int  # per rank
    peak_phase: str
    breakdown_at_peak: dict[str, int]  # category -> bytes per rank (the strategy's buffers folded in)
    model_state_bytes: int  # persistent parameters + gradients + optimizer state per rank
    extras_at_peak: dict[str, int]  # ddp_buckets, gathered_parameters, unsharded_gradients
    unit_parameter_bytes: int  # the largest wrap unit's parameters (ZeRO-3/FSDP all-gather size)
    notes: tuple[str, ...]
    single_gpu_peak_bytes: int  # the whole step's peak on one GPU, before sharding

    def to_json(self) -> dict[str, Any]:
        """The "sharding" object of the JSON (single_gpu_peak_bytes is its sibling there)."""
        d = _flat_json(self)
        del d["single_gpu_peak_bytes"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], single_gpu_peak_bytes: int) -> ShardingFigures:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name != "single_gpu_peak_bytes"}
        return cls(**{**kw, "sharded": dict(kw["sharded"]), "breakdown_at_peak": dict(kw["breakdown_at_peak"]),
                      "extras_at_peak": dict(kw["extras_at_peak"]), "notes": tuple(kw["notes"])},
                   single_gpu_peak_bytes=single_gpu_peak_bytes)


@dataclass(frozen=True)
class ReplayFigures:
    """What the caching-allocator replay of a CUDA target predicts beside the GPU figures (engine.cuda.device_model)."""

    max_memory_allocated: int  # predicted torch.cuda.max_memory_allocated() (per rank when sharded)
    context_measured: bool  # the CUDA context's size was measured on this GPU model, not taken from a table
    cuda_mallocs: int  # cudaMalloc calls the allocator makes

    def to_json(self) -> dict[str, Any]:
        return _flat_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplayFigures:
        return cls(max_memory_allocated=d["max_memory_allocated"], context_measured=d["context_measured"],
                   cuda_mallocs=d["cuda_mallocs"])


@dataclass(frozen=True)
class CudaRun:
    """The device a real CUDA run measured on, and what it saw beside the allocator (engine.measure.cuda_profiler)."""

    nvml_used_bytes: int | None  # nvidia-smi's "used" after the step (None: NVML unavailable)
    context_bytes: int | None  # used - reserved: the CUDA context and libraries
    device_name: str
    device_total_bytes: int
    driver: str | None
    torch: str
    cuda: str | None
    unseen_allocations: int  # allocations in the allocator's history the recorder did not see

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CudaRun:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class MeasuredPeaks:
    """A real run's allocator peaks (a snapshot's, or a CUDA profile's with the device it ran on)."""

    max_memory_allocated: int
    max_memory_reserved: int
    run: CudaRun | None = None  # a CUDA profile's device and NVML figures (None: read from a snapshot)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"max_memory_allocated": self.max_memory_allocated,
                             "max_memory_reserved": self.max_memory_reserved}
        if self.run is not None:
            d.update(_flat_json(self.run))
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MeasuredPeaks:
        run = CudaRun.from_json(d) if "device_name" in d else None
        return cls(max_memory_allocated=d["max_memory_allocated"], max_memory_reserved=d["max_memory_reserved"],
                   run=run)


@dataclass(frozen=True)
class SegmentRow:
    """One of a snapshot's largest segments."""

    address: int
    total_size: int
    active_size: int
    segment_type: str  # "large" | "small" as the allocator names its pools
    stream: int
    blocks: int


@dataclass(frozen=True)
class SegmentSummary:
    """The allocator's segments on the snapshot's device at the dump."""

    count: int
    large: int
    small: int
    reserved_bytes: int
    active_bytes: int
    free_bytes: int  # reserved but not allocated
    largest_free_block: int
    fragmentation: float  # free / reserved
    expandable_segments: bool
    largest: tuple[SegmentRow, ...]  # the largest 50, largest first

    def to_json(self) -> dict[str, Any]:
        d = _flat_json(self)
        d["largest"] = [_flat_json(r) for r in self.largest]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SegmentSummary:
        kw = {f.name: d[f.name] for f in fields(cls)}
        return cls(**{**kw, "largest": tuple(SegmentRow(**r) for r in kw["largest"])})


@dataclass(frozen=True)
class SnapshotFindings:
    """What reading a real run's memory snapshot found beside its timeline (engine.snapshots.reader)."""

    device: int  # the CUDA device whose history was read
    events: int  # entries in its allocator history
    allocations: int
    before_history: int  # blocks allocated before the recorded history began (max_entries reached)
    segments: SegmentSummary
    input_bytes: int  # inputs live when the first forward starts: what --model reads the batch size from
    alloc_conf: str  # the PYTORCH_CUDA_ALLOC_CONF it was recorded with ("" when it does not say)
    implied_config: TrainConfig  # the step's configuration as the snapshot's frames show it
    frames: bool  # it has stack frames (without them categories come from lifetimes alone)
    path: str | None = None  # the file it was read from

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"device": self.device, "events": self.events, "allocations": self.allocations,
                             "before_history": self.before_history, "segments": self.segments.to_json(),
                             "input_bytes": self.input_bytes, "alloc_conf": self.alloc_conf,
                             "implied_config": self.implied_config.to_json(), "frames": self.frames}
        if self.path is not None:
            d["path"] = self.path
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SnapshotFindings:
        return cls(device=d["device"], events=d["events"], allocations=d["allocations"],
                   before_history=d["before_history"], segments=SegmentSummary.from_json(d["segments"]),
                   input_bytes=d["input_bytes"], alloc_conf=d["alloc_conf"],
                   implied_config=TrainConfig.from_json(d["implied_config"]), frames=d["frames"],
                   path=d.get("path"))


@dataclass(frozen=True)
class OomReport:
    """The allocation that failed and the state of the job at that moment."""

    requested_bytes: int
    device_free_bytes: int | None  # what cudaMemGetInfo said was free on the device
    allocated_bytes: int  # live blocks when it failed (torch.cuda.memory_allocated)
    reserved_bytes: int  # segments held by the caching allocator
    step: int
    phase: str
    module: str
    op: str
    stack: tuple[str, ...]  # Python frames, innermost first
    live_by_category: dict[str, int]
    free_in_segments: int  # reserved but not allocated, at the dump
    largest_free_block: int
    events_before: int
    message: str

    def to_json(self) -> dict[str, Any]:
        return _flat_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OomReport:
        kw = {f.name: d[f.name] for f in fields(cls)}
        return cls(**{**kw, "stack": tuple(kw["stack"]), "live_by_category": dict(kw["live_by_category"])})


@dataclass(frozen=True)
class UserStep:
    """A user's own step (vramscope.estimate_step), as far as tracing it could see."""

    function: str  # "train_step (file.py:12)"
    models: tuple[str, ...]  # "model (Sequential)"
    optimizers: tuple[str, ...]  # "opt (AdamW)"
    schedulers: tuple[str, ...]
    training: bool  # a backward ran
    autocast: str | None  # the dtype its torch.autocast ran in ("bfloat16"), None without one

    def to_json(self) -> dict[str, Any]:
        return _flat_json(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UserStep:
        return cls(function=d["function"], models=tuple(d["models"]), optimizers=tuple(d["optimizers"]),
                   schedulers=tuple(d["schedulers"]), training=d["training"], autocast=d["autocast"])
