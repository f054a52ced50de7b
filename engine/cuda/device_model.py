"""What a real GPU adds to a traced step: the caching allocator's reserve, the CUDA context, library workspaces,
the predicted nvidia-smi "used" figure and, for a catalogue GPU, whether it fits and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config.gpus import (
    GpuSpec,
    architecture_of,
    context_spread_bytes,
    cublas_context_bytes,
    cuda_context_bytes,
    default_cc,
    is_this_machines_gpu,
    workspace_allocations,
)
from ..config.train_config import TrainConfig
from ..core import nvml
from ..core.units import format_bytes
from ..results.estimate_fields import GpuOrigin, ReplayFigures, Verdict
from ..results.instants import instant_label
from ..results.types import CATEGORIES, Estimate, GpuFigures, Trace
from .allocator import parse_alloc_conf
from .allocator_replay import AllocatorReplay, replay
from .gpu_profile import profile_for
from .nvml_used import process_used_bytes

# ops that load cuDNN on a CUDA device (its context grows by the library's kernels)
_CUDNN_OPS = ("conv", "cudnn", "batch_norm", "lstm", "gru", "rnn_")

_measured_context: int | None = None


@dataclass(frozen=True)
class DeviceDetail:
    """Everything the device model worked out; GpuFigures is its summary."""

    figures: GpuFigures
    replay: AllocatorReplay
    max_memory_allocated: int  # predicted torch.cuda.max_memory_allocated() (block sizes, workspaces included)
    context_measured: bool
    gpu: GpuSpec | None
    notes: tuple[str, ...]


def _cuda_version() -> str | None:
    try:
        import torch

        return torch.version.cuda
    except Exception:  # noqa: BLE001 - any torch build without CUDA info
        return None


def measure_context_bytes(*, init: bool = False) -> int | None:
    """This process's GPU memory outside PyTorch's allocator (CUDA context + libraries), measured with NVML.

    Only when CUDA is already initialised (or init=True): creating a context just to measure it would take
    hundreds of MiB of the user's GPU.
    """
    global _measured_context
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        if not torch.cuda.is_initialized() and not init:  # type: ignore[no-untyped-call]  # unannotated in torch
            return _measured_context
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        with nvml.session() as failure:
            handle = nvml.query("nvmlDeviceGetHandleByIndex", torch.cuda.current_device()) if failure is None else None
            used = process_used_bytes(handle) if handle is not None else None
        if used is None:  # no NVML, or it refused the process list: the last figure (or the table) stands
            return _measured_context
        ctx = used - int(torch.cuda.memory_reserved())
        if ctx > 0:
            _measured_context = ctx
        return _measured_context
    except Exception:  # noqa: BLE001 - measurement is best effort; the table is the fall-back
        return _measured_context


def _uses_cudnn(trace: Trace) -> bool:
    seen = set()
    for e in trace.events:
        if e.op in seen:
            continue
        seen.add(e.op)
        low = e.op.lower()
        if any(k in low for k in _CUDNN_OPS):
            return True
    return False


def _first_index(trace: Trace, phase: str) -> int | None:
    for i, e in enumerate(trace.events):
        if e.phase == phase:
            return i
    return None


# aten ops that run on cuBLAS through PyTorch's per-thread handle (at::cuda::getCurrentCUDABlasHandle)
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "addr", "dot", "vdot",
                        "_scaled_mm", "_int_mm", "_addmm_activation"})
# fused ops whose GEMMs run inside them (the trace shows the fused op only): nn.TransformerEncoderLayer's and
# nn.MultiheadAttention's CUDA inference fast paths
FUSED_GEMM_OPS = frozenset({"_transformer_encoder_layer_fwd", "_native_multi_head_attention"})


def _op_base(op: str) -> str:
    return op.split(" ", 1)[0].split(".", 1)[0]


def uses_cublas(trace: Trace, phase: str | None = None) -> bool:
    """Whether the step (or one phase of it) runs a GEMM, loading cuBLAS and making its per-thread handle. A network
    of convolutions only never does: the H200's U-Net step made no cuBLAS workspace (no op of its per-op record
    keeps 32 MiB beyond its outputs) and its context was 128 MiB smaller than any step with GEMMs."""
    return any(e.nbytes > 0 and (phase is None or e.phase == phase)
               and _op_base(e.op) in CUBLAS_OPS | FUSED_GEMM_OPS for e in trace.events)


def first_gemm_position(trace: Trace, phase: str) -> int | None:
    """Where a thread's cuBLAS workspaces are taken from the caching allocator: inside the first GEMM the phase
    runs, after that GEMM's output (the position of the event that follows it). The real H200 trace of GPT-2 AMP
    bf16 (tests/data/gpt2-b4-s512-adamw-ampbf16.pickle.gz) shows both: the forward's at the first attention
    projection's addmm, the autograd thread's inside the LM head's backward mm, after its weight gradient: not at
    the phase's first event, where the blocks then free differ. None when the phase runs no GEMM."""
    events = trace.events
    for i, e in enumerate(events):
        if e.phase == phase and e.nbytes > 0 and _op_base(e.op) in CUBLAS_OPS:
            return min(i + 1, len(events) - 1)
    return None


