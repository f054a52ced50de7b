"""Turns a categorised Trace into the Estimate every view renders: peak, breakdown, timeline, per-module rows."""

from __future__ import annotations

from itertools import accumulate, islice
from typing import TYPE_CHECKING

from ..config.train_config import TrainConfig
from ..results.types import CATEGORIES, Estimate, ModuleRow, PhaseSpan, TimelinePoint, Trace

if TYPE_CHECKING:
    from .recorded_step import ModelInfo

# a category's place in a module's row of _module_rows (parameters are counted whole, not at the peak)
_SLOT = {"gradients": 1, "optimizer_state": 2, "activations": 3}
MAX_POINTS = 1500  # timeline points kept; each bucket's maximum (so the peak) and phase edges survive


def _kept_indices(totals: list[int], phase_edges: set[int]) -> list[int]:
    n = len(totals)
    bucket = max(1, -(-n // MAX_POINTS))
    kept = set(phase_edges)
    for start in range(0, n, bucket):
        part = totals[start:start + bucket]
        kept.add(start + part.index(max(part)))  # the bucket's first highest and first lowest
        kept.add(start + part.index(min(part)))
    kept.add(n - 1)
    return sorted(kept)


def phase_spans(trace: Trace) -> tuple[PhaseSpan, ...]:
    ev = trace.events
    if not ev:
        return ()
    spans: list[PhaseSpan] = []
    start = 0
    step, phase = ev[0].step, ev[0].phase
    for i, e in enumerate(ev):
        if e.step != step or e.phase != phase:
            spans.append(PhaseSpan(step, phase, start, i - 1))
            start, step, phase = i, e.step, e.phase
    spans.append(PhaseSpan(step, phase, start, len(ev) - 1))
    return tuple(spans)


def summarise(trace: Trace, info: ModelInfo, cfg: TrainConfig, elapsed_s: float = 0.0) -> Estimate:
    events = trace.events
    if not events:
        raise ValueError("empty trace")
    totals = list(accumulate(e.nbytes for e in events))
    peak_i = totals.index(max(totals))  # the first event after which the most is live
    spans = phase_spans(trace)
    edges = {s.start for s in spans} | {s.end for s in spans} | {peak_i}
    kept = _kept_indices(totals, edges)  # (the peak among them)

    at_peak: dict[int, int] = {}  # storage -> nbytes, at the peak
    for e in islice(events, peak_i + 1):
        if e.nbytes >= 0:
            at_peak[e.storage] = e.nbytes
        else:
            at_peak.pop(e.storage, None)
    cur: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    get = cur.get
    points: list[TimelinePoint] = []
    rest, done = iter(events), 0
    for i in kept:  # the live bytes by category after each kept event: the events up to it added in
        for e in islice(rest, i + 1 - done):
            cur[e.category] = get(e.category, 0) + e.nbytes  # a snapshot adds 'workspace'
        done = i + 1
        e = events[i]
        points.append(TimelinePoint(i, e.step, e.phase, e.module, e.op, dict(cur)))
        if i == peak_i:
            breakdown = dict(cur)
    pe = events[peak_i]
    return Estimate(
        model_name=info.name,
        config=cfg,
        parameters=info.parameters,
        trainable_parameters=info.trainable_parameters,
        peak_bytes=totals[peak_i],
        peak_index=peak_i,
        peak_step=pe.step,
        peak_phase=pe.phase,
        peak_module=pe.module,
        peak_op=pe.op,
        breakdown_at_peak=breakdown,
        per_module=_module_rows(trace, info, at_peak, totals[peak_i]),
        timeline=tuple(points),
        phases=spans,
        source=trace.source,
        notes=tuple(info.notes),
        elapsed_s=elapsed_s,
        method=info.method,
        checkpointed=tuple(info.checkpointed),
        modelled=tuple(info.modelled),
        trace_fold=info.fold,
    )


def _module_rows(trace: Trace, info: ModelInfo, at_peak: dict[int, int], peak: int) -> tuple[ModuleRow, ...]:
    """Each module's own bytes alive at the peak: its parameters, their gradients and optimizer state,
    and the forward allocations made while it was the innermost module."""
    first: dict[int, tuple[str, str]] = {}  # storage -> the category and module of its first allocation
    sizes: dict[int, int] = {}  # storage -> the bytes of its last allocation (in the order of the first)
    for e in trace.events:
        n = e.nbytes
        if n > 0:
            k = e.storage
            if k not in first:
                first[k] = (e.category, e.module)
            sizes[k] = n
    # owner -> [parameter, gradient, optimizer, activation bytes, bytes at the peak]
    acc: dict[str, list[int]] = {}
    owner_of, live_at_peak = info.storage_owner.get, at_peak.get
    for storage, nbytes in sizes.items():
        cat, mod = first[storage]
        live = live_at_peak(storage)
        if live is None and cat != "parameters":
            continue
        owner = owner_of(storage, mod)
        row = acc.get(owner)
        if row is None:
            row = acc[owner] = [0, 0, 0, 0, 0]
        if cat == "parameters":
            row[0] += nbytes
        if live is not None:
            slot = _SLOT.get(cat)
            if slot is not None:
                row[slot] += live
            row[4] += live
    rows = []
    for name, typ in info.module_types.items():
        a = acc.get(name)
        params = info.module_params.get(name, 0)
        if not a and not params:
            continue
        p, g, o, act, at = a or (0, 0, 0, 0, 0)
        rows.append(
            ModuleRow(
                name=name or "(model)",
                type=typ,
                parameters=params,
                parameter_bytes=p,
                gradient_bytes=g,
                optimizer_bytes=o,
                activation_bytes=act,
                bytes_at_peak=at,
                share_of_peak=at / peak if peak else 0.0,
            )
        )
    return tuple(rows)
