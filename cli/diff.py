"""`diff A B [--fail-over PCT]`: two estimates (or snapshots) side by side; with --fail-over, the memory guard a CI
job runs against a baseline kept in the repository (exit 1 when B's peak or reserved grew more than PCT)."""

from __future__ import annotations

import argparse
import math
import sys

from engine.core.errors import UserError

from .common import print_json
from .terminal import say, shown


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the baseline: a JSON file written by `estimate -o` (or --json), a "
                                          "report's .json, or a memory snapshot (.pickle, .pickle.gz)")
    p.add_argument("b", metavar="B", help="the one compared with it, the same kinds of file")
    p.add_argument("--fail-over", type=float, default=None, metavar="PCT",
                   help="exit 1, saying what grew, when B's peak or reserved figure is more than PCT %% above A's")
    p.add_argument("--top", type=int, default=8, help="modules listed that changed most (0: none)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.planning.diff import diff_estimates, load_estimate

    if args.fail_over is not None and (not math.isfinite(args.fail_over) or args.fail_over < 0):
        raise UserError(f"must be 0 or more per cent, got {args.fail_over:g}", where="--fail-over")
    if args.top < 0:
        raise UserError(f"must be 0 or more modules to list, got {args.top}", where="--top")
    d = diff_estimates(load_estimate(args.a), load_estimate(args.b), a_name=args.a, b_name=args.b, top=args.top)
    grew = d.grew(args.fail_over) if args.fail_over is not None else []
    if args.json:
        print_json({**d.to_json(), "fail_over": args.fail_over, "failed": grew})
    else:
        say(d.text())
    for phrase in grew:
        print(f"memory guard: {shown(phrase)}", file=sys.stderr)
    return 1 if grew else 0
