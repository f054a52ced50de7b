"""`make bench`: the whole validation zoo, estimate (--device cpu) against the real step measured by the profiler.

Writes the table to benchmarks/RESULTS.md (replacing the previous zoo section) with date, machine and torch.
    python -m benchmarks.zoo [--only SUBSTRING] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.core.units import format_bytes
from engine.measure.cpu_profiler import measure_cpu
from engine.planning.estimator import estimate

from .zoo_models import ZOO

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def run_case(case) -> dict:
    src = case.source()
    t0 = time.perf_counter()
    est = estimate(src, case.cfg)
    t_est = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    _trace, _info, truth = measure_cpu(src, case.cfg)
    t_real = time.perf_counter() - t0
    gc.collect()
    return {
        "label": case.label,
        "params": est.parameters,
        "estimate": est.peak_bytes,
        "measured": truth,
        "error_pct": 100.0 * (est.peak_bytes - truth) / truth,
        "t_est": t_est,
        "t_real": t_real,
        "phase": f"step {est.peak_step + 1} {est.peak_phase}",
    }


def table(rows: list[dict]) -> str:
    errs = [abs(r["error_pct"]) for r in rows]
    head = [
        f"Zoo: {len(rows)} cases, estimate `--device cpu` against the real step on this CPU (PyTorch profiler, "
        f"all CPU allocator events over the same two steps).",
        f"Date {dt.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} cores "
        f"(torch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}; times are wall-clock on shared cores.",
        f"**Median |error| {statistics.median(errs):.3f} %, max |error| {max(errs):.3f} %.**",
        "The data-dependent case is estimated by the tracer's fallback, a real run on the CPU (fake tensors cannot "
        "size the output of a boolean mask), so it agrees by construction; every other case is traced on fake "
        "tensors.",
        "",
        "| case | parameters | estimated peak | measured peak | error | peak at | estimate time | real run |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        head.append(
            f"| {r['label']} | {r['params']:,} | {format_bytes(r['estimate'])} ({r['estimate']:,} B) | "
            f"{format_bytes(r['measured'])} ({r['measured']:,} B) | {r['error_pct']:+.3f} % | {r['phase']} | "
            f"{r['t_est']:.1f} s | {r['t_real']:.1f} s |"
        )
    return "\n".join(head)


def write_results(text: str) -> None:
    old = RESULTS.read_text() if RESULTS.exists() else "# Measured figures\n"
    block = f"{BEGIN}\n## Validation zoo (CPU)\n\nCommand: `make bench` (`python -m benchmarks.zoo`).\n\n{text}\n{END}"
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(new)
    os.replace(tmp, RESULTS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for case in ZOO:
        if a.only and a.only not in case.label:
            continue
        r = run_case(case)
        print(f"{r['label']:<45} est {r['estimate']:>13,}  real {r['measured']:>13,}  {r['error_pct']:+7.3f} %  "
              f"({r['t_est']:.1f} s / {r['t_real']:.1f} s)", flush=True)
        rows.append(r)
    text = table(rows)
    print(text)
    if not a.no_write and not a.only:
        write_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
