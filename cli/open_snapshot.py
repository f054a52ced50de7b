"""`open SNAPSHOT [--model MODEL] [options]`: a real run's PyTorch memory snapshot as a VRAMScope result: what was
live, by category, module and phase; at an out-of-memory error, what failed and what would have fit; beside the
estimate of the same step when the model is named."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from engine.config.train_config import MODES, OPTIMIZERS, PRECISIONS
from engine.core.units import format_bytes
from engine.results.types import Estimate

from .common import check_writable, print_json
from .terminal import say, shown

if TYPE_CHECKING:  # torch and Qt load when the command runs, not when `vramscope --help` builds its parser
    from engine.planning.snapshot_fit import Comparison, FitAnswer

# configuration options: None when not given, so what the snapshot shows is kept
_GIVEN = ("batch_size", "optimizer", "precision", "mode", "checkpointing", "grad_accum", "seq_len", "image_size",
          "fused", "alloc_conf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT",
                   help="a torch.cuda.memory._dump_snapshot file (.pickle or .pickle.gz)")
    p.add_argument("--model", default=None, metavar="MODEL",
                   help="the model that ran: template name, sketch .json or path/to/file.py:function; adds the "
                        "estimate beside the snapshot (and, after an out-of-memory error, what would have fit)")
    p.add_argument("--batch-size", type=int, default=None, help="default: read from the snapshot's inputs")
    p.add_argument("--optimizer", default=None, help="|".join(OPTIMIZERS) + " (default: from the snapshot)")
    p.add_argument("--precision", default=None, help="|".join(PRECISIONS) + " (default: from the snapshot)")
    p.add_argument("--mode", default=None, help="|".join(MODES))
    p.add_argument("--checkpointing", action="store_const", const=True, default=None)
    p.add_argument("--grad-accum", type=int, default=None, metavar="K")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--fused", action="store_const", const=True, default=None)
    p.add_argument("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF the run used (default: the snapshot's)")
    p.add_argument("--no-plan", action="store_true", help="after an out-of-memory error, skip 'what would have fit'")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, help="modules listed in the summary")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write the findings as a report: FILE.pdf, FILE.html or FILE.json")


def _say(text: str) -> None:
    if sys.stderr.isatty():
        say(text, sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from engine.core.errors import UserError
    from engine.snapshots.reader import open_snapshot

    if args.top < 0:
        raise UserError(f"must be 0 or more modules to list, got {args.top}", where="--top")
    if args.output:
        check_writable(args.output)
        if not args.output.lower().endswith((".pdf", ".html", ".htm", ".json")):
            raise UserError(f"-o {args.output}: give a .pdf, .html or .json file")
    _say(f"reading {shown(args.snapshot)}…")
    snap = open_snapshot(args.snapshot)
    est: Estimate | None = None
    comparison: Comparison | None = None
    fit: FitAnswer | None = None
    if args.model:
        from engine.models.sources import resolve_source
        from engine.planning.snapshot_fit import beside, what_fits

        source = resolve_source(args.model)
        _say(f"estimating {shown(args.model)} in the configuration the snapshot shows…")
        found = beside(snap, source, {k: getattr(args, k) for k in _GIVEN})
        snap, cfg, comparison, est = found.snapshot, found.config, found.comparison, found.comparison.estimate
        if found.mismatch:
            print(f"warning: --model {shown(args.model)}: {shown(found.mismatch)}; name the model that ran",
                  file=sys.stderr)
        if snap.oom is not None and not args.no_plan:
            _say("planning what would have fit…")
            fit = what_fits(snap, source, cfg, est)
    if args.output:
        _write_report(args.output, snap, est, fit)
    if args.json:
        out: dict[str, Any] = {"snapshot": snap.to_json()}
        if est is not None:
            out["estimate"] = est.to_json()
        if comparison is not None:
            out["comparison"] = comparison.to_json()
        if fit is not None:
            out["what_fits"] = fit.to_json()
        print_json(out)
    else:
        say(render(snap, top=args.top))
        if comparison is not None:
            from .profile import render_comparison

            print()
            print("The estimate of the same step beside the snapshot (error = estimate − snapshot)")
            say(render_comparison(comparison.rows))
        if fit is not None and est is not None:  # what fits is planned from the estimate
            from engine.planning.snapshot_fit import render_fit

            print()
            say(render_fit(fit, est.config))
        if args.output:
            print(f"wrote {shown(args.output)}")
    return 0


def render(snap: Estimate, top: int = 10) -> str:
    from .estimate import render_summary

    s = snap.snapshot
    assert s is not None  # engine.snapshots.reader.open_snapshot's
    seg = s.segments
    c = snap.config
    body = render_summary(snap, top=top).splitlines()
    if not snap.parameters:  # no model named: the summary's model and step lines would show placeholders
        body = [ln for ln in body if not ln.startswith(("Model ", "Step "))]
        body.insert(0, f"Step        {c.mode}, {c.precision}" + (f", optimizer {c.optimizer}" if c.training else "")
                    + (", checkpointing" if c.checkpointing else "") + " (as the snapshot's frames show; see notes)")
    lines = [f"Snapshot    {shown(s.path or snap.model_name)}: {s.events:,} events on GPU {s.device}, "
             f"{s.allocations:,} allocations",
             *body,
             "",
             f"Segments at the dump: {seg.count} ({seg.large} large, {seg.small} small), "
             f"{format_bytes(seg.reserved_bytes)} reserved, {format_bytes(seg.free_bytes)} free inside them "
             f"(largest free block {format_bytes(seg.largest_free_block)})"
             + (", expandable segments" if seg.expandable_segments else "")]
    oom = snap.oom
    if oom is not None:
        lines += ["", "OUT OF MEMORY", f"  {shown(oom.message)}", "  live at that moment:"]
        for cat, v in sorted(oom.live_by_category.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {cat:<18}{format_bytes(v):>14}")
        if oom.stack:
            lines.append("  stack (innermost first):")
            lines += [f"    {shown(f)}" for f in oom.stack[:12]]
    return "\n".join(lines)


def _write_report(path: str, snap: Estimate, est: Estimate | None, fit: FitAnswer | None) -> None:
    from engine.planning.planner import Recommendation
    from report import (
        build_report,
        ensure_gui_application,
        export_html,
        export_json,
    )
    from report.content import ReportContent

    kwargs: ReportContent = {}
    if fit is not None:  # each change's figure is the reserve it would have needed, against the failed job's
        kwargs["recommendations"] = [
            Recommendation(title=t + (" — fits" if fits else " — still too big"), detail=d, saves_bytes=s,
                           new_peak_bytes=r, cost=c, fits=fits) for (t, d, s, r, fits, c) in fit.changes]
        kwargs["max_batch"] = fit.max_batch
    if est is not None:
        kwargs["measured"] = snap
    main = est if est is not None else snap
    low = path.lower()
    if low.endswith(".json"):
        export_json(path, main, **kwargs)
        return
    ensure_gui_application()
    if low.endswith((".html", ".htm")):
        export_html(path, main, **kwargs)
    else:
        build_report(path, main, **kwargs)
