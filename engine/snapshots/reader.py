"""A real run's PyTorch memory snapshot as the Estimate every view renders (source "snapshot").

The allocator's history (alloc / free / segment events) becomes the same categorised Trace the tracer and the
profiler produce: each allocation's category comes from its stack frames and its lifetime (engine.snapshots.frames),
phases and steps from the frames and the optimizer annotations, the reserved line from the segment events. A
snapshot dumped at an out-of-memory error also says what failed, what was live, and how far the job got.
"""

from __future__ import annotations

import bisect
import gc
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.optimizers import NAME_OF_CLASS, NAME_OF_STEP_FILE
from ..config.train_config import Precision, TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.progress import CancelToken, Progress
from ..core.units import format_bytes
from ..results.estimate_fields import MeasuredPeaks, OomReport, SegmentRow, SegmentSummary, SnapshotFindings
from ..results.instants import instant_label
from ..results.types import Category, Estimate, GpuFigures, MemEvent, Trace
from ..trace.recorded_step import ModelInfo
from ..trace.summary import summarise
from .file import alloc_conf_of, load_snapshot_file
from .frames import (
    BWD,
    FWD,
    NONE,
    OPT,
    PARAM,
    FrameFacts,
    classify,
    stack_text,
)

_NO_FACTS = FrameFacts(NONE, "", "", "", False)


@dataclass
class _Scan:
    """What one pass over the allocator's history collects."""

    raw: list[tuple[int, int, int, str, str, str]] = field(default_factory=list)  # key, ±bytes, step, phase, module, op
    reserved: list[int] = field(default_factory=list)  # reserved bytes after each raw event
    facts: dict[int, FrameFacts] = field(default_factory=dict)  # key → its allocation's facts
    baseline_keys: set[int] = field(default_factory=set)
    oom: dict[str, Any] | None = None
    oom_facts: FrameFacts | None = None
    oom_index: int = 0
    oom_step: int = 0
    oom_phase: str = "setup"
    oom_reserved: int = 0
    hints: dict[str, bool] = field(default_factory=dict)
    optimizer_class: str = ""


def _pick_device(traces: list[list[dict[str, Any]]], segments: list[dict[str, Any]]) -> int:
    best, best_n = 0, -1
    for i, t in enumerate(traces):
        n = len(t) + (1 << 40 if any(e.get("action") == "oom" for e in t[-50:]) else 0)
        if n > best_n:
            best, best_n = i, n
    if best_n <= 0 and segments:
        return int(segments[0].get("device", 0))
    return best


def _optimizer_spans(annotations: list[Any]) -> tuple[list[int], list[int], str]:
    starts: list[int] = []
    ends: list[int] = []
    cls = ""
    open_at: int | None = None
    for a in annotations or []:
        if not isinstance(a, dict):
            continue
        name = str(a.get("name", ""))
        if not name.startswith("Optimizer.step#"):
            continue
        cls = name.split("#", 1)[1].split(".", 1)[0]
        t = int(a.get("time_us", 0) or 0)
        if a.get("stage") == "START":
            open_at = t
        elif a.get("stage") == "END" and open_at is not None:
            starts.append(open_at)
            ends.append(t)
            open_at = None
    return starts, ends, cls


