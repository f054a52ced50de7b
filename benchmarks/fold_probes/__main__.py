"""python -m benchmarks.fold_probes [--write]: every probe model (benchmarks.fold_probes) traced by default and with
the fold asked for (fold_own_code), each compared with its full trace event for event."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks.fold_identity import canonical_events
from engine.config.train_config import TrainConfig
from engine.trace.tracer import trace_model
from tests.test_fold_declines import _Src

from . import PROBES

RESULTS = Path(__file__).resolve().parent.parent / "RESULTS.md"
BEGIN, END = "<!-- fold-probes:begin -->", "<!-- fold-probes:end -->"


def models() -> list[tuple[str, type]]:
    """(file:name, class) of every probe model."""
    out = []
    for mod_name, names in PROBES.items():
        mod = importlib.import_module(f"benchmarks.fold_probes.{mod_name}")
        for name in names or sorted(n for n in vars(mod) if n.startswith("M_")):
            out.append((f"{mod_name}:{name}", getattr(mod, name)))
    return out


def outcome(model: type, own: bool) -> tuple[str, str]:
    """("folded exact" | "declined" | "WRONG" | "error", the fold's reason) of the model's step, folded against
    its full trace."""
    cfg = TrainConfig(batch_size=2, optimizer="adamw", device="cpu", fold_own_code=own)
    try:
        folded, finfo = trace_model(_Src(model), cfg)
        full, info = trace_model(_Src(model), cfg.with_(full_trace=True))
    except Exception as e:  # noqa: BLE001 - a probe's own error is reported, not raised
        return "error", f"{type(e).__name__}: {e}"
    assert finfo.fold is not None
    same = canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    if not finfo.fold.folded:
        return ("declined" if same else "declined, NOT the same"), finfo.fold.reason
    return ("folded exact" if same else "WRONG"), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    counts: dict[tuple[bool, str], int] = {}
    t0 = time.perf_counter()
    probes = models()
    for label, model in probes:
        row = []
        for own in (False, True):
            kind, why = outcome(model, own)
            counts[own, kind] = counts.get((own, kind), 0) + 1
            row.append(kind if kind != "declined" or own else f"{kind} ({why[:70]}…)")
        print(f"{label:32} default: {row[0]:90} | fold_own_code: {row[1]}", flush=True)
    seconds = time.perf_counter() - t0
    kinds = ["folded exact", "declined", "WRONG", "declined, NOT the same", "error"]
    table = ["| step | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for own, label in ((False, "default (the user's own code traced in full)"), (True, "fold_own_code=True")):
        table.append(f"| {label} | " + " | ".join(str(counts.get((own, k), 0)) for k in kinds) + " |")
    print("\n".join(table))
    if args.write:
        text = RESULTS.read_text()
        block = "\n".join([BEGIN, "### The fold probes: the user's own code (issue 24)", "",
                           f"Command: `python -m benchmarks.fold_probes --write`. {time.strftime('%Y-%m-%d')}, "
                           f"{platform.machine()}, torch {torch.__version__}; {len(probes)} models "
                           f"(benchmarks/fold_probes), CPU target, AdamW, batch 2, {seconds:.0f} s.", "",
                           *table, END])
        if BEGIN in text:
            text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