def _workspace_position(trace: Trace, phase: str) -> int | None:
    """The phase's first GEMM (first_gemm_position); for a fused op with GEMMs inside (the TransformerEncoder's fast
    path: the H200's allocated figure is 33 MiB short without it) its first event; None when the phase runs none."""
    pos = first_gemm_position(trace, phase)
    if pos is None and uses_cublas(trace, phase):
        pos = _first_index(trace, phase)
    return pos


TIGHT_MARGIN = 0.02  # a margin under 2 % of the GPU is "tight": less than the spread seen across real steps


def device_detail(
    trace: Trace,
    est: Estimate,
    cfg: TrainConfig,
    *,
    context_bytes: int | None = None,
    include_workspaces: bool = True,
    compute_capability: tuple[int, int] | None = None,
    rank_extras: dict[int, list[tuple[int, str]]] | None = None,
) -> DeviceDetail:
    """`compute_capability` stands in for a GPU the catalogue does not know (it picks workspaces and context).
    `rank_extras`: a sharded rank's own buffers (engine.parallel.sharding.rank_trace), replayed with its trace."""
    notes: list[str] = []
    spec = cfg.gpu_spec
    cc = spec.compute_capability if spec else (compute_capability or default_cc())
    architecture = spec.architecture if spec else architecture_of(cc)
    profile = profile_for(spec.name) if spec else None
    settings = parse_alloc_conf(cfg.alloc_conf)
    if settings.backend == "cudaMallocAsync":
        notes.append("backend:cudaMallocAsync is not modelled; figures are for the native caching allocator")
    if settings.garbage_collection_threshold > 0:
        notes.append(
            "garbage_collection_threshold acts only with torch.cuda.set_per_process_memory_fraction; "
            "modelled without a fraction (no effect)"
        )

    # Context: measured on this machine when its GPU is the target and CUDA is up, else the GPU's calibration
    # profile, else the table.
    measured = False
    context_source = "measured on this machine"
    if context_bytes is None:
        m = measure_context_bytes()
        if m is not None and (spec is None or is_this_machines_gpu(spec)):
            context_bytes, measured = m, True
        else:
            # the profile's and the table's figures were measured with cuBLAS loaded; a step without a GEMM never
            # loads it
            if profile is not None and profile.context_bytes:
                context_bytes = (profile.context_bytes if cfg.training
                                 else profile.context_inference_bytes or profile.context_bytes)
                context_source = f"measured on an {profile.gpu_name} (CUDA {profile.cuda}; calibration profile)"
                cuda = profile.cuda
            else:
                cuda = _cuda_version()
                context_bytes = cuda_context_bytes(architecture, cuda, cudnn=_uses_cudnn(trace),
                                                   training=cfg.training)
                context_source = f"typical figure for {architecture} (resources/cuda_context.json)"
            no_cublas = 0 if uses_cublas(trace) else cublas_context_bytes(cuda, training=cfg.training)
            if no_cublas:
                context_bytes -= no_cublas
                context_source += f", less cuBLAS's {format_bytes(no_cublas)}: the step runs no GEMM"
    else:
        measured = True
    context_spread = 0 if measured else context_spread_bytes(profile is not None and bool(profile.context_bytes))

    # cuBLAS/cuBLASLt workspaces come from the caching allocator at the first GEMM of each thread;
    # the tracer (fake tensors) does not see them unless it says so in its breakdown.
    extra: dict[int, list[int]] = {}
    ws_total = 0
    traced_ws = est.breakdown_at_peak.get("workspace", 0)
    if include_workspaces and not traced_ws and trace.events:
        if profile is not None and profile.cublas_workspaces:
            per_thread = [[profile.cublas_workspaces[0]], list(profile.cublas_workspaces[1:2])]
        else:
            sizes = workspace_allocations(cc, training=cfg.training)
            half = len(sizes) // 2 if cfg.training else len(sizes)
            per_thread = [sizes[:half], sizes[half:]]
        # at the first GEMM of each thread (a fused kernel whose GEMMs are inside it: at its phase's first event); a
        # phase running no GEMM takes none (the H200's U-Net step: convolutions only, no cuBLAS workspace)
        first_fwd = _workspace_position(trace, "forward")
        if first_fwd is None:  # generation: its first forward is the prefill
            first_fwd = _workspace_position(trace, "prefill")
        first_bwd = _workspace_position(trace, "backward")
        if first_fwd is not None:
            extra.setdefault(first_fwd, []).extend(per_thread[0])
            ws_total += sum(per_thread[0])
        if cfg.training and first_bwd is not None:
            extra.setdefault(first_bwd, []).extend(per_thread[1])
            ws_total += sum(per_thread[1])
    else:
        ws_total = traced_ws

    extras: dict[int, list[tuple[int, str]]] = {pos: [(n, "workspace") for n in v] for pos, v in extra.items()}
    for pos, items in (rank_extras or {}).items():
        extras.setdefault(pos, []).extend(items)
    capacity = spec.usable_bytes - context_bytes if spec else None
    rep = replay(trace.events, settings, capacity=capacity,
                 extra_allocations={pos: [n for n, _c in v] for pos, v in extras.items()})
    smi = rep.peak_reserved + context_bytes
    # nvidia-smi's split where memory is tightest: at the live peak (the first event after which allocated is
    # highest), adding up to the reserve then plus the context
    n = len(rep.reserved)
    live_i = rep.peak_allocated_index
    live_reserved = int(rep.reserved[live_i]) if n else 0
    live_split = smi_breakdown(trace, rep, extras, context_bytes, at=live_i)

    # The band: what was measured (traced tensors are exact; kernels and context measured on this GPU model)
    # and what was modelled, and how far the modelled parts can move the figure.
    kern = est.cuda_kernels
    # The allocator's cache over the allocated peak (max reserved − max allocated) is modelled, not measured: the
    # range lets it be off by its own size (checked on the H200's validation cases: benchmarks/RESULTS.md).
    cache = max(0, rep.peak_reserved - rep.peak_allocated)
    up = (kern.up_bytes if kern is not None else 0) + context_spread + cache
    down = (kern.down_bytes if kern is not None else 0) + context_spread + cache
    # measured + modelled = nvidia-smi's figure, read at the live peak: the tensors live then are traced (exact);
    # the reserve's cache then, and its growth up to its own peak, are the allocator model's
    tensors = sum(v for k, v in live_split.items() if k in CATEGORIES)
    kernel_scratch = _scratch_live(trace, live_i)
    measured_part = tensors - kernel_scratch
    kernel_part = kernel_scratch + live_split.get("workspace", 0)
    modelled_part = live_split.get("allocator_overhead", 0) + rep.peak_reserved - live_reserved
    profiled = kern is not None and bool(kern.profile) and not kern.modelled_calls
    if profiled:
        measured_part += kernel_part
    else:
        modelled_part += kernel_part
    if measured or (profile is not None and profile.context_bytes):
        measured_part += context_bytes
    else:
        modelled_part += context_bytes

    verdict, reason, at_capacity = None, "", False
    if spec is not None:
        usable = spec.usable_bytes
        margin = usable - smi
        at_capacity = rep.oom_index is None and rep.cuda_frees > 0 and not settings.max_split_set
        oom_at = None
        if rep.oom_index is not None:
            ev = trace.events[rep.oom_index]
            oom_at = f"{ev.phase}/{ev.module or '(model)'}"
            notes.append(
                f"out of memory on {spec.name} at {oom_at} (step {ev.step + 1}, "
                f"event {rep.oom_index}), asking for {rep.oom_request_bytes} bytes with "
                f"{rep.oom_reserved_bytes} reserved; figures continue as if memory were unlimited"
            )
        verdict, reason = fit_verdict(
            gpu_name=spec.name, usable=usable, smi=smi, high=smi + up, live=rep.peak_allocated,
            context=context_bytes, oom_at=oom_at, at_capacity=at_capacity,
        )
        fits = verdict != "does not fit"
        if not spec.usable_measured:
            notes.append(f"{spec.name}: driver-reserved memory estimated, not measured")
    else:
        fits, margin = None, None
    timeline = tuple(rep.reserved[min(max(p.index, 0), n - 1)] for p in est.timeline) if n else ()
    figures = GpuFigures(
        gpu_name=spec.name if spec else None,
        gpu_total_bytes=spec.memory_bytes if spec else None,
        reserved_bytes=rep.peak_reserved,
        cached_free_bytes=live_reserved - int(rep.allocated[live_i]) if n else 0,
        cuda_context_bytes=context_bytes,
        workspace_bytes=ws_total,
        nvidia_smi_bytes=smi,
        segments=rep.segments_at_peak,
        fits=fits,
        margin_bytes=margin,
        reserved_timeline=timeline,
        breakdown_at_live_peak=live_split,
        reserved_at_live_peak_bytes=live_reserved,
        live_peak_at=instant_label(trace.events, live_i),
        reserved_peak_at=instant_label(trace.events, rep.peak_reserved_index),
        assumed_gpu=_assumed(spec, est.gpu_origin or "named", cc),
        nvidia_smi_low_bytes=max(0, smi - down),
        nvidia_smi_high_bytes=smi + up,
        measured_bytes=measured_part,
        modelled_bytes=modelled_part,
        verdict=verdict,
        verdict_reason=reason,
        at_capacity=at_capacity,
    )
    notes.append(f"CUDA context {_gib(context_bytes)}: {context_source}")
    return DeviceDetail(
        figures=figures,
        replay=rep,
        max_memory_allocated=rep.peak_allocated,
        context_measured=measured,
        gpu=spec,
        notes=tuple(notes),
    )


