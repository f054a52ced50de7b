"""The `report` subcommand: estimate MODEL, then write its PDF memory report (and the same content as HTML / JSON).

Headless: Qt runs on the offscreen platform when there is no display.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from engine.core.atomic_write import writes_in_place
from engine.core.errors import UserError
from engine.core.units import format_bytes

from .common import add_model_options, config_from_args, source_from_args
from .terminal import say, shown

if TYPE_CHECKING:  # torch and Qt load when the command runs, not when `vramscope --help` builds its parser
    from engine.config.train_config import TrainConfig
    from engine.models.source import ModelSource
    from engine.planning.planner import MaxBatchResult, Recommendation
    from engine.planning.reuse import TracedStep
    from engine.results.types import Estimate
    from report.content import ReportContent


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.pdf", help="the PDF report to write")
    p.add_argument("--html", metavar="FILE", help="also write the report as a self-contained HTML page")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write the report's figures as JSON")
    p.add_argument("--page", default="a4", choices=("a4", "letter"), help="page size (default a4)")
    p.add_argument(
        "--plan", choices=PLANS, default="quick",
        help="quick (default): the recommendations that need no new forward/backward (another optimizer, "
             "sharding), in seconds; full: every recommendation and the largest batch that fits (several more "
             "traces each); none: no plan",
    )
    p.add_argument("--no-plan", action="store_const", dest="plan", const="none", help="the same as --plan none")


PLANS = ("quick", "full", "none")


def _say(text: str) -> None:
    if sys.stderr.isatty():
        say(text, sys.stderr, flush=True)


def _plan(source: ModelSource, cfg: TrainConfig, est: Estimate, full: bool = True, traced: TracedStep | None = None
          ) -> tuple[list[Recommendation], MaxBatchResult | None, str | None]:
    """Recommendations, and (`full`) the largest batch when a GPU (so a budget) is named, or why none fits; not
    `full`: only the recommendations that need no new forward/backward (`traced`: the step's trace, from which
    another optimizer is answered)."""
    from engine.planning import planner

    _say("planning…" if full else "planning (the quick answers; --plan full for all of them)…")
    recs = planner.recommend(source, cfg, base=est, quick=not full, traced=traced)
    best = None
    spec = cfg.gpu_spec
    if spec is not None and full:  # against what a process can use there, as the verdict, max-batch and the app judge
        _say("finding the largest batch that fits…")
        try:
            best = planner.max_batch(source, cfg, spec.usable_bytes, figure="nvidia_smi")
        except UserError as e:  # not even batch 1 fits: the report says so (it failed the whole report)
            return recs, None, str(e).removeprefix(f"{e.where}: ") if e.where else str(e)
    return recs, best, None


def run(args: argparse.Namespace) -> int:
    from engine.planning.reuse import traced_step
    from report import build_report, ensure_gui_application, export_html, export_json
    from report.saving import check_distinct, check_target

    # Every output is checked before the (possibly long) estimate, so a typo fails at once; two that are one
    # file (by name, through a link) are refused: the second would overwrite the first.
    named = {"-o": args.output, "--html": args.html, "--json": args.json_out}
    checked = {opt: check_target(path) for opt, path in named.items() if path}
    check_distinct(checked)
    outputs = list(checked.values())
    cfg = config_from_args(args)
    # a PDF named x.txt opens as no reader expects (a device or a pipe, -o /dev/stdout, is written as it is)
    if not str(args.output).lower().endswith(".pdf") and not writes_in_place(args.output):
        raise UserError(f"'{str(args.output)[:80]}' does not end in .pdf, and the report written there is a PDF; "
                        "name it .pdf (--html and --json write the other formats)", where="-o")
    source = source_from_args(args)
    ensure_gui_application()

    t0 = time.perf_counter()
    _say(f"estimating {shown(args.model)}…")
    est, step = traced_step(source, cfg)  # per rank when the configuration shards (engine.parallel.sharding)
    recs, best, none_fits = (None, None, None) if args.plan == "none" else \
        _plan(source, cfg, est, full=args.plan == "full", traced=step)
    kwargs: ReportContent = {"recommendations": recs, "max_batch": best.batch_size if best is not None else None,
                             "max_batch_none": none_fits}
    t1 = time.perf_counter()
    build_report(args.output, est, page=args.page, **kwargs)
    if args.html:
        export_html(args.html, est, page=args.page, **kwargs)
    if args.json_out:
        export_json(args.json_out, est, **kwargs)
    t2 = time.perf_counter()
    for path in outputs:
        print(f"wrote {shown(path)} ({format_bytes(path.stat().st_size)})")
    print(
        f"peak {format_bytes(est.peak_bytes)}; estimate {t1 - t0:.1f} s, report {t2 - t1:.1f} s",
        file=sys.stderr,
    )
    return 0
