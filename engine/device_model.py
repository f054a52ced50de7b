"""What a real GPU adds to a traced step: the caching allocator's reserve, the CUDA context, library workspaces,
the predicted nvidia-smi "used" figure and, for a catalogue GPU, whether it fits and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .allocator import AllocatorReplay, parse_alloc_conf, replay
from .config import TrainConfig
from .gpus import (
    GpuSpec,
    cuda_context_bytes,
    default_cc,
    find_gpu,
    generation_of,
    workspace_allocations,
)
from .results import CATEGORIES, Estimate, GpuFigures, Trace

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
        import os

        import torch

        if not torch.cuda.is_available():
            return None
        if not torch.cuda.is_initialized() and not init:
            return _measured_context
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        import pynvml

        pynvml.nvmlInit()
        try:
            idx = torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
            used = None
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid() and p.usedGpuMemory:
                    used = int(p.usedGpuMemory)
            if used is None:  # containers often hide PIDs: fall back on the device's used memory
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used = int(info.used)
        finally:
            pynvml.nvmlShutdown()
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


def device_detail(
    trace: Trace,
    est: Estimate,
    cfg: TrainConfig,
    *,
    context_bytes: int | None = None,
    include_workspaces: bool = True,
    compute_capability: tuple[int, int] | None = None,
) -> DeviceDetail:
    """`compute_capability` stands in for a GPU the catalogue does not know (it picks workspaces and context)."""
    notes: list[str] = []
    spec = find_gpu(cfg.gpu) if cfg.gpu else None
    cc = spec.compute_capability if spec else (compute_capability or default_cc())
    generation = spec.generation if spec else generation_of(cc)
    settings = parse_alloc_conf(cfg.alloc_conf)
    if settings.backend == "cudaMallocAsync":
        notes.append("backend:cudaMallocAsync is not modelled; figures are for the native caching allocator")
    if settings.garbage_collection_threshold > 0:
        notes.append(
            "garbage_collection_threshold acts only with torch.cuda.set_per_process_memory_fraction; "
            "modelled without a fraction (no effect)"
        )

    # Context: measured on this machine when its GPU is the target and CUDA is up, else the table.
    measured = False
    if context_bytes is None:
        m = measure_context_bytes()
        if m is not None and (spec is None or _local_gpu_is(spec)):
            context_bytes, measured = m, True
        else:
            context_bytes = cuda_context_bytes(generation, _cuda_version(), cudnn=_uses_cudnn(trace))
    else:
        measured = True

    # cuBLAS/cuBLASLt workspaces come from the caching allocator at the first GEMM of each thread;
    # the tracer (fake tensors) does not see them unless it says so in its breakdown.
    extra: dict[int, list[int]] = {}
    ws_total = 0
    traced_ws = est.breakdown_at_peak.get("workspace", 0)
    if include_workspaces and not traced_ws and trace.events:
        sizes = workspace_allocations(cc, training=cfg.training)
        half = len(sizes) // 2 if cfg.training else len(sizes)
        first_fwd = _first_index(trace, "forward")
        first_bwd = _first_index(trace, "backward")
        if first_fwd is not None:
            extra.setdefault(first_fwd, []).extend(sizes[:half])
            ws_total += sum(sizes[:half])
        if cfg.training and first_bwd is not None:
            extra.setdefault(first_bwd, []).extend(sizes[half:])
            ws_total += sum(sizes[half:])
    else:
        ws_total = traced_ws

    capacity = spec.usable_bytes - context_bytes if spec else None
    rep = replay(trace.events, settings, capacity=capacity, extra_allocations=extra)
    smi = rep.peak_reserved + context_bytes
    if spec is not None:
        usable = spec.usable_bytes
        fits = rep.oom_index is None and smi <= usable
        margin = usable - smi
        if rep.oom_index is not None:
            ev = trace.events[rep.oom_index]
            notes.append(
                f"out of memory on {spec.name} at {ev.phase}/{ev.module or '(model)'} (step {ev.step + 1}, "
                f"event {rep.oom_index}), asking for {rep.oom_request_bytes} bytes with "
                f"{rep.oom_reserved_bytes} reserved; figures continue as if memory were unlimited"
            )
        if not spec.usable_measured:
            notes.append(f"{spec.name}: driver-reserved memory estimated, not measured")
    else:
        fits, margin = None, None
    n = len(rep.reserved)
    timeline = tuple(rep.reserved[min(max(p.index, 0), n - 1)] for p in est.timeline) if n else ()
    figures = GpuFigures(
        gpu_name=spec.name if spec else None,
        gpu_total_bytes=spec.memory_bytes if spec else None,
        reserved_bytes=rep.peak_reserved,
        fragmentation_bytes=rep.fragmentation_at_peak,
        cuda_context_bytes=context_bytes,
        workspace_bytes=ws_total,
        nvidia_smi_bytes=smi,
        segments=rep.segments_at_peak,
        fits=fits,
        margin_bytes=margin,
        reserved_timeline=timeline,
        breakdown_at_smi_peak=smi_breakdown(trace, rep, extra, context_bytes),
    )
    return DeviceDetail(
        figures=figures,
        replay=rep,
        max_memory_allocated=rep.peak_allocated,
        context_measured=measured,
        gpu=spec,
        notes=tuple(notes),
    )


def smi_breakdown(trace: Trace, rep: AllocatorReplay, extra: dict[int, list[int]], context_bytes: int) -> dict:
    """nvidia-smi's predicted figure split by category at the instant the allocator's reserve peaks."""
    if not trace.events:
        return {}
    i = rep.peak_reserved_index
    live: dict[str, int] = {}
    for ev in trace.events[: i + 1]:
        live[ev.category] = live.get(ev.category, 0) + ev.nbytes
    out = {c: live[c] for c in CATEGORIES if live.get(c)}
    workspace = live.get("workspace", 0) + sum(n for pos, sizes in extra.items() if pos <= i for n in sizes)
    if workspace:
        out["workspace"] = workspace
    out["allocator_overhead"] = rep.peak_reserved - sum(out.values())  # rounding, cached free blocks, splits
    out["cuda_context"] = context_bytes
    return out


def _local_gpu_is(spec: GpuSpec) -> bool:
    try:
        import torch

        name = torch.cuda.get_device_name()
        return find_gpu(name).name == spec.name
    except Exception:  # noqa: BLE001 - no GPU, or one the catalogue does not know
        return False


def gpu_figures(trace: Trace, est: Estimate, cfg: TrainConfig) -> GpuFigures:
    """The GPU figures of a traced step (the estimator calls this for a CUDA target)."""
    return device_detail(trace, est, cfg).figures


def with_gpu(trace: Trace, est: Estimate, cfg: TrainConfig) -> Estimate:
    """`est` with its GPU figures, the predicted max_memory_allocated in extra, and the device notes."""
    d = device_detail(trace, est, cfg)
    extra = dict(est.extra)
    extra["max_memory_allocated"] = d.max_memory_allocated
    extra["context_measured"] = d.context_measured
    extra["cuda_mallocs"] = d.replay.cuda_mallocs
    return replace(est, gpu=d.figures, extra=extra, notes=tuple(est.notes) + d.notes)
