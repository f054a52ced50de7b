"""What a memory report says, computed once from an Estimate: plain, JSON-serialisable facts (bytes as integers),
and the charts it shows (`chart_painters`).

The PDF, HTML and JSON exports all render these facts, so the three always carry the same figures.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import PySide6
import torch
from PySide6.QtCore import QRectF
from PySide6.QtGui import QPainter

from engine import __version__
from engine.core.units import format_bytes
from engine.planning.planner import Recommendation
from engine.results.module_groups import ModuleGroup, fold_modules, summed_figures
from engine.results.types import ALL_CATEGORIES, Estimate
from render.colors import LIGHT, category_label, category_meaning, ordered_categories
from render.donut import paint_donut
from render.timeline import paint_timeline

TOP_MODULES = 25

Facts = dict[str, Any]
"""What the report states (`report_facts`), as JSON data: bytes as integers, rows as lists of objects."""

ChartPainter = Callable[[QPainter, QRectF], None]
"""`paint(painter, rect)`: one chart drawn inside `rect` on any paint device."""


class ReportContent(TypedDict, total=False):
    """What a report says besides the estimate: `report_facts`' keywords, which every export takes."""

    recommendations: Sequence[Recommendation] | None
    max_batch: int | None  # the largest batch that fits (planner.max_batch's batch_size)
    max_batch_none: str | None  # why no batch fits, when the search found none ("even batch size 1 does not fit: …")
    measured: Estimate | None
    measured_against: Estimate | None
    gpu_snapshot: dict[str, Any] | None
    generated: _dt.datetime | None


def config_rows(est: Estimate) -> list[tuple[str, str]]:
    c = est.config
    if c.image_size:
        inp = f"image {c.image_size} × {c.image_size}"
    elif c.seq_len:
        inp = f"sequence length {c.seq_len}"
    else:
        inp = "the model's default"
    optimizer = c.optimizer + (" (fused)" if c.fused else "")
    rows = [
        ("Batch size", str(c.batch_size)),
        ("Input", inp),
        ("Precision", c.precision),
        ("Optimizer", optimizer if c.training else f"{optimizer} (not used in inference)"),
        ("Mode", "training step" if c.training else "generation" if c.generating else "inference pass"),
        ("Checkpointing", "on" if c.checkpointing else "off"),
        ("Grad. accumulation", f"{c.grad_accum} micro-batch{'es' if c.grad_accum > 1 else ''}"),
        ("Target", "NVIDIA GPU (CUDA)" if c.device == "cuda" else "CPU"),
        ("Target GPU", c.gpu or "none named"),
        (
            "Strategy",
            "single device"
            if c.world_size == 1
            else f"{c.strategy} on {c.world_size} GPUs" + (f", tensor-parallel {c.tp}" if c.tp > 1 else ""),
        ),
    ]
    if not c.generating:  # a generation names its own program below
        rows.append(("Program", c.describe_program()))
    if c.peft is not None:  # a LoRA/QLoRA run must not read as full fine-tuning
        alpha = c.lora_alpha or 2 * c.lora_rank
        targets = f", on {c.lora_targets}" if c.lora_targets else ""
        rows.append(("Fine-tuning", f"{'QLoRA' if c.peft == 'qlora' else 'LoRA'}, rank {c.lora_rank}, "
                                    f"alpha {alpha}{targets}"))
    if c.weight_format is not None:
        rows.append(("Frozen weights", c.weight_format))
    if c.alloc_conf:
        rows.append(("PYTORCH_CUDA_ALLOC_CONF", c.alloc_conf))
    g = est.generation
    if g is not None:
        rows += [
            ("Generation", f"prompt {g.prompt_len:,} + {g.new_tokens:,} new tokens, {g.cache} KV cache"),
            ("Generation program", g.describe_program()),
            ("Prefill peak", fmt_bytes(g.prefill_peak_bytes)),
            ("Decode peak (last token)", fmt_bytes(g.decode_peak_bytes)),
            ("KV cache at the last token", fmt_bytes(g.kv_cache_bytes)),
        ]
    return rows


