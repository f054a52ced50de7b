"""`estimate MODEL [options]`: the peak memory of a training step (or inference pass), what it is made of,
when it happens and which module causes it."""

from __future__ import annotations

import argparse

from engine.core.errors import UserError
from engine.core.units import format_bytes
from engine.results.module_groups import fold_modules
from engine.results.types import ALL_CATEGORIES, Estimate, category_name

from .common import (
    add_model_options,
    check_writable,
    config_from_args,
    print_json,
    source_from_args,
    write_json_atomic,
)
from .terminal import say, shown


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, help="modules listed in the summary (0: none)")
    p.add_argument("-o", "--output", default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    from engine.planning.estimator import estimate

    if args.top < 0:
        raise UserError(f"must be 0 or more modules to list, got {args.top}", where="--top")
    cfg = config_from_args(args)
    if args.output is not None:
        check_writable(args.output)
    est = estimate(source_from_args(args), cfg)
    if args.output is not None:
        write_json_atomic(args.output, est.to_json())
    if args.json:
        print_json(est.to_json())
    else:
        say(render_summary(est, top=args.top))
    return 0


def _when(est: Estimate) -> str:
    if est.peak_phase == "prefill":
        return "the prefill"
    if est.peak_phase == "decode":
        return f"decode step {est.peak_step} (token {est.peak_step + 1})"
    return f"step {est.peak_step + 1}, {est.peak_phase}"


def _generation_lines(est: Estimate) -> list[str]:
    g = est.generation
    if g is None:
        return []
    steps = g.decode_steps_traced
    skipped = f"; decode steps {steps[-2] + 1}..{steps[-1] - 1} not traced: the cache grown instead" \
        if len(steps) >= 2 and steps[-1] - steps[-2] > 1 else ""
    return [
        f"Prefill     {format_bytes(g.prefill_peak_bytes)} at its peak (prompt of {g.prompt_len:,} tokens)",
        f"Decode      {format_bytes(g.decode_peak_bytes)} at the last token (context "
        f"{g.prompt_len + g.new_tokens - 1:,} tokens{skipped})",
        f"KV cache    {format_bytes(g.kv_cache_bytes)} at the last token ({g.cache})",
        f"Program     {g.describe_program()}",
    ]


def render_summary(est: Estimate, top: int = 10) -> str:
    c = est.config
    lines = [
        f"Model       {shown(est.model_name)}  ({est.parameters:,} parameters, {est.trainable_parameters:,} trainable)",
        f"Step        {c.mode}, batch {c.batch_size}, {c.precision}"
        + (f", optimizer {c.optimizer}" if c.training else "")
        + (", checkpointing" if c.checkpointing else "")
        + (f", grad-accum {c.grad_accum}" if c.grad_accum > 1 else "")
        + (f", {c.peft} rank {c.lora_rank}" if c.peft else "")
        + (f", {c.weight_format} weights" if c.weight_format else "")
        + (f", {c.new_tokens} new tokens, {c.cache} KV cache" if c.generating else "")
        + f", target {c.device}",
        *([] if c.generating else [f"Program     {c.describe_program()}"]),
        "",
        f"Peak        {format_bytes(est.peak_bytes)}  ({est.peak_bytes:,} bytes of live tensors)",
        f"At          {_when(est)}, module '{shown(est.peak_module or '(top level)')}', op {shown(est.peak_op)}",
        *_generation_lines(est),
        "",
        "Breakdown at the peak",
    ]
    for cat in ALL_CATEGORIES:
        v = est.breakdown_at_peak.get(cat)
        if v:
            lines.append(f"  {category_name(cat, c):<24}{format_bytes(v):>14}  {100 * v / est.peak_bytes:5.1f} %")
    if est.gpu is not None:
        g = est.gpu
        lines += [
            "",
            "On the GPU" + (f" ({shown(g.gpu_name)})" if g.gpu_name else " (no GPU named)"),
            f"  reserved by PyTorch{format_bytes(g.reserved_bytes):>14}  "
            f"(its peak, {g.segments} segments" + (f", at {g.reserved_peak_at})" if g.reserved_peak_at else ")"),
        ]
        if g.reserved_at_live_peak_bytes:
            lines.append(f"  at the live peak   {format_bytes(g.reserved_at_live_peak_bytes):>14}  reserved, "
                         f"{format_bytes(g.cached_free_bytes)} of it cached free blocks"
                         + (f" ({g.live_peak_at})" if g.live_peak_at else ""))
        if g.nvidia_smi_bytes:  # a snapshot does not record what nvidia-smi showed
            lines.append(f"  nvidia-smi used    {format_bytes(g.nvidia_smi_bytes):>14}  (context "
                         f"{format_bytes(g.cuda_context_bytes)}, workspaces {format_bytes(g.workspace_bytes)})")
        if g.breakdown_at_live_peak:
            split_total = sum(g.breakdown_at_live_peak.values())
            lines.append("  nvidia-smi at the live peak, by category")
            for cat in ALL_CATEGORIES:
                v = g.breakdown_at_live_peak.get(cat)
                if v:
                    lines.append(f"    {cat:<18}{format_bytes(v):>12}  {100 * v / split_total:5.1f} %")
        if g.nvidia_smi_high_bytes:
            lines.append(f"  range              {format_bytes(g.nvidia_smi_low_bytes)} – "
                         f"{format_bytes(g.nvidia_smi_high_bytes)}  (measured {format_bytes(g.measured_bytes)}, "
                         f"modelled {format_bytes(g.modelled_bytes)})")
        if g.verdict is not None:
            lines.append(f"  verdict            {g.verdict.upper() if g.verdict == 'does not fit' else g.verdict}: "
                         f"{g.verdict_reason} (margin {format_bytes(g.margin_bytes or 0)})")
        elif g.fits is not None:
            verdict = "fits" if g.fits else "does NOT fit"
            lines.append(f"  verdict            {verdict}, margin {format_bytes(g.margin_bytes or 0)}")
        if g.assumed_gpu:
            lines.append(f"  figures assume     {g.assumed_gpu}")
    groups = fold_modules(est.per_module)[:top]  # blocks a model repeats: one line, 'layers.0–31.mlp ×32'
    if groups:
        scope = " (whole model, before sharding)" if est.sharding is not None else ""
        width = max(40, max(len(shown(grp.label)) for grp in groups) + 2)
        lines += ["", f"Top modules at the peak{scope}",
                  f"  {'module':<{width}}{'type':<22}{'params':>16}{'at peak':>14}{'share':>8}"]
        for grp in groups:
            lines.append(
                f"  {shown(grp.label):<{width}}{shown(grp.type):<22}{grp.parameters:>16,}"
                f"{format_bytes(grp.bytes_at_peak):>14}"
                f"{100 * grp.share_of_peak:7.1f}%"
            )
    for n in est.notes:
        lines.append(f"note: {shown(n)}")
    for m in est.modelled:
        lines.append(f"modelled: {shown(m)}")
    return "\n".join(lines)
