"""`plan MODEL [options] --gpu NAME`: the step's memory on a GPU and ranked changes that make it fit."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.errors import UserError
from engine.core.units import format_bytes

from .common import add_model_options, config_from_args, print_json, source_from_args
from .terminal import say, shown

if TYPE_CHECKING:  # torch loads when the command runs, not when `vramscope --help` builds its parser
    from engine.planning.planner import Recommendation
    from engine.results.types import Estimate


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="trace the candidates that need their own trace in N processes at once (default: one per "
                        "core, at most 8, for a GPU target on Linux, where the processes are forked copies of this "
                        "one; 1 elsewhere)")


def run(args: argparse.Namespace) -> int:
    from engine.parallel.sharding import sharded_estimate
    from engine.planning.planner import recommend
    from engine.planning.pool import default_workers
    from engine.planning.reuse import traced_step

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"must be 1 or more processes, got {args.jobs}", where="--jobs")
    cfg = config_from_args(args)  # an unknown --gpu fails here, before any tracing
    source = source_from_args(args)
    base, step = traced_step(source, cfg)  # the trace kept: optimizer-only changes need only their step traced
    if cfg.world_size > 1 or cfg.tp > 1:
        base = sharded_estimate(base, cfg)
    workers = args.jobs if args.jobs is not None else default_workers(cfg.device)
    recs = recommend(source, cfg, base=base, traced=step, workers=workers, ref=args.model)
    if args.json:
        print_json({"estimate": base.to_json(), "recommendations": [r.to_json() for r in recs]})
        return 0
    say(render_plan(base, recs))
    return 0


def render_plan(base: Estimate, recs: Sequence[Recommendation]) -> str:
    c = base.config
    lines = [
        f"Model       {shown(base.model_name)}  ({base.parameters:,} parameters)",
        f"Step        {c.mode}, batch {c.batch_size}, {c.precision}"
        + (f", optimizer {c.optimizer}" if c.training else "")  # an inference pass runs none, whatever it names
        + (", checkpointing" if c.checkpointing else "")
        + (f", grad-accum {c.grad_accum}" if c.grad_accum > 1 else "")
        + (f", {c.strategy} over {c.world_size} GPUs" if c.world_size > 1 else "")
        + (f", tensor parallel {c.tp}" if c.tp > 1 else ""),
        f"Peak        {format_bytes(base.peak_bytes)} of live tensors"
        + (" per GPU" if c.world_size > 1 else ""),
    ]
    g = base.gpu
    if g is not None:
        lines.append(
            f"GPU         reserved {format_bytes(g.reserved_bytes)}, nvidia-smi {format_bytes(g.nvidia_smi_bytes)}"
            + (f" on {shown(g.gpu_name)} ({format_bytes(g.gpu_total_bytes or 0)})" if g.gpu_name else "")
        )
        if g.fits is not None:
            lines.append(
                f"Verdict     {'fits' if g.fits else 'does NOT fit'}: margin {format_bytes(g.margin_bytes or 0)}"
            )
    if not recs:
        lines += ["", "No change the planner knows lowers this step's peak."]
        return "\n".join(lines)
    lines += ["", f"{'#':>2}  {'change':<52}{'saves':>12}{'new peak':>12}  {'fits':<5} cost"]
    for i, r in enumerate(recs, 1):
        fits = "" if r.fits is None else ("yes" if r.fits else "no")
        lines.append(
            f"{i:>2}  {r.title[:51]:<52}{format_bytes(r.saves_bytes):>12}{format_bytes(r.new_peak_bytes):>12}"
            f"  {fits:<5} {r.cost}"
        )
        lines.append(f"    {r.detail}")
    if any(r.analytic for r in recs):
        lines.append("")
        lines.append("(analytic) figures come from formulas over the parameter shapes, not from a traced step.")
    return "\n".join(lines)