def fit_verdict(*, gpu_name: str, usable: int, smi: int, high: int, live: int, context: int,
                oom_at: str | None = None, at_capacity: bool = False) -> tuple[Verdict, str]:
    """"fits" | "tight" | "does not fit", and why, for a step on a GPU a process can use `usable` bytes of.

    `live`: the peak of live tensor bytes (max_memory_allocated), `smi`/`high`: nvidia-smi's figure and the upper end
    of its range, `oom_at`: where the modelled allocator ran out within the GPU. Live tensors that, with the CUDA
    context, exceed what a process can use never fit, whatever the allocator does; a step whose live tensors fit but
    whose allocator runs out is tight (fragmentation decides), never "fits"."""
    need = live + context
    if need > usable:
        return "does not fit", (f"its live tensors peak at {_gib(live)}: with the {_gib(context)} CUDA context "
                                f"{_gib(need)}, over the {_gib(usable)} a process can use on the {gpu_name}")
    if oom_at is not None:
        return "tight", (f"the live tensors fit ({_gib(live)}, {_gib(need)} with the CUDA context, of "
                         f"{_gib(usable)}), but the modelled allocator runs out at {oom_at} even after freeing its "
                         "cache: whether it runs depends on fragmentation")
    if smi > usable:
        return "does not fit", f"nvidia-smi's figure {_gib(smi)} is over the {_gib(usable)} a process can use"
    if at_capacity:
        return "tight", "the allocator will run at capacity: it frees its cached blocks and retries instead of failing"
    if high > usable:
        return "tight", f"fits by the figure, not by the upper end of its range ({_gib(high)})"
    margin = usable - smi
    if margin < TIGHT_MARGIN * usable:
        return "tight", f"a margin of {_gib(margin)} is under {TIGHT_MARGIN:.0%} of the GPU"
    return "fits", (f"{_gib(usable - high)} to spare at the upper end of the range" if high > smi
                    else f"{_gib(margin)} to spare")


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def _scratch_live(trace: Trace, index: int) -> int:
    """Kernel scratch alive right after event `index` (a workspace allocated and not yet freed)."""
    if not trace.events:
        return 0
    e = trace.events[index]
    return e.nbytes if e.nbytes > 0 and e.op.endswith("(kernel scratch)") else 0


