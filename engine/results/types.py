"""Immutable, JSON-serialisable results: the raw memory trace and the estimate every view renders.

Categories are one fixed vocabulary (DESIGN.md); at every instant of a timeline they add up to the total.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, ClassVar, NamedTuple

from ..config.train_config import Device, TrainConfig
from ..core.units import format_bytes
from .estimate_fields import (
    GenerationFigures,
    GpuOrigin,
    KernelFigures,
    MeasuredPeaks,
    Method,
    OomReport,
    ReplayFigures,
    ShardingFigures,
    SnapshotFindings,
    Source,
    TraceFold,
    TraceSource,
    UserStep,
    Verdict,
)


class Category(str, Enum):
    """What a byte of memory is. A str: it compares, hashes, formats and serialises as its plain name, so dicts
    keyed by it and the JSON stay exactly as with bare strings."""

    PARAMETERS = "parameters"
    ADAPTER_WEIGHTS = "adapter_weights"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    KV_CACHE = "kv_cache"
    TEMPORARIES = "temporaries"
    INPUTS = "inputs"
    ALLOCATOR_OVERHEAD = "allocator_overhead"
    CUDA_CONTEXT = "cuda_context"
    WORKSPACE = "workspace"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


# Categories of live tensor bytes, in the order charts stack them.
CATEGORIES = (
    Category.PARAMETERS,
    Category.ADAPTER_WEIGHTS,  # trained LoRA adapters; with PEFT, PARAMETERS is the frozen (perhaps quantized) base
    Category.BUFFERS,
    Category.GRADIENTS,
    Category.OPTIMIZER_STATE,
    Category.ACTIVATIONS,
    Category.KV_CACHE,
    Category.TEMPORARIES,
    Category.INPUTS,
)
# What a GPU adds on top of live tensor bytes (only for a GPU target).
GPU_CATEGORIES = (Category.ALLOCATOR_OVERHEAD, Category.CUDA_CONTEXT, Category.WORKSPACE)
ALL_CATEGORIES = CATEGORIES + GPU_CATEGORIES

PHASES = ("setup", "forward", "backward", "optimizer", "prefill", "decode")


def category_name(category: str, config: TrainConfig) -> str:
    """A category as the CLI names it: with PEFT, parameters are the frozen base and gradients and optimizer
    state belong to the adapters alone."""
    if config.peft is not None:
        return {"parameters": "base_weights", "adapter_weights": "adapter_weights",
                "gradients": "adapter_gradients", "optimizer_state": "adapter_optimizer_state"}.get(category, category)
    return category


class MemEvent(NamedTuple):
    """One storage allocation (nbytes > 0) or free (nbytes < 0). A named tuple: a deep model's trace holds tens of
    thousands, made in one call each (engine.trace.recorded_step.mem_events), 148 bytes each where a frozen
    dataclass took 364 (its field `index` hides the tuple's index method, which no event needs)."""

    index: int  # type: ignore[assignment]  # (the event's place in its trace, not tuple.index)
    storage: int  # identifier of the storage, unique within a trace
    nbytes: int  # signed: + allocation, - free
    category: Category
    step: int
    phase: str
    module: str  # innermost module path active when the storage was allocated ('' = top level)
    op: str  # the op that allocated it (or freed it, for frees)


@dataclass(frozen=True)
class Trace:
    """Everything the tracer or the profiler saw, in time order. `baseline` storages exist before the step."""

    events: tuple[MemEvent, ...]
    source: TraceSource
    device: Device  # the target


@dataclass(frozen=True)
class TimelinePoint:
    """Live bytes by category right after one event (or after a span of events when downsampled)."""

    index: int
    step: int
    phase: str
    module: str
    op: str
    by_category: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_category.values())


@dataclass(frozen=True)
class PhaseSpan:
    step: int
    phase: str
    start: int  # first event index
    end: int  # last event index (inclusive)


@dataclass(frozen=True)
class ModuleRow:
    """One module's own memory (not its children's). `share_of_peak` is its bytes at the peak / peak."""

    name: str
    type: str
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # bytes it allocated in forward that were alive at the peak
    bytes_at_peak: int
    share_of_peak: float


