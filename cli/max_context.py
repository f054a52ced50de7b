"""`max-context MODEL --budget GIB [options]`: the longest context that fits a memory budget — the prompt plus
--new-tokens with --mode generate, else the sequence length of a training step or inference pass."""

from __future__ import annotations

import argparse

from engine.core.units import format_bytes

from .common import add_model_options, config_from_args, print_json, source_from_args
from .max_batch import add_budget_options, budget_and_figure


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_budget_options(p)


def run(args: argparse.Namespace) -> int:
    from engine.models.hf_source import HFConfigSource  # loads torch: when the command runs, not at start-up
    from engine.planning.planner import max_context

    cfg = config_from_args(args)
    budget, figure = budget_and_figure(args, cfg, "max-context")
    source = source_from_args(args)
    limit = source.context_limit() if isinstance(source, HFConfigSource) else None
    r = max_context(source, cfg, budget, figure=figure, limit=limit)
    if args.json:
        print_json(r.to_json())
        return 0
    what = {"peak": "peak", "reserved": "reserved", "nvidia_smi": "nvidia-smi used"}[figure]
    if cfg.generating:
        print(f"Longest context  {r.context_tokens:,} tokens: a prompt of {r.length:,} + {r.new_tokens:,} new tokens "
              f"({what} {format_bytes(r.peak_bytes)} of a {format_bytes(budget)} budget, batch {cfg.batch_size})")
    else:
        print(f"Longest sequence {r.length:,} tokens ({what} {format_bytes(r.peak_bytes)} of a "
              f"{format_bytes(budget)} budget, batch {cfg.batch_size}, {cfg.mode})")
    if r.peak_next is not None:
        print(f"One token more   {format_bytes(r.peak_next)} (over the budget)")
    elif r.limit:
        print(f"the model's positions stop at {r.limit:,} tokens: the budget may allow more")
    else:
        print("stopped at the longest length searched; the budget may allow more")
    print(f"Traces run       {r.traces_run}: " + ", ".join(str(b) for b, _ in r.tried))
    return 0
