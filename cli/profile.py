"""`profile MODEL [options] [--compare]`: run the step for real on this machine (CUDA if present, else the CPU),
measure it, and optionally compare the measurement with the estimate, figure by figure."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.units import format_bytes
from engine.results.types import CATEGORIES, Estimate

from .common import add_model_options, config_from_args, print_json, source_from_args
from .terminal import say

if TYPE_CHECKING:  # torch loads when the command runs, not when `vramscope --help` builds its parser
    from engine.config.train_config import TrainConfig
    from engine.models.source import ModelSource

ComparisonRow = tuple[str, int, int, float | None]  # (figure, estimate, measurement, error %)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--compare", action="store_true", help="also estimate, and print the error of each figure")


def run(args: argparse.Namespace) -> int:
    from engine.planning.room import profile_within_room as profile

    cfg = config_from_args(args)
    source = source_from_args(args)
    measured = profile(source, cfg)
    rows = compare(source, cfg, measured) if args.compare else None
    if args.json:
        out = measured.to_json()
        if measured.measured is not None:
            out["measured"] = measured.measured.to_json()
        if rows is not None:
            keys = ("figure", "estimate", "measured", "error_pct")
            out = {"measured": out, "comparison": [dict(zip(keys, r, strict=False))
                                                   for r in rows]}
        print_json(out)
        return 0
    from .estimate import render_summary

    where = "GPU" if measured.source == "profiler-cuda" else "CPU"
    print(f"Measured for real on this machine's {where} ({measured.source})")
    say(render_summary(measured))
    if rows is not None:
        print()
        say(render_comparison(rows))
    return 0


def _err(est: int, meas: int) -> float | None:
    return None if not meas else 100.0 * (est - meas) / meas


def compare(source: ModelSource, cfg: TrainConfig, measured: Estimate) -> list[ComparisonRow]:
    """(figure, estimate, measurement, error %) for the peak, each category at the peak and, on a GPU,
    max_memory_allocated, max_memory_reserved and nvidia-smi's used memory."""
    from engine.measure.real_fallback import run_for_real
    from engine.trace.summary import summarise
    from engine.trace.tracer import trace_model

    on_gpu = measured.source == "profiler-cuda"
    ecfg = cfg if on_gpu else cfg.with_(device="cpu", gpu=None)
    trace, info = trace_model(source, ecfg, real_run=run_for_real)
    est = summarise(trace, info, ecfg)
    rows = [("peak (live tensors)", est.peak_bytes, measured.peak_bytes, _err(est.peak_bytes, measured.peak_bytes))]
    for cat in CATEGORIES:
        e, m = est.breakdown_at_peak.get(cat, 0), measured.breakdown_at_peak.get(cat, 0)
        if e or m:
            rows.append((f"  {cat} at the peak", e, m, _err(e, m)))
    meas = measured.measured
    if on_gpu and meas is not None:
        from engine.cuda.device_model import device_detail

        d = device_detail(trace, est, ecfg)
        g = d.figures
        run = meas.run
        for name, modelled, measured_b in (
            ("max_memory_allocated", d.max_memory_allocated, meas.max_memory_allocated),
            ("max_memory_reserved", g.reserved_bytes, meas.max_memory_reserved),
            ("nvidia-smi used", g.nvidia_smi_bytes, run.nvml_used_bytes if run is not None else None),
            ("CUDA context", g.cuda_context_bytes, run.context_bytes if run is not None else None),
        ):
            if measured_b is not None:
                rows.append((name, modelled, measured_b, _err(modelled, measured_b)))
    return rows


def render_comparison(rows: Sequence[ComparisonRow]) -> str:
    lines = [f"{'figure':<28}{'estimate':>14}{'measured':>14}{'error':>9}"]
    for name, e, m, err in rows:
        lines.append(f"{name:<28}{format_bytes(e):>14}{format_bytes(m):>14}"
                     + (f"{err:+8.2f}%" if err is not None else f"{'n/a':>9}"))
    return "\n".join(lines)
