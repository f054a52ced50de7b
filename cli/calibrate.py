"""`calibrate [MODEL options] [--gpu-index N]`: measure this machine's GPU (context, library workspaces and, for a
model, each kernel shape's real workspace) and keep the profile that later estimates for that GPU use.

Also: `--list` the profiles, `--export GPU FILE`, `--import FILE` (a profile made on another machine), and
`--from-ops FILE` (learn one from records of ../shared/gpu/record_ops.py, on any machine)."""

from __future__ import annotations

import argparse
import math
import sys

from engine.core.errors import UserError
from engine.core.progress import Progress
from engine.core.units import format_bytes

from .common import add_model_options, check_writable, config_from_args, print_json, source_from_args
from .terminal import shown


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    # the model is optional here: without one only the context and library workspaces are measured
    for a in p._actions:
        if a.dest == "model":
            a.nargs = "?"
            a.default = None
            a.help = "optional: also measure this model's kernels (template, sketch .json or file.py:function)"
    p.add_argument("--gpu-index", type=int, default=0, metavar="N", help="which of this machine's GPUs (default 0)")
    p.add_argument("--list", action="store_true", help="list the calibration profiles found")
    p.add_argument("--export", nargs=2, metavar=("GPU", "FILE"), help="write GPU's profile to FILE")
    p.add_argument("--import", dest="import_file", metavar="FILE", help="keep a profile made on another machine")
    p.add_argument("--from-ops", metavar="FILE", help="learn a profile from record_ops.py records (.jsonl[.gz])")
    p.add_argument("--context-mib", type=float, default=None, help="with --from-ops: the measured CUDA context")
    p.add_argument("--output", metavar="FILE", default=None, help="write the profile here instead of the data folder")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.cuda import gpu_profile as gp
    from engine.measure.calibrate import calibrate, describe

    if args.list:
        found = gp.list_profiles()
        if args.json:
            print_json([{"where": w, **describe(p)} for w, p in found])
            return 0
        print(f"user profiles: {shown(gp.profiles_dir())}")
        for where, p in found:
            print(f"  [{where}] {shown(gp.profile_summary(p))}  ({shown(p.path)})")
        if not found:
            print("  none")
        for why in gp.skipped_profiles():  # a broken file costs only itself
            print(f"  [skipped] {shown(why)}", file=sys.stderr)
        return 0
    if args.export:
        gpu, path = args.export
        check_writable(path)  # as every output: a missing folder is refused, not made
        out = gp.export_profile(gpu, path)
        print(f"wrote {shown(out)}")
        return 0
    if args.import_file:
        out = gp.import_profile(args.import_file)
        prof = gp.load_profile(out)
        print(f"kept {shown(gp.profile_summary(prof))} in {shown(out)}")
        return 0
    if args.from_ops:
        rows = gp.read_ops(args.from_ops)
        mib = args.context_mib
        if mib is not None and not (math.isfinite(mib) and 0 < mib <= 2**20):
            raise UserError(f"{mib:g}: give the measured context in MiB, above 0 and at most 1,048,576",
                            where="--context-mib")
        ctx = int(mib * 2**20) if mib else None
        prof = gp.profile_from_ops(rows, gpu_name=args.gpu, context_bytes=ctx,
                                   source=f"learned from {args.from_ops} (vramscope calibrate --from-ops)")
        out = gp.save_profile(prof, args.output)
        print(f"kept {shown(gp.profile_summary(prof))} in {shown(out)}")
        return 0

    source = source_from_args(args) if args.model else None
    cfg = config_from_args(args) if args.model else None
    prof = calibrate(args.gpu_index, source, cfg, progress=_progress(args.json))
    out = gp.save_profile(prof, args.output)
    if args.json:
        print_json({**describe(prof), "path": str(out)})
        return 0
    print(f"Calibrated {shown(gp.profile_summary(prof))}")
    if prof.context_bytes:
        print(f"  CUDA context (NVML used − reserved): {format_bytes(prof.context_bytes)}")
    if prof.cublas_workspaces:
        print("  cuBLAS workspaces per GEMM thread: " + ", ".join(format_bytes(b) for b in prof.cublas_workspaces))
    print(f"  saved to {shown(out)}; estimates for the {shown(prof.gpu_name)} use it from now on")
    return 0


def _progress(quiet: bool) -> Progress:
    import sys

    def report(frac: float, msg: str) -> None:
        if not quiet:
            print(f"  [{frac:4.0%}] {shown(msg)}", file=sys.stderr)

    return report