def _assumed(spec: GpuSpec | None, origin: GpuOrigin, cc: tuple[int, int]) -> str:
    """Which GPU the figures assume, and why."""
    if spec is None:
        return (f"no GPU named and none on this machine: kernels of compute capability {cc[0]}.{cc[1]} "
                "(an A100's), no fit verdict")
    return spec.name if origin == "named" else f"{spec.name} ({origin})"


def smi_breakdown(trace: Trace, rep: AllocatorReplay, extras: dict[int, list[tuple[int, str]]],
                  context_bytes: int, *, at: int) -> dict[str, int]:
    """What nvidia-smi shows split by category right after event `at` (the live peak's); adds up to the reserve
    then plus the context.

    `extras`: allocations outside the trace {position: [(±nbytes, category), …]} (workspaces, a rank's buffers)."""
    if not trace.events:
        return {}
    i = at
    live: dict[str, int] = {}
    for ev in trace.events[: i + 1]:
        live[ev.category] = live.get(ev.category, 0) + ev.nbytes
    for pos, items in extras.items():
        if pos <= i:
            for n, cat in items:
                live[cat] = live.get(cat, 0) + n
    out: dict[str, int] = {c: live[c] for c in CATEGORIES if live.get(c)}
    if live.get("workspace"):
        out["workspace"] = live["workspace"]
    out["allocator_overhead"] = int(rep.reserved[i]) - sum(out.values())  # rounding, cached free blocks, splits
    out["cuda_context"] = context_bytes
    return out


def gpu_figures(trace: Trace, est: Estimate, cfg: TrainConfig) -> GpuFigures:
    """The GPU figures of a traced step (the estimator calls this for a CUDA target)."""
    return device_detail(trace, est, cfg).figures


def with_gpu(trace: Trace, est: Estimate, cfg: TrainConfig,
             rank_extras: dict[int, list[tuple[int, str]]] | None = None) -> Estimate:
    """`est` with its GPU figures, the replay's predicted max_memory_allocated and counts, and the device notes."""
    d = device_detail(trace, est, cfg, rank_extras=rank_extras)
    replay = ReplayFigures(max_memory_allocated=d.max_memory_allocated, context_measured=d.context_measured,
                           cuda_mallocs=d.replay.cuda_mallocs)
    return replace(est, gpu=d.figures, replay=replay, notes=tuple(est.notes) + d.notes)