@dataclass(frozen=True)
class GpuFigures:
    """What a real GPU adds: allocator reserve, CUDA context, library workspaces, and the fit verdict."""

    gpu_name: str | None
    gpu_total_bytes: int | None
    reserved_bytes: int  # predicted torch.cuda.max_memory_reserved(), at the instant reserved_peak_at
    cached_free_bytes: int  # reserved - allocated at the live peak: free blocks the allocator keeps cached for reuse
    cuda_context_bytes: int
    workspace_bytes: int
    nvidia_smi_bytes: int  # predicted "used" in nvidia-smi: the reserved peak plus the context
    segments: int  # segments alive at the reserved peak
    fits: bool | None
    margin_bytes: int | None  # usable memory - nvidia_smi_bytes (negative when it does not fit)
    reserved_timeline: tuple[int, ...] = ()  # reserved bytes aligned with Estimate.timeline
    # What nvidia-smi shows at the live peak, where memory is tightest: the live tensors by category, workspaces,
    # allocator_overhead (reserved then − those: cached free blocks and rounding) and cuda_context. Adds up to
    # reserved_at_live_peak_bytes + cuda_context_bytes.
    breakdown_at_live_peak: dict[str, int] = field(default_factory=dict)
    reserved_at_live_peak_bytes: int = 0
    live_peak_at: str = ""  # the instant of the live peak ("step 2, forward, layers.3.mlp")
    reserved_peak_at: str = ""  # the instant reserved (and so nvidia-smi's figure) peaks
    # Which GPU every figure assumes, and why ("named with --gpu", "this machine's GPU 0", "default: …").
    assumed_gpu: str = ""
    # The honest band: nvidia-smi's figure as a range, and how much of it was measured vs modelled.
    nvidia_smi_low_bytes: int = 0
    nvidia_smi_high_bytes: int = 0
    measured_bytes: int = 0  # traced tensors (exact), kernels and context measured on this GPU model
    modelled_bytes: int = 0  # the allocator's overhead, kernels and context from rules and tables
    verdict: Verdict | None = None  # None: no GPU named
    verdict_reason: str = ""
    at_capacity: bool = False  # the allocator frees its cached blocks and retries to stay within the GPU


