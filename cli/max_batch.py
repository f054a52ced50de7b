"""`max-batch MODEL --budget GIB [options]`: the largest batch whose estimated peak fits a memory budget."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from engine.core.errors import UserError
from engine.core.limits import MAX_BYTES
from engine.core.units import GIB, format_bytes

from .common import add_model_options, config_from_args, print_json, source_from_args

if TYPE_CHECKING:
    from engine.config.train_config import TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_budget_options(p)


def add_budget_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=float, default=None, metavar="GIB",
                   help="memory budget in GiB (default with --gpu: the GPU's usable memory, against nvidia-smi)")
    p.add_argument(
        "--figure",
        default=None,
        choices=("peak", "reserved", "nvidia_smi"),
        help="what must fit: live tensors (default), PyTorch's reserved memory, or nvidia-smi's used memory",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def budget_and_figure(args: argparse.Namespace, cfg: TrainConfig, where: str) -> tuple[int, str]:
    """The budget in bytes and the figure compared with it: --budget against the peak by default, or the --gpu's
    usable memory against nvidia-smi's figure."""
    figure = args.figure or "peak"
    if args.budget is None:
        spec = cfg.gpu_spec
        if spec is None:
            raise UserError("give a memory budget (--budget GIB) or a target GPU (--gpu NAME)", where=where)
        return spec.usable_bytes, args.figure or "nvidia_smi"
    if not math.isfinite(args.budget) or args.budget <= 0:
        raise UserError(f"the budget must be a positive number of GiB, got {args.budget}", where="--budget")
    if args.budget * GIB > MAX_BYTES:
        raise UserError(f"the budget {args.budget:g} GiB is too large (at most {MAX_BYTES // GIB:,} GiB)",
                        where="--budget")
    return int(args.budget * GIB), figure


def run(args: argparse.Namespace) -> int:
    from engine.planning.planner import max_batch

    cfg = config_from_args(args)
    budget, figure = budget_and_figure(args, cfg, "max-batch")
    args.figure = figure
    r = max_batch(source_from_args(args), cfg, budget, figure=figure)
    if args.json:
        out = {"batch_size": r.batch_size, "peak_bytes": r.peak_bytes}
        out.update({k: v for k, v in r.to_json().items() if k not in out})
        print_json(out)
        return 0
    what = {"peak": "peak", "reserved": "reserved", "nvidia_smi": "nvidia-smi used"}[args.figure]
    print(f"Largest batch  {r.batch_size}  ({what} {format_bytes(r.peak_bytes)} of a {format_bytes(budget)} budget)")
    if r.peak_next is not None:
        print(f"Batch {r.batch_size + 1:<8} {format_bytes(r.peak_next)} (over the budget)")
    else:
        print("stopped at the largest batch size searched; the budget may allow more")
    print(f"Traces run     {r.traces_run}: " + ", ".join(str(b) for b, _ in r.tried))
    return 0
