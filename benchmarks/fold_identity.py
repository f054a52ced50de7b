"""Folded against full traces on every template and catalogue model: the same events and every figure.

For each model: the estimate traced folded (the default: engine.trace.folded_trace, folded_optimizer) and with
--full-trace, compared event for event (storages numbered by first appearance, with their categories and owning
modules) and figure for figure (the whole estimate JSON but its timing, the "traced in" note and the fold's own
field). One training step (AdamW, H100 target, batch 1, seq 64, 64-pixel images) and, for the decoder LLMs, a
QLoRA one. Run: `python -m benchmarks.fold_identity [--only NAME,…] [--write]` (--write puts the table into
RESULTS.md). Exit status 1 when any model differs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.planning.estimator import estimate_of_trace  # noqa: E402
from engine.results.types import Estimate, Trace  # noqa: E402
from engine.trace.tracer import trace_model  # noqa: E402

BEGIN, END = "<!-- fold-identity:begin -->", "<!-- fold-identity:end -->"
QLORA = ("llama-3.2-1b", "llama-3.1-8b", "mistral-7b-v0.3", "qwen2.5-7b")


def canonical_events(trace: Trace, owners: dict[int, str]) -> list[tuple[Any, ...]]:
    """The events with storages numbered by first appearance (a folded trace's written-out storages have other
    keys), each with its category and owning module."""
    names: dict[int, int] = {}
    return [(names.setdefault(e.storage, len(names)), e.nbytes, e.category, e.step, e.phase, e.module, e.op,
             owners.get(e.storage)) for e in trace.events]


def comparable_figures(est: Estimate) -> dict[str, Any]:
    """Every figure of an estimate (its JSON), without the timing, the timing note and the fold's own field."""
    j = est.to_json()
    j.pop("elapsed_s", None)
    j["notes"] = [n for n in j["notes"] if not n.startswith("traced in")]
    j["extra"].pop("trace_fold", None)
    j["config"].pop("full_trace", None)
    return j


def compare(name: str, cfg: TrainConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    folded, finfo = trace_model(name, cfg)
    a = estimate_of_trace(folded, finfo, cfg)
    t1 = time.perf_counter()
    full, info = trace_model(name, cfg.with_(full_trace=True))
    b = estimate_of_trace(full, info, cfg)
    t2 = time.perf_counter()
    fold = finfo.fold.to_json() if finfo.fold is not None else {}
    return {"model": name, "folded": bool(fold.get("folded")), "reason": fold.get("reason", ""),
            "blocks": int(fold.get("blocks", 0)), "traced": int(fold.get("traced_blocks", 0)),
            "period": int(fold.get("period", 1)), "events": len(full.events),
            "same_events": canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner),
            "same_figures": json.dumps(comparable_figures(a), sort_keys=True)
            == json.dumps(comparable_figures(b), sort_keys=True),
            "peak": a.peak_bytes, "folded_s": t1 - t0, "full_s": t2 - t1}


def cases(only: set[str] | None) -> list[tuple[str, str, TrainConfig]]:
    from engine.models.hf_source import hf_catalogue
    from engine.models.templates import TEMPLATES

    train = TrainConfig(batch_size=1, seq_len=64, image_size=64, optimizer="adamw", gpu="H100")
    qlora = train.with_(peft="qlora", precision="bf16", optimizer="paged-adamw8bit")
    out = [(n, "AdamW", train) for n in sorted(TEMPLATES)] + [(n, "AdamW", train) for n in sorted(hf_catalogue())]
    out += [(n, "QLoRA", qlora) for n in QLORA]
    return [c for c in out if only is None or c[0] in only]


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | step | events | folded | same events | same figures | folded | full |",
             "|---|---|---:|---|---|---|---:|---:|"]
    for r in rows:
        reason = r["reason"].split("; ")
        period = f", period {r['period']}" if r["period"] > 1 else ""
        folded = f"yes: {r['traced']} of {r['blocks']} blocks traced{period}" if r["folded"] else \
            f"no: {reason[0]}" + (f" (and {len(reason) - 1} more)" if reason[1:] else "")
        same = ["yes" if r[k] else "**NO**" for k in ("same_events", "same_figures")]
        lines.append(f"| {r['model']} | {r['step']} | {r['events']:,} | {folded} | {same[0]} | {same[1]}"
                     f" | {r['folded_s']:.1f} s | {r['full_s']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for name, step, cfg in cases(only):
        r = compare(name, cfg)
        r["step"] = step
        rows.append(r)
        print(f"{name} {step}: folded={r['folded']} events={r['same_events']} figures={r['same_figures']} "
              f"{r['folded_s']:.1f}s/{r['full_s']:.1f}s {r['reason']}", flush=True)
    text = table(rows)
    print(text)
    if args.write:
        results = ROOT / "benchmarks" / "RESULTS.md"
        body = results.read_text()
        head = (f"## Folded and full traces, every template and catalogue model (issue 24)\n\nCommand: "
                f"`python -m benchmarks.fold_identity --write`. {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
                f"torch {torch.__version__}; the seconds are one run each on a shared 2-core machine.\n\n")
        section = f"{BEGIN}\n{head}{text}\n{END}"
        if BEGIN in body:
            body = body[:body.index(BEGIN)] + section + body[body.index(END) + len(END):]
        else:
            body = body.rstrip() + "\n\n" + section + "\n"
        results.write_text(body)
    return 0 if all(r["same_events"] and r["same_figures"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