def _scan(trace: list[dict[str, Any]], segments: list[dict[str, Any]], annotations: list[Any], device: int,
          progress: Progress | None,
          cancel: CancelToken | None) -> _Scan:
    s = _Scan()
    opt_starts, opt_ends, s.optimizer_class = _optimizer_spans(annotations)
    # Blocks alive before the (bounded) history began: freed without an allocation in it, or still active at the
    # dump without one. Their sizes come first, as "setup".
    allocated_in_trace: set[int] = set()
    freed_first: dict[int, tuple[int, Any]] = {}
    seg_delta = 0
    for e in trace:
        a = e.get("action")
        if a == "alloc":
            allocated_in_trace.add(e.get("addr", 0))
        elif a in ("free_requested", "free_completed"):
            addr = e.get("addr", 0)
            if addr not in allocated_in_trace and addr not in freed_first:
                freed_first[addr] = (int(e.get("size", 0)), e.get("frames") or ())
        elif a in ("segment_alloc", "segment_map"):
            seg_delta += int(e.get("size", 0))
        elif a in ("segment_free", "segment_unmap"):
            seg_delta -= int(e.get("size", 0))
    end_reserved = 0
    end_blocks: dict[int, tuple[int, Any]] = {}
    for seg in segments:
        if int(seg.get("device", device)) != device:
            continue
        end_reserved += int(seg.get("total_size", 0))
        for b in seg.get("blocks", ()):
            if str(b.get("state", "")).startswith("active") and b.get("address", 0) not in allocated_in_trace:
                size = int(b.get("requested_size") or b.get("size", 0))
                end_blocks[b.get("address", 0)] = (size, b.get("frames") or ())
    res = max(0, end_reserved - seg_delta)
    key = 0
    live: dict[int, tuple[int, int]] = {}  # addr → (key, size)
    for addr, (size, frames) in list(freed_first.items()) + list(end_blocks.items()):
        if addr in live:
            continue
        f = classify(frames) if frames else _NO_FACTS
        s.facts[key] = f
        s.baseline_keys.add(key)
        s.raw.append((key, size, 0, "setup", f.module, f.op or "(before the history began)"))
        s.reserved.append(res)
        live[addr] = (key, size)
        key += 1
    cache: dict[tuple[int, ...], FrameFacts] = {}
    retagged: dict[tuple[int, str], FrameFacts] = {}
    phase, step = "setup", 0
    module = op = ""
    hints = {"autocast": False, "grad_scaler": False, "checkpoint": False, "backward": False, "fused": False}
    opt_file = ""
    n = len(trace)
    tick = max(1, n // 50)
    raw_add, res_add, facts = s.raw.append, s.reserved.append, s.facts
    live_pop = live.pop
    seen_facts: set[int] = set()
    for i, e in enumerate(trace):
        if i % tick == 0:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if progress is not None:
                progress(0.5 + 0.4 * i / n, "sorting the allocations into categories")
        a = e.get("action")
        if a == "free_requested" or a == "free_completed":
            old = live_pop(e.get("addr", 0), None)
            if old is not None:
                raw_add((old[0], -old[1], step, phase, module, op))
                res_add(res)
        elif a == "alloc" or a == "oom":
            frames = e.get("frames") or ()
            ck = tuple(map(id, frames))
            cached = cache.get(ck)
            if cached is None:
                cached = cache[ck] = classify(frames) if frames else _NO_FACTS
            f = cached
            hint = f.hint
            if opt_starts and hint != BWD:
                t = e.get("time_us", 0) or 0
                j = bisect.bisect_right(opt_starts, t) - 1
                if j >= 0 and t <= opt_ends[j]:
                    hint = OPT
            if hint == OPT:
                phase = "optimizer"
            elif hint == BWD:
                phase = "backward"
            elif hint == FWD:
                if phase == "backward" or phase == "optimizer":
                    step += 1
                phase = "forward"
            elif hint == NONE and phase == "forward":
                phase = "backward"  # the autograd thread has no Python frames
            if id(f) not in seen_facts:
                seen_facts.add(id(f))
                for name, seen in (("autocast", f.autocast), ("grad_scaler", f.grad_scaler),
                                   ("checkpoint", f.checkpoint), ("fused", f.fused)):
                    if seen:
                        hints[name] = True
                if f.optimizer_file:
                    opt_file = f.optimizer_file
            if phase == "backward":
                hints["backward"] = True
            module, op = f.module, f.op
            if a == "oom":
                s.oom, s.oom_facts, s.oom_index = e, f, len(s.raw)
                s.oom_step, s.oom_phase, s.oom_reserved = step, phase, res
                continue
            size = e.get("size", 0)
            addr = e.get("addr", 0)
            old = live_pop(addr, None)
            if old is not None:  # a free the history lost: the block was reused
                raw_add((old[0], -old[1], step, phase, module, op))
                res_add(res)
            if hint == PARAM and phase != "setup":
                hint = f.hint
            if hint != f.hint:
                g = retagged.get((id(f), hint))
                if g is None:
                    g = retagged[(id(f), hint)] = replace(f, hint=hint)
                f = g
            facts[key] = f
            raw_add((key, size, step, phase, module, op))
            res_add(res)
            live[addr] = (key, size)
            key += 1
        elif a == "segment_alloc" or a == "segment_map":
            res += e.get("size", 0)
        elif a == "segment_free" or a == "segment_unmap":
            res -= e.get("size", 0)
    s.hints = hints
    if not s.optimizer_class and opt_file:
        s.optimizer_class = opt_file
    return s


def _categories(s: _Scan, training: bool) -> dict[int, Category]:
    """Each allocation's category from its facts and its lifetime (the tracer's rule for activations)."""
    first_forward: list[int] = []  # event index where each forward span starts
    alloc_at: dict[int, tuple[int, int, str]] = {}
    freed_at: dict[int, tuple[int, str, int]] = {}
    prev = None
    for i, (key, n, step, phase, _m, _op) in enumerate(s.raw):
        if phase == "forward" and prev != (step, "forward"):
            first_forward.append(i)
        prev = (step, phase)
        if n > 0:
            alloc_at[key] = (i, step, phase)
        else:
            freed_at[key] = (step, phase, i)
    cats: dict[int, Category] = {}
    for key, (i, step, phase) in alloc_at.items():
        f = s.facts.get(key, _NO_FACTS)
        fr = freed_at.get(key)
        if f.workspace:
            cats[key] = Category.WORKSPACE
        elif key in s.baseline_keys:
            cats[key] = _baseline_category(f, fr)
        elif f.hint == PARAM and phase == "setup":
            cats[key] = Category.PARAMETERS
        elif phase == "forward":
            cats[key] = Category.ACTIVATIONS if (not training or fr is None or fr[:2] != (step, "forward")) \
                else Category.TEMPORARIES
        elif phase == "backward":
            cats[key] = Category.GRADIENTS if (fr is None or fr[:2] != (step, "backward")) \
                else Category.TEMPORARIES
        elif phase == "optimizer" and f.hint == OPT:
            cats[key] = Category.OPTIMIZER_STATE if (fr is None or fr[:2] != (step, "optimizer")) \
                else Category.TEMPORARIES
        else:
            # Allocated outside the model and the optimizer (a batch copied to the GPU, a loss scale): an input
            # when a later forward uses it, else a temporary.
            j = bisect.bisect_right(first_forward, i)
            later_forward = first_forward[j] if j < len(first_forward) else None
            alive_then = later_forward is not None and (fr is None or fr[2] > later_forward)
            cats[key] = Category.INPUTS if alive_then else Category.TEMPORARIES
    return cats


def _baseline_category(f: FrameFacts, freed: tuple[int, str, int] | None) -> Category:
    if f.hint == PARAM:
        return Category.PARAMETERS
    if f.hint == OPT:
        return Category.OPTIMIZER_STATE
    if f.hint == BWD:
        return Category.GRADIENTS
    if f.hint == FWD:
        return Category.ACTIVATIONS
    if freed is not None and freed[1] == "optimizer":
        return Category.GRADIENTS  # freed by zero_grad
    return Category.PARAMETERS if freed is None else Category.TEMPORARIES


def _segments_summary(segments: list[dict[str, Any]], device: int) -> SegmentSummary:
    total = active = free = largest = 0
    count = {"large": 0, "small": 0}
    expandable = False
    rows: list[SegmentRow] = []
    for seg in segments:
        if int(seg.get("device", device)) != device:
            continue
        size = int(seg.get("total_size", 0))
        total += size
        a = int(seg.get("active_size", seg.get("allocated_size", 0)))
        active += a
        kind = str(seg.get("segment_type", "large"))
        count[kind] = count.get(kind, 0) + 1
        expandable = expandable or bool(seg.get("is_expandable", False))
        for b in seg.get("blocks", ()):
            if b.get("state") == "inactive":
                bs = int(b.get("size", 0))
                free += bs
                largest = max(largest, bs)
        rows.append(SegmentRow(address=int(seg.get("address", 0)), total_size=size, active_size=a, segment_type=kind,
                               stream=int(seg.get("stream", 0)), blocks=len(seg.get("blocks", ()))))
    rows.sort(key=lambda r: r.total_size, reverse=True)
    return SegmentSummary(count=sum(count.values()), large=count.get("large", 0), small=count.get("small", 0),
                          reserved_bytes=total, active_bytes=active, free_bytes=free, largest_free_block=largest,
                          fragmentation=(free / total) if total else 0.0, expandable_segments=expandable,
                          largest=tuple(rows[:50]))


def implied_config(s: _Scan, training: bool, opt_state_bytes: int) -> tuple[TrainConfig, list[str]]:
    """The training configuration the snapshot's frames show, and what it could not see."""
    notes = []
    optimizer = "none"
    if training:
        cls = s.optimizer_class.lower()
        # the Optimizer.step annotation's class, else the torch/optim file of the frames (engine.config.optimizers'
        # maps)
        optimizer = NAME_OF_CLASS.get(cls) or NAME_OF_STEP_FILE.get(cls, "")
        if optimizer == "sgd" and opt_state_bytes > 0:
            optimizer = "sgd-momentum"
        if not optimizer:
            optimizer = "adam"
            notes.append("the optimizer is not in the snapshot (no optimizer step recorded): adam assumed; "
                         "give --optimizer")
    precision: Precision
    if s.hints.get("autocast"):
        precision = "amp-fp16" if s.hints.get("grad_scaler") else "amp-bf16"
        notes.append(f"autocast seen in the frames: {precision} assumed (the dtype is not recorded); "
                     "give --precision")
    else:
        precision = "fp32"
    if training and not s.hints.get("backward"):
        notes.append("the run ended before its first backward: training assumed; give --mode inference if not")
    notes.append("the batch size is not in a snapshot: give --batch-size (or --model, to infer it from the inputs)")
    cfg = TrainConfig(optimizer=optimizer, precision=precision, mode="train" if training else "inference",
                      checkpointing=bool(s.hints.get("checkpoint")), device="cuda",
                      fused=bool(s.hints.get("fused")))
    return cfg, notes


def open_snapshot(path: str | Path, *, progress: Progress | None = None,
                  cancel: CancelToken | None = None) -> Estimate:
    """The snapshot at `path` as an Estimate (source "snapshot"); UserError with one line for a bad file."""
    t0 = time.perf_counter()
    # A long history is millions of small dicts that never form cycles: the cyclic collector would walk them
    # over and over while they are built (about 40 % of the time). It is off for the read, and back after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        data = load_snapshot_file(path, progress=progress, cancel=cancel)
        est = snapshot_estimate(data, name=Path(path).name, progress=progress, cancel=cancel)
        del data
    finally:
        if collecting:
            gc.enable()
    assert est.snapshot is not None  # snapshot_estimate's
    found = replace(est.snapshot, path=str(path))
    if progress is not None:
        progress(1.0, "done")
    return replace(est, snapshot=found, elapsed_s=time.perf_counter() - t0)


def snapshot_estimate(data: dict[str, Any], *, name: str = "snapshot", progress: Progress | None = None,
                      cancel: CancelToken | None = None) -> Estimate:
    segments = data.get("segments") or []
    traces = data.get("device_traces") or []
    device = _pick_device(traces, segments)
    trace = traces[device] if device < len(traces) else []
    s = _scan(trace, segments, data.get("external_annotations") or [], device, progress, cancel)
    if not s.raw:
        raise UserError(f"'{name}' holds no allocations on device {device} (an empty history and no live "
                        "blocks): record with torch.cuda.memory._record_memory_history() before the step")
    # A run that died in its first forward shows no backward: it was training unless the user says otherwise.
    training = bool(s.hints.get("backward")) or any(r[3] == "optimizer" for r in s.raw[-1:]) or s.oom is not None
    cats = _categories(s, training)
    events = tuple(MemEvent(index=i, storage=k, nbytes=n, category=cats[k], step=st, phase=ph, module=m, op=op)
                   for i, (k, n, st, ph, m, op) in enumerate(s.raw))
    tr = Trace(events=events, source="snapshot", device="cuda")
    module_types = {"": "(model)"}
    for f in s.facts.values():
        if f.module:
            module_types.setdefault(f.module, f.module_type)
    info = ModelInfo(name=name, parameters=0, trainable_parameters=0, module_types=module_types, module_params={},
                     storage_roles={}, storage_owner={}, method="snapshot")
    if progress is not None:
        progress(0.92, "building the timeline")
    opt_total = sum(n for (k, n, *_r) in s.raw if n > 0 and cats[k] == Category.OPTIMIZER_STATE)
    cfg, notes = implied_config(s, training, opt_total)
    est = summarise(tr, info, cfg)
    # the reserved line and the allocator's figures, aligned with the timeline's points
    nres = len(s.reserved)
    res_peak_i = max(range(nres), key=s.reserved.__getitem__)
    allocated = blocks = 0
    live_peak = live_i = 0
    max_blocks = 0
    input_bytes = -1  # inputs live when the first forward starts: what --model reads the batch size from
    for i, e in enumerate(events):
        if input_bytes < 0 and e.phase == "forward":
            input_bytes = sum(ev.nbytes for ev in events[:i] if ev.category == Category.INPUTS)
        allocated += e.nbytes
        # the allocator's own count (max_memory_allocated) is of blocks: requests rounded up to 512 bytes
        n = e.nbytes
        blocks += ((n + 511) // 512 * 512 or 512) if n > 0 else -((-n + 511) // 512 * 512 or 512)
        max_blocks = max(max_blocks, blocks)
        if allocated > live_peak:
            live_peak, live_i = allocated, i
    seg = _segments_summary(segments, device)
    reserved_peak = max(s.reserved[res_peak_i], s.oom_reserved)
    oom = _oom_report(s, est, seg) if s.oom is not None else None
    ws_peak = est.breakdown_at_peak.get("workspace", 0)
    gpu = GpuFigures(
        gpu_name=None, gpu_total_bytes=None, reserved_bytes=reserved_peak,
        cached_free_bytes=max(0, s.reserved[min(live_i, nres - 1)] - live_peak), cuda_context_bytes=0,
        workspace_bytes=ws_peak, nvidia_smi_bytes=0, segments=seg.count,
        fits=None, margin_bytes=None,
        reserved_timeline=tuple(s.reserved[min(p.index, nres - 1)] for p in est.timeline),
        reserved_at_live_peak_bytes=s.reserved[min(live_i, nres - 1)],
        live_peak_at=instant_label(events, live_i), reserved_peak_at=instant_label(events, res_peak_i),
    )
    measured = MeasuredPeaks(max_memory_allocated=max_blocks, max_memory_reserved=reserved_peak)
    found = SnapshotFindings(
        device=device, events=len(trace), allocations=sum(1 for r in s.raw if r[1] > 0),
        before_history=len(s.baseline_keys), segments=seg, input_bytes=max(0, input_bytes),
        alloc_conf=alloc_conf_of(data), implied_config=cfg,
        frames=any(f is not _NO_FACTS for f in s.facts.values()),
    )
    notes = list(notes)
    if s.baseline_keys:
        notes.append(f"{len(s.baseline_keys)} blocks were allocated before the recorded history began "
                     "(max_entries was reached); they count from its start, by their frames")
    if not found.frames:
        notes.append("the snapshot has no stack frames: categories come from lifetimes alone")
    notes.append("measured by PyTorch's caching allocator on a real GPU: the timeline counts the bytes each "
                 "allocation asked for (tensor bytes, as the estimate does); max_memory_allocated counts them in "
                 "512-byte blocks (a block the allocator did not split is counted at its request)")
    return replace(est, source="snapshot", gpu=gpu, notes=tuple(notes), measured=measured, snapshot=found, oom=oom)


def _oom_report(s: _Scan, est: Estimate, seg: SegmentSummary) -> OomReport:
    e = s.oom or {}
    f = s.oom_facts or _NO_FACTS
    live = dict(est.timeline[-1].by_category) if est.timeline else {}
    allocated = sum(live.values())
    req = int(e.get("size", 0))
    free = e.get("device_free")
    stack = stack_text(e.get("frames") or ())
    where = f.module or "(outside any module)"
    msg = (f"tried to allocate {format_bytes(req)} in step {s.oom_step + 1}, {s.oom_phase}, {where}, op {f.op or '?'}"
           f" with {format_bytes(allocated)} allocated and {format_bytes(s.oom_reserved)} reserved")
    if free is not None and int(free) >= req:
        msg += (f"; the device still had {format_bytes(int(free))} free, so the limit was the process's "
                "(set_per_process_memory_fraction or another job's share), not the GPU")
    elif seg.free_bytes >= req and seg.largest_free_block < req:
        msg += (f"; {format_bytes(seg.free_bytes)} was free inside the reserved segments but no block was large "
                "enough (fragmentation: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    return OomReport(
        requested_bytes=req, device_free_bytes=int(free) if free is not None else None, allocated_bytes=allocated,
        reserved_bytes=s.oom_reserved, step=s.oom_step, phase=s.oom_phase, module=f.module, op=f.op, stack=stack,
        live_by_category={k: v for k, v in live.items() if v}, free_in_segments=seg.free_bytes,
        largest_free_block=seg.largest_free_block, events_before=s.oom_index, message=msg,
    )