@dataclass(frozen=True)
class Estimate:
    model_name: str
    config: TrainConfig
    parameters: int
    trainable_parameters: int
    peak_bytes: int
    peak_index: int
    peak_step: int
    peak_phase: str
    peak_module: str
    peak_op: str
    breakdown_at_peak: dict[str, int]
    per_module: tuple[ModuleRow, ...]
    timeline: tuple[TimelinePoint, ...]
    phases: tuple[PhaseSpan, ...]
    source: Source = "tracer"
    gpu: GpuFigures | None = None
    notes: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    # What the JSON keeps in its "extra" object (EXTRA_FIELDS, in this order). How the step was recorded (None: it
    # was not, the analytic pass), the repeated blocks checkpointing wrapped, the figures that rest on a model of a
    # library rather than a run:
    method: Method | None = None
    checkpointed: tuple[str, ...] = ()
    modelled: tuple[str, ...] = ()
    trace_fold: TraceFold | None = None  # a traced step: whether its repeated blocks were folded, or why not
    generation: GenerationFigures | None = None  # a generation step's prefill and decode figures
    gpu_origin: GpuOrigin | None = None  # a CUDA target: where its GPU came from
    cuda_kernels: KernelFigures | None = None  # a CUDA target: what its kernels' scratch was costed from
    sharding: ShardingFigures | None = None  # several GPUs: one rank's share (the figures above are per rank)
    replay: ReplayFigures | None = None  # a CUDA target: the allocator replay's max_memory_allocated and counts
    measured: MeasuredPeaks | None = None  # a real CUDA run's (or snapshot's) allocator peaks
    snapshot: SnapshotFindings | None = None  # read from a memory snapshot: what the file showed
    oom: OomReport | None = None  # the snapshot was dumped at this out-of-memory error
    step: UserStep | None = None  # a user's own step (vramscope.estimate_step)
    # Jupyter's rich view of an estimate, set by the Python API (vramscope.notebook), which paints its charts with
    # the report's painters: the engine paints nothing itself. None: Jupyter shows the one-line repr.
    html_view: ClassVar[Callable[[Estimate], str] | None] = None

    def __repr__(self) -> str:
        """One line: the model, the peak and when, the step, and on a GPU what nvidia-smi would show and the verdict."""
        c = self.config
        step = f"{c.mode}, batch {c.batch_size}, {c.precision}" + (f", {c.optimizer}" if c.training else "")
        at = f"step {self.peak_step + 1} {self.peak_phase}" if self.peak_phase in PHASES[1:4] else self.peak_phase
        gpu = ""
        if self.gpu is not None:
            g = self.gpu
            smi = f"nvidia-smi {format_bytes(g.nvidia_smi_bytes)}" if g.nvidia_smi_bytes else \
                f"reserved {format_bytes(g.reserved_bytes)}"
            gpu = f"; {g.gpu_name or 'GPU'}: {smi}" + (f", {g.verdict}" if g.verdict else "")
        return f"<Estimate {self.model_name}: peak {format_bytes(self.peak_bytes)} at {at} ({step}, {c.device}){gpu}>"

    def _repr_html_(self) -> str | None:
        view = Estimate.html_view
        return view(self) if view is not None else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for name in EXTRA_FIELDS:
            del d[name]
        d["config"] = self.config.to_json()
        d["timeline"] = [
            {**asdict(p), "total": p.total} for p in self.timeline
        ]
        d["extra"] = self._extra_json()
        return d

    def _extra_json(self) -> dict[str, Any]:
        """The JSON's "extra" object: each group under the keys (and in the order) it has always had."""
        x: dict[str, Any] = {}
        if self.method is not None:
            x["checkpointed"] = list(self.checkpointed)
            x["method"] = self.method
            if self.modelled:
                x["modelled"] = list(self.modelled)
            if self.trace_fold is not None:
                x["trace_fold"] = self.trace_fold.to_json()
        if self.generation is not None:
            x["generation"] = self.generation.to_json()
        if self.gpu_origin is not None:
            x["gpu_origin"] = self.gpu_origin
        if self.cuda_kernels is not None:
            x["cuda_kernels"] = self.cuda_kernels.to_json()
        if self.sharding is not None:
            x["sharding"] = self.sharding.to_json()
            x["single_gpu_peak_bytes"] = self.sharding.single_gpu_peak_bytes
        if self.replay is not None:
            x.update(self.replay.to_json())
        if self.measured is not None:
            x["measured"] = self.measured.to_json()
        if self.snapshot is not None:
            x["snapshot"] = self.snapshot.to_json()
        if self.oom is not None:
            x["oom"] = self.oom.message
            x["oom_detail"] = self.oom.to_json()
        if self.step is not None:
            x["step"] = self.step.to_json()
        return x

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Estimate:
        gpu = d.get("gpu")
        x = d.get("extra") or {}
        return cls(
            model_name=d["model_name"],
            config=TrainConfig.from_json(d["config"]),
            parameters=d["parameters"],
            trainable_parameters=d["trainable_parameters"],
            peak_bytes=d["peak_bytes"],
            peak_index=d["peak_index"],
            peak_step=d["peak_step"],
            peak_phase=d["peak_phase"],
            peak_module=d["peak_module"],
            peak_op=d["peak_op"],
            breakdown_at_peak=dict(d["breakdown_at_peak"]),
            per_module=tuple(ModuleRow(**r) for r in d["per_module"]),
            timeline=tuple(
                TimelinePoint(**{k: v for k, v in p.items() if k != "total"}) for p in d["timeline"]
            ),
            phases=tuple(PhaseSpan(**p) for p in d["phases"]),
            source=d.get("source", "tracer"),
            gpu=_gpu_from_json(gpu) if gpu else None,
            notes=tuple(d.get("notes", ())),
            elapsed_s=d.get("elapsed_s", 0.0),
            # "extra": each group from the keys it has always had (keys it does not know are not carried over)
            method=x.get("method"),
            checkpointed=tuple(x.get("checkpointed", ())),
            modelled=tuple(x.get("modelled", ())),
            trace_fold=TraceFold.from_json(x["trace_fold"]) if x.get("trace_fold") else None,
            generation=GenerationFigures.from_json(x["generation"]) if x.get("generation") else None,
            gpu_origin=x.get("gpu_origin"),
            cuda_kernels=KernelFigures.from_json(x["cuda_kernels"]) if x.get("cuda_kernels") else None,
            sharding=ShardingFigures.from_json(x["sharding"], x["single_gpu_peak_bytes"]) if "sharding" in x else None,
            replay=ReplayFigures.from_json(x) if "max_memory_allocated" in x else None,
            measured=MeasuredPeaks.from_json(x["measured"]) if "measured" in x else None,
            snapshot=SnapshotFindings.from_json(x["snapshot"]) if "snapshot" in x else None,
            oom=OomReport.from_json(x["oom_detail"]) if "oom_detail" in x else None,
            step=UserStep.from_json(x["step"]) if "step" in x else None,
        )


# The fields the JSON keeps in its "extra" object (Estimate._extra_json writes them, Estimate.from_json reads them).
EXTRA_FIELDS = ("method", "checkpointed", "modelled", "trace_fold", "generation", "gpu_origin", "cuda_kernels",
                "sharding", "replay", "measured", "snapshot", "oom", "step")


# Written by versions before the split moved to the live peak: figures of another instant, not carried over.
_OLD_GPU_KEYS = ("fragmentation_bytes", "breakdown_at_smi_peak")


def _gpu_from_json(gpu: dict[str, Any]) -> GpuFigures:
    d = {k: v for k, v in gpu.items() if k not in _OLD_GPU_KEYS}
    d.setdefault("cached_free_bytes", 0)
    return GpuFigures(**{**d, "reserved_timeline": tuple(d.get("reserved_timeline", ())),
                         "breakdown_at_live_peak": dict(d.get("breakdown_at_live_peak", {}))})

