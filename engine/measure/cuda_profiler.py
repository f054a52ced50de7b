"""Real measurement on this machine's NVIDIA GPU: the same step, run for real with PyTorch's allocator history.

Every allocation the CUDA caching allocator reports (library workspaces included) comes from
torch.cuda.memory._record_memory_history; the tracker running alongside names each tensor's category, and
allocations it did not see become temporaries. Also measured: max_memory_allocated / max_memory_reserved and
the NVML "used" figure. The result is an Estimate of the same shape as the estimator's (source "profiler-cuda").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..core.progress import CancelToken, Progress
from ..core.tensor_tree import map_tensors
from ..cuda.alloc_history import device_events, start_history, stop_history
from ..cuda.nvml_used import nvml_used_bytes
from ..models.source import ModelSource
from ..results.estimate_fields import CudaRun, MeasuredPeaks
from ..results.instants import instant_label, live_peak_index
from ..results.types import Category, Estimate, GpuFigures, Trace
from ..trace.recorded_step import build_real, categorize, mem_events, record_step
from ..trace.recorder import PtrRecorder, RawEvent
from ..trace.summary import summarise

_UNSEEN = 1 << 40  # storage keys of allocations the tracker did not see


def merge_device_trace(rec_events: Sequence[RawEvent], alloc_index: Mapping[int, int], nbytes: Mapping[int, int],
                       ptr_of: Mapping[int, int], device_trace: Iterable[Mapping[str, Any]], roles: Mapping[int, str],
                       cfg: TrainConfig, reserved0: int = 0) -> tuple[Trace, list[int]]:
    """The allocator's events in its order, named by the tracker where it saw the same address and size.

    rec_events: the tracker's raw (key, n, step, phase, module, op); device_trace: the allocator's history
    entries ({"action", "addr", "size"}) recorded over the same steps. Returns (Trace, reserved after each event).
    """
    pending: dict[tuple[int, int], list[int]] = {}
    for key, i in sorted(alloc_index.items(), key=lambda kv: kv[1]):
        if rec_events[i].phase != "setup":
            pending.setdefault((ptr_of.get(key, 0), nbytes[key]), []).append(key)
    raw = [ev for ev in rec_events if ev.phase == "setup" and ev.nbytes > 0]
    reserved = [reserved0] * len(raw)
    live_at: dict[int, tuple[int, int]] = {}
    next_key = _UNSEEN
    ctx = RawEvent(0, 0, 0, "setup", "", "")  # the event allocations inside an op are attributed to
    res = reserved0
    for e in device_trace:
        action, addr, size = e.get("action"), int(e.get("addr", 0)), int(e.get("size", 0))
        if action in ("segment_alloc", "segment_map"):
            res += size
        elif action in ("segment_free", "segment_unmap"):
            res -= size
        elif action == "alloc":
            keys = pending.get((addr, size))
            if keys:
                key = keys.pop(0)
                ctx = rec_events[alloc_index[key]]
                raw.append(ctx._replace(storage=key, nbytes=size))
            else:
                key = next_key
                next_key += 1
                raw.append(ctx._replace(storage=key, nbytes=size, op=f"{ctx.op} (allocated inside the op)"))
            live_at[addr] = (key, size)
            reserved.append(res)
        elif action == "free_requested":
            entry = live_at.pop(addr, None)
            if entry is not None:
                raw.append(ctx._replace(storage=entry[0], nbytes=-entry[1]))
                reserved.append(res)
    cats = categorize(raw, dict(roles), cfg.training)
    for key in cats:
        if key >= _UNSEEN:
            cats[key] = Category.TEMPORARIES
    return Trace(events=mem_events(raw, cats.__getitem__), source="profiler-cuda", device="cuda"), reserved


def profile_cuda(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                 progress: Progress | None = None) -> Estimate:
    """Runs cfg's steps for real on this machine's current CUDA device and measures them."""
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU on this machine; profile with --device cpu")
    if cfg.compile:  # its step runs the eager model: it would measure another program than the one asked for
        raise UserError("a compiled step is measured on the CPU (profile --compile --device cpu); on a GPU it "
                        "is not measured yet")
    t0 = time.perf_counter()
    if progress:
        progress(0.05, "building the model")
    device = torch.device("cuda", torch.cuda.current_device())
    model, inputs, info = build_real(source, cfg)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    rec = PtrRecorder(cancel=cancel)
    if progress:
        progress(0.2, f"running the step on {torch.cuda.get_device_name(device)}")
    snapshot = None
    try:
        model.to(device)
        inputs = map_tensors(inputs, lambda t: t.to(device))
        torch.cuda.synchronize(device)
        reserved0 = torch.cuda.memory_reserved(device)
        start_history(2_000_000)
        try:
            # AMP: run_steps autocasts the forward on the model's device (CUDA here), not the backward
            record_step(model, inputs, cfg, rec, info, nullcontext())
            torch.cuda.synchronize(device)
        finally:
            snapshot = torch.cuda.memory._snapshot()
            stop_history()
    except torch.cuda.OutOfMemoryError:
        peak = torch.cuda.max_memory_allocated(device)
        del model, inputs
        torch.cuda.empty_cache()
        raise UserError(
            f"out of memory at {rec.phase}/{rec.module or '(model)'} (step {rec.step + 1}, op {rec.op}) "
            f"after {peak:,} bytes allocated; try a smaller batch, --checkpointing or a lower precision"
        ) from None
    max_alloc = torch.cuda.max_memory_allocated(device)
    max_res = torch.cuda.max_memory_reserved(device)
    stats = torch.cuda.memory_stats(device)
    used, driver = nvml_used_bytes(device.index or 0)
    total = torch.cuda.mem_get_info(device)[1]
    context = used - torch.cuda.memory_reserved(device) if used is not None else None

    if progress:
        progress(0.8, "reading the allocator's history")
    dev_trace = device_events(snapshot or {}, device.index or 0)
    trace, reserved = merge_device_trace(
        rec.events, rec.alloc_index, rec.nbytes, rec.ptr_of, dev_trace, info.storage_roles, cfg, reserved0
    )
    info.method = "real-cuda"
    est = summarise(trace, info, cfg, elapsed_s=time.perf_counter() - t0)
    n = len(reserved)
    timeline = tuple(reserved[min(p.index, n - 1)] for p in est.timeline) if n else ()
    live_i = live_peak_index(trace.events)
    live = sum(e.nbytes for e in trace.events[: live_i + 1])
    live_reserved = reserved[min(live_i, n - 1)] if n else max_res
    spec = cfg.gpu_spec
    limit = spec.usable_bytes if spec else total
    smi = used if used is not None else max_res
    gpu = GpuFigures(
        gpu_name=spec.name if spec else torch.cuda.get_device_name(device),
        gpu_total_bytes=spec.memory_bytes if spec else total,
        reserved_bytes=max_res,
        cached_free_bytes=max(0, live_reserved - live),
        cuda_context_bytes=context or 0,
        workspace_bytes=0,
        nvidia_smi_bytes=smi,
        segments=int(stats.get("segment.all.peak", 0)),
        fits=smi <= limit,
        margin_bytes=limit - smi,
        reserved_timeline=timeline,
        reserved_at_live_peak_bytes=live_reserved,
        live_peak_at=instant_label(trace.events, live_i),
    )
    run = CudaRun(
        nvml_used_bytes=used,
        context_bytes=context,
        device_name=torch.cuda.get_device_name(device),
        device_total_bytes=total,
        driver=driver,
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        unseen_allocations=sum(1 for e in trace.events if e.storage >= _UNSEEN and e.nbytes > 0),
    )
    measured = MeasuredPeaks(max_memory_allocated=max_alloc, max_memory_reserved=max_res, run=run)
    del model, inputs
    torch.cuda.empty_cache()
    if progress:
        progress(1.0, "done")
    return replace(est, gpu=gpu, measured=measured, source="profiler-cuda")