def _versions(gpu_snapshot: dict[str, Any] | None) -> dict[str, str]:
    out = {"VRAMScope": __version__, "Python": platform.python_version(), "OS": platform.platform(terse=True)}
    out["PyTorch"] = torch.__version__
    out["CUDA (PyTorch build)"] = torch.version.cuda or "none (CPU build)"
    driver = _find_key(gpu_snapshot, ("driver_version", "driver")) if gpu_snapshot else None
    if driver:
        out["NVIDIA driver"] = str(driver)
    out["Qt (PySide6)"] = PySide6.__version__
    return out


def _find_key(d: object, names: tuple[str, ...]) -> str | int | float | None:
    if isinstance(d, dict):
        for n in names:
            v = d.get(n)
            if isinstance(v, (str, int, float)):
                return v
        for v in d.values():
            r = _find_key(v, names)
            if r is not None:
                return r
    elif isinstance(d, (list, tuple)):
        for v in d:
            r = _find_key(v, names)
            if r is not None:
                return r
    return None


def _summary(est: Estimate, max_batch: int | None, max_batch_none: str | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {
        "peak_allocated_bytes": est.peak_bytes,
        "peak_phase": est.peak_phase,
        "peak_step": est.peak_step - min((p.step for p in est.phases), default=est.peak_step) + 1,
        "peak_module": est.peak_module or "(top level)",
        "peak_op": est.peak_op,
        "parameters": est.parameters,
        "trainable_parameters": est.trainable_parameters,
        "world_size": est.config.world_size,
        "max_batch": max_batch,
        "max_batch_none": max_batch_none if max_batch is None else None,
    }
    g = est.gpu
    if g is not None:
        s.update(
            gpu_name=g.gpu_name,
            gpu_total_bytes=g.gpu_total_bytes,
            # what a process can allocate there (the card less the driver's reserve): the margin's reference
            gpu_usable_bytes=g.nvidia_smi_bytes + g.margin_bytes if g.margin_bytes is not None else None,
            reserved_bytes=g.reserved_bytes,
            cached_free_bytes=g.cached_free_bytes,
            reserved_at_live_peak_bytes=g.reserved_at_live_peak_bytes,
            live_peak_at=g.live_peak_at,
            reserved_peak_at=g.reserved_peak_at,
            cuda_context_bytes=g.cuda_context_bytes,
            workspace_bytes=g.workspace_bytes,
            nvidia_smi_bytes=g.nvidia_smi_bytes,
            segments=g.segments,
            fits=g.fits,
            margin_bytes=g.margin_bytes,
            verdict=g.verdict,
            verdict_reason=g.verdict_reason,
            assumed_gpu=g.assumed_gpu,
            nvidia_smi_low_bytes=g.nvidia_smi_low_bytes,
            nvidia_smi_high_bytes=g.nvidia_smi_high_bytes,
            measured_bytes=g.measured_bytes,
            modelled_bytes=g.modelled_bytes,
        )
    return s


def _breakdown(est: Estimate, b: dict[str, int] | None = None) -> tuple[list[dict[str, Any]], int]:
    b = est.breakdown_at_peak if b is None else b
    whole = sum(v for v in b.values() if v > 0)
    rows = [
        {"category": c, "label": category_label(c, est.config.peft is not None), "bytes": int(b[c]),
         "share": (b[c] / whole if whole else 0.0)}
        for c in ordered_categories(b)
        if b[c] > 0
    ]
    return rows, whole


def _module_row(g: ModuleGroup) -> dict[str, Any]:
    return {
        "name": g.label if g.name else "(top level)",
        "type": g.type,
        "count": g.count,
        "parameters": g.parameters,
        "parameter_bytes": g.parameter_bytes,
        "gradient_bytes": g.gradient_bytes,
        "optimizer_bytes": g.optimizer_bytes,
        "activation_bytes": g.activation_bytes,
        "bytes_at_peak": g.bytes_at_peak,
        "share_of_peak": g.share_of_peak,
    }


def _per_module(est: Estimate) -> dict[str, Any]:
    """The largest holders, repeated blocks folded into one row each (`layers.0–79.mlp.up_proj ×80`)."""
    groups = fold_modules(est.per_module)
    top = [_module_row(g) for g in groups[:TOP_MODULES]]
    rest_groups = groups[TOP_MODULES:]
    rest = None
    if rest_groups:
        n = sum(g.count for g in rest_groups)
        rest = {
            "name": f"{n} other module{'s' if n > 1 else ''}",
            "type": "",
            "count": n,
            **summed_figures(rest_groups),
            "share_of_peak": sum(g.share_of_peak for g in rest_groups),
        }
    return {"count": len(est.per_module), "groups": len(groups), "top": top, "rest": rest}


def _recommendations(recs: Sequence[Recommendation] | None) -> list[dict[str, Any]]:
    return [{"title": r.title, "detail": r.detail, "cost": r.cost, "saves_bytes": r.saves_bytes,
             "new_peak_bytes": r.new_peak_bytes, "fits": r.fits, "changes_training": r.changes_training}
            for r in recs or ()]


def _comparison(est: Estimate, measured: Estimate | None, other_target: bool = False) -> dict[str, Any] | None:
    if measured is None:
        return None

    def row(label: str, e: int, m: int) -> dict[str, Any]:
        err = e - m
        return {"figure": label, "estimate_bytes": int(e), "measured_bytes": int(m), "error_bytes": int(err),
                "error_relative": (err / m) if m else None}

    rows = [row("Peak allocated", est.peak_bytes, measured.peak_bytes)]
    if est.gpu is not None and measured.gpu is not None:
        rows.append(row("Peak reserved", est.gpu.reserved_bytes, measured.gpu.reserved_bytes))
        rows.append(row("nvidia-smi used", est.gpu.nvidia_smi_bytes, measured.gpu.nvidia_smi_bytes))
    cats = [c for c in ALL_CATEGORIES if est.breakdown_at_peak.get(c, 0) or measured.breakdown_at_peak.get(c, 0)]
    by_cat = [
        row(category_label(c) + " at the peak", est.breakdown_at_peak.get(c, 0), measured.breakdown_at_peak.get(c, 0))
        for c in cats
    ]
    # A snapshot is compared with the estimate of the step it shows (engine.planning.snapshot_fit.beside), not the
    # configuration the report is of; a profile run on another device with that device's estimate.
    c, snapshot = est.config, measured.source == "snapshot"
    step = f"{c.mode}, batch {c.batch_size}, {c.precision}" + (f", {c.optimizer}" if c.training else "")
    return {"source": measured.source, "rows": rows, "by_category": by_cat,
            "against_device": c.device if other_target and not snapshot else None,
            "against_step": step if other_target and snapshot else None}


def _method(est: Estimate) -> dict[str, Any]:
    how = {
        "tracer": "The model's real training step (or inference pass) was run on fake tensors under a PyTorch "
        "dispatch mode that recorded every storage allocation and free with its op, module, phase and category. "
        "No real memory was taken and no GPU was needed.",
        "analytic": "Closed-form per-layer figures computed from the layer shapes alone (the instant estimate); "
        "the traced estimate replaces it when available.",
        "profiler-cpu": "Measured by running the step for real on this machine's CPU with the PyTorch profiler's "
        "memory timeline.",
        "profiler-cuda": "Measured by running the step for real on this machine's GPU with the CUDA allocator's "
        "memory history and statistics.",
        "snapshot": "Read from a real run's PyTorch memory snapshot (torch.cuda.memory._dump_snapshot): every "
        "allocation and free the CUDA caching allocator recorded, each put in a category from its stack frames "
        "and its lifetime, phases from the frames and the optimizer's annotations.",
    }.get(est.source, f"Obtained by the '{est.source}' method.")
    peak = (
        "The peak is the largest sum of live tensor bytes over the first two steps; the second is the steady state, "
        "where the optimizer state already exists. On a GPU it corresponds to torch.cuda.max_memory_allocated()."
        if est.config.training
        else "The peak is the largest sum of live tensor bytes during the inference pass."
    )
    gpu = None
    if est.gpu is not None:
        gpu = (
            "For the GPU target the traced allocations were replayed through a model of PyTorch's CUDA caching "
            "allocator (512-byte rounding, small and large pools, segment splitting) to predict reserved memory; "
            "the nvidia-smi figure adds the CUDA context and the library workspaces."
        )
    return {
        "source": est.source,
        "how": how,
        "peak": peak,
        "gpu": gpu,
        "units": "Sizes are in binary units: 1 KiB = 1024 bytes, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB.",
        "categories": [{"category": c, "label": category_label(c), "meaning": category_meaning(c)}
                       for c in ALL_CATEGORIES],
        "elapsed_s": round(est.elapsed_s, 3),
        "notes": list(est.notes) + [f"Modelled, not run: {m}" for m in est.modelled],
    }


def report_facts(
    est: Estimate,
    *,
    recommendations: Sequence[Recommendation] | None = None,
    max_batch: int | None = None,
    max_batch_none: str | None = None,
    measured: Estimate | None = None,
    measured_against: Estimate | None = None,
    gpu_snapshot: dict[str, Any] | None = None,
    generated: _dt.datetime | None = None,
) -> Facts:
    """Everything the report states, as plain data (the JSON export's "report" object).

    `measured_against`: the estimate for the device the measurement ran on, when that is not `est`'s target
    (a CPU run of a GPU-target estimate); the comparison is made with it, and the timeline shows no overlay."""
    generated = generated or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    breakdown, whole = _breakdown(est)
    return {
        "title": f"Memory report: {est.model_name}",
        "model": est.model_name,
        "generated": generated.isoformat(),
        "vramscope_version": __version__,
        "config": [{"name": k, "value": v} for k, v in config_rows(est)],
        "summary": _summary(est, max_batch, max_batch_none),
        "breakdown": breakdown,
        "breakdown_total_bytes": whole,
        # nvidia-smi's predicted figure split at the live peak (GPU targets only)
        "gpu_breakdown": _breakdown(est, est.gpu.breakdown_at_live_peak)[0]
        if est.gpu is not None and est.gpu.breakdown_at_live_peak else [],
        "per_module": _per_module(est),
        "recommendations": _recommendations(recommendations) if recommendations is not None else None,
        "comparison": _comparison(measured_against or est, measured, other_target=measured_against is not None),
        "gpu_snapshot": gpu_snapshot,
        "real_run": _real_run(est if est.source == "snapshot" else measured),
        "method": _method(est),
        "versions": _versions(gpu_snapshot),
    }


def _real_run(snap: Estimate | None) -> dict[str, Any] | None:
    """A memory snapshot's own findings: the file, its segments, and the out-of-memory error it was dumped at."""
    if snap is None or snap.source != "snapshot":
        return None
    s = snap.snapshot
    if s is None:  # an estimate file that names its source "snapshot" but carries none of its findings
        return None
    seg = s.segments
    return {
        "path": s.path or snap.model_name,
        "events": s.events,
        "allocations": s.allocations,
        "peak_bytes": snap.peak_bytes,
        "reserved_bytes": snap.gpu.reserved_bytes if snap.gpu is not None else None,
        "segments": {"count": seg.count, "reserved_bytes": seg.reserved_bytes, "active_bytes": seg.active_bytes,
                     "free_bytes": seg.free_bytes, "largest_free_block": seg.largest_free_block,
                     "expandable_segments": seg.expandable_segments},
        "oom": snap.oom.to_json() if snap.oom is not None else None,
    }


def chart_painters(
    est: Estimate, measured: Estimate | None = None, measured_against: Estimate | None = None
) -> dict[str, ChartPainter]:
    """The report's charts by the name the markup gives them: `paint(painter, rect)`, on paper (the light theme).
    A measurement made on another device than `est`'s target (`measured_against` given) is not overlaid."""
    if measured_against is not None:
        measured = None

    def timeline(p: QPainter, r: QRectF) -> None:
        paint_timeline(p, r, est, measured=measured, theme=LIGHT)

    def donut(p: QPainter, r: QRectF) -> None:
        paint_donut(p, r, est.breakdown_at_peak, theme=LIGHT, peft=est.config.peft is not None)

    return {"timeline": timeline, "donut": donut}


def running_header(facts: Facts) -> str:
    cfg = {r["name"]: r["value"] for r in facts["config"]}
    return f"VRAMScope memory report · {facts['model']} · batch {cfg['Batch size']} · {cfg['Precision']}"


def fmt_bytes(v: int | None) -> str:
    return "–" if v is None else format_bytes(v)
