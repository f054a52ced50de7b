"""Real measurement on this machine's CPU: the same step, run for real under PyTorch's profiler.

Every allocation the CPU allocator reports (kernel workspaces included) is taken from the profiler; the
tracker running alongside names each tensor's category, and the profiler's allocations it did not see
(scratch space inside kernels) are temporaries. The result is a Trace of the same type as the tracer's.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
from torch.profiler import ProfilerActivity, profile as torch_profile
from torch.profiler._memory_profiler import _EventType

from .checkpointing import apply_checkpointing
from .config import TrainConfig
from .cpu_kernels import quiet_profiler
from .errors import UserError
from .results import Estimate, MemEvent, Trace
from .step import DTYPES, cast_inputs
from .summary import summarise
from .tracer import _model_info, _record, categorize
from .tracker import StorageRecorder


def _allocations(prof) -> list[tuple[int, int, int, str]]:
    """(time_ns, ptr, signed bytes, innermost op) of every CPU allocator event, in time order."""
    out = []
    stack = [(ev, "") for ev in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        ev, op = stack.pop()
        if ev.typed[0] == _EventType.TorchOp:
            op = ev.name
        stack.extend((c, op) for c in ev.children)
        if ev.typed[0] == _EventType.Allocation:
            f = ev.typed[1]
            if f.device.type == "cpu":
                out.append((ev.start_time_ns, f.ptr, f.alloc_size, op))
    out.sort(key=lambda x: x[0])
    return out


class _PtrRecorder(StorageRecorder):
    """Also remembers each tracked storage's address, to match the profiler's allocations."""

    def __init__(self, cancel=None):
        super().__init__(cancel)
        self.ptr_of: dict[int, int] = {}

    def track(self, t, op=None, nbytes=None):
        before = self._next_key
        key = super().track(t, op, nbytes)
        if key == before:  # new storage
            self.ptr_of[key] = t.untyped_storage().data_ptr()
        return key


def measure_cpu(source, cfg: TrainConfig, *, cancel=None) -> tuple[Trace, object, int]:
    """Runs cfg's steps for real on the CPU. Returns (trace, model info, profiler-only peak bytes)."""
    if isinstance(source, str):
        from .sources import resolve_source

        source = resolve_source(source)
    model, inputs = source.build(cfg)
    info = _model_info(source.name, model)
    if cfg.checkpointing and cfg.training:
        info.checkpointed = apply_checkpointing(model)
    if cfg.precision in ("fp16", "bf16"):
        model.to(DTYPES[cfg.precision])
        inputs = cast_inputs(inputs, DTYPES[cfg.precision])
    rec = _PtrRecorder(cancel=cancel)
    with quiet_profiler(), torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _record(model, inputs, cfg, rec, info, nullcontext())
    allocs = _allocations(prof)
    baseline = sum(rec.nbytes[k] for k, i in rec.alloc_index.items() if rec.events[i][3] == "setup")
    cur = peak = 0
    for _t, _p, n, _op in allocs:
        cur += n
        peak = max(peak, cur)
    info.method = "real-cpu"
    return _merge(rec, info, cfg, allocs), info, baseline + peak


def _merge(rec: _PtrRecorder, info, cfg: TrainConfig, allocs) -> Trace:
    """The profiler's allocations in the profiler's order, named by the tracker where it saw them.

    Each profiler allocation is matched to the tracked storage of the same address and size (in order);
    unmatched ones (scratch space inside kernels) become temporaries of the op that was running.
    """
    pending: dict[tuple[int, int], list[int]] = {}
    for key, i in sorted(rec.alloc_index.items(), key=lambda kv: kv[1]):
        if rec.events[i][3] != "setup":
            pending.setdefault((rec.ptr_of.get(key, 0), rec.nbytes[key]), []).append(key)
    raw = [ev for ev in rec.events if ev[3] == "setup" and ev[1] > 0]
    live_at: dict[int, tuple[int, int]] = {}  # ptr -> (key, nbytes)
    next_key = 1 << 40
    ctx = (0, "setup", "", "")
    for _t, ptr, n, kop in allocs:
        if n > 0:
            keys = pending.get((ptr, n))
            if keys:
                key = keys.pop(0)
                ev = rec.events[rec.alloc_index[key]]
                ctx = (ev[2], ev[3], ev[4], ev[5])
                raw.append((key, n, *ctx))
            else:
                key = next_key
                next_key += 1
                raw.append((key, n, ctx[0], ctx[1], ctx[2], f"{kop} (kernel scratch)"))
            live_at[ptr] = (key, n)
        else:
            entry = live_at.pop(ptr, None)
            if entry is not None:
                raw.append((entry[0], -entry[1], *ctx))
    return _with_temporaries(raw, dict(info.storage_roles), cfg)


def _with_temporaries(raw, roles, cfg) -> Trace:
    cats = categorize(raw, roles, cfg.training)
    for key in cats:
        if key >= 1 << 40:
            cats[key] = "temporaries"
    ev = tuple(
        MemEvent(index=i, storage=k, nbytes=n, category=cats[k], step=s, phase=ph, module=m, op=op)
        for i, (k, n, s, ph, m, op) in enumerate(raw)
    )
    return Trace(events=ev, source="profiler-cpu", device="cpu")


def profile(source, cfg: TrainConfig, *, cancel=None, progress=None) -> Estimate:
    """The measured counterpart of engine.estimator.estimate, on this machine's CPU."""
    if cfg.device == "cuda" and torch.cuda.is_available():
        try:
            from .profiler_cuda import profile_cuda
        except ImportError:
            pass
        else:
            return profile_cuda(source, cfg, cancel=cancel, progress=progress)
    t0 = time.perf_counter()
    if progress:
        progress(0.1, "running the step for real on the CPU")
    try:
        trace, info, _peak = measure_cpu(source, cfg.with_(device="cpu"), cancel=cancel)
    except MemoryError:
        raise UserError("out of host memory while running the step for real on the CPU") from None
    est = summarise(trace, info, cfg.with_(device="cpu"), elapsed_s=time.perf_counter() - t0)
    if progress:
        progress(1.0, "done")
    return est
