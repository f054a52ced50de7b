"""Options shared by every command that takes a MODEL, and their translation into engine objects."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config.train_config import (
    CACHES,
    GENERATE_PROGRAMS,
    MODES,
    MOE_ROUTINGS,
    OPTIMIZERS,
    PEFT_METHODS,
    PRECISIONS,
    STRATEGIES,
    WEIGHT_FORMATS,
    TrainConfig,
)
from engine.core.atomic_write import name_too_long, replace_atomically, target_of, writes_in_place
from engine.core.errors import UserError

if TYPE_CHECKING:  # the engine's sources load torch: imported when a command runs, not when its parser is built
    from engine.models.source import ModelSource


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="template or catalogue name (llama-3.1-8b), sketch .json, Hugging Face config.json (or its "
                        "folder), or path/to/file.py:function")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--optimizer", default=None, help="|".join(OPTIMIZERS) + " (default adam)")
    p.add_argument("--precision", default="fp32", help="|".join(PRECISIONS))
    p.add_argument("--mode", default="train", help="|".join(MODES))
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of repeated blocks")
    p.add_argument("--grad-accum", type=int, default=None, metavar="K", help="micro-batches per optimizer step")
    p.add_argument("--device", default="cuda", help="target whose kernels and defaults are modelled: cuda|cpu")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length of text models")
    p.add_argument("--image-size", type=int, default=None, help="resolution of vision models")
    p.add_argument("--fused", action="store_true", help="fused optimizer kernels")
    p.add_argument("--gpu", default=None, help="target GPU from the catalogue, e.g. 'A100 80GB'")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--strategy", default="ddp", help="|".join(STRATEGIES))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--prompt-len", type=int, default=None, metavar="P",
                   help="--mode generate: prompt tokens (default: --seq-len, else the model's default)")
    # None when not given (TrainConfig's defaults: 128 tokens, a dynamic cache), so that one given outside
    # --mode generate is refused rather than silently ignored
    p.add_argument("--new-tokens", type=int, default=None, metavar="N",
                   help="--mode generate: tokens generated (default 128)")
    p.add_argument("--cache", default=None,
                   help="--mode generate: KV cache, " + "|".join(CACHES) + " (default dynamic)")
    p.add_argument("--generate-program", default=None,
                   help="--mode generate: " + "|".join(GENERATE_PROGRAMS) + " (default generate: model.generate(); "
                        "loop: your own prefill-then-decode loop)")
    p.add_argument("--do-sample", action="store_true", default=None,
                   help="--mode generate: generate() samples (default greedy)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="--do-sample: keep the K likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="--do-sample: nucleus of probability P")
    p.add_argument("--moe-routing", default="balanced",
                   help="mixture-of-experts routing: " + "|".join(MOE_ROUTINGS) + " (worst: every token to the same "
                        "experts)")
    p.add_argument("--peft", default=None, help="|".join(PEFT_METHODS) + ": train low-rank adapters on a frozen base "
                   "(qlora: 4-bit NF4 base)")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R", help="default 16")  # None: see --peft
    p.add_argument("--lora-alpha", type=int, default=None, metavar="A", help="default: twice the rank")
    p.add_argument("--lora-targets", default=None, metavar="NAMES",
                   help="comma-separated Linear names (q_proj,v_proj) or all-linear; default: the model's usual ones")
    p.add_argument("--compile", action="store_true", default=None,
                   help="the step as torch.compile(model) runs it (inductor, default mode); the optimizer eager")
    p.add_argument("--compile-mode", default=None, metavar="MODE",
                   help="torch.compile's mode: only default is modelled (reduce-overhead, max-autotune refused)")
    p.add_argument("--weights", default=None, help="|".join(WEIGHT_FORMATS) + ": quantized frozen Linear weights")
    p.add_argument(
        "--alloc-conf", default=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), help="PYTORCH_CUDA_ALLOC_CONF to model"
    )
    p.add_argument("--full-trace", action="store_true", default=None,
                   help="trace every block of a stack of identical blocks (default: trace four and write out the "
                        "rest, the same figures)")
    p.add_argument("--fold-own-code", action="store_true", default=None,
                   help="fold a stack of your own code's blocks too (default: only a known library's code, e.g. "
                        "transformers, is folded; your own is traced in full, exact): checked, not proven")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The options add_model_options defines are named as TrainConfig's fields; one left out (None) keeps the
    field's default."""
    check_conflicts(args)
    check_lora_options(args)
    options = {k: v for k, v in vars(args).items() if v is not None}
    if "compile_mode" in options:  # --compile --compile-mode MODE: TrainConfig takes the mode (refused unless default)
        options["compile"] = options.pop("compile_mode")
    return TrainConfig.from_options(options)


def check_lora_options(args: argparse.Namespace) -> None:
    """--lora-targets names layers, or says nothing: blank, or without --peft (nothing would read it), is refused;
    so are --lora-rank and --lora-alpha without --peft."""
    if getattr(args, "peft", None) is None:
        given = [opt for opt, dest in (("--lora-rank", "lora_rank"), ("--lora-alpha", "lora_alpha"))
                 if getattr(args, dest, None) is not None]
        if given:
            raise UserError("sets the LoRA adapters' size; add --peft lora (or qlora)", where=given[0])
    targets = getattr(args, "lora_targets", None)
    if targets is None:
        return
    if not [t for t in targets.split(",") if t.strip()]:
        raise UserError(f"{targets!r} names no layer; give Linear names (q_proj,v_proj) or all-linear, or leave "
                        "it out for the model's usual ones", where="--lora-targets")
    if getattr(args, "peft", None) is None:
        raise UserError("chooses where LoRA adapters go; add --peft lora (or qlora)", where="--lora-targets")


def check_conflicts(args: argparse.Namespace) -> None:
    """Options that contradict each other, or say nothing, are refused rather than silently dropped."""
    if args.mode is not None and args.mode != "train":
        # What a step outside training has none of may be said (scripts pass the whole configuration):
        # --optimizer none and --grad-accum 1 agree with inference; only a real optimizer or accumulation conflicts.
        given = [opt for opt, on in (("--optimizer", args.optimizer not in (None, "none")),
                                     ("--grad-accum", args.grad_accum not in (None, 1)),
                                     ("--checkpointing", args.checkpointing),
                                     ("--fused", args.fused)) if on]
        if given:
            many = len(given) > 1
            raise UserError(f"{', '.join(given)} only appl{'y' if many else 'ies'} to training; drop "
                            f"{'them' if many else 'it'} or use --mode train", where=f"--mode {args.mode}")
    if getattr(args, "compile_mode", None) is not None and not getattr(args, "compile", None):
        raise UserError("chooses torch.compile's mode; add --compile", where="--compile-mode")
    generation_only = [opt for opt, on in (("--prompt-len", args.prompt_len is not None),
                                           ("--new-tokens", args.new_tokens is not None),
                                           ("--cache", args.cache is not None),
                                           ("--generate-program", args.generate_program is not None),
                                           ("--do-sample", bool(args.do_sample)),
                                           ("--top-k", args.top_k is not None),
                                           ("--top-p", args.top_p is not None)) if on]
    if generation_only and args.mode != "generate":
        many = len(generation_only) > 1
        raise UserError(f"{', '.join(generation_only)} only appl{'y' if many else 'ies'} to generation; drop "
                        f"{'them' if many else 'it'} or use --mode generate", where=f"--mode {args.mode}")
    if (args.top_k is not None or args.top_p is not None) and not args.do_sample:
        raise UserError("--top-k and --top-p shape sampling; add --do-sample (generate() is greedy without it)",
                        where="--top-k" if args.top_k is not None else "--top-p")
    if args.fused and args.optimizer == "none":
        raise UserError("--fused needs an optimizer to fuse; drop --fused or choose one (adam, adamw, sgd, …)",
                        where="--optimizer none")
    if args.gpu is not None and not args.gpu.strip():
        raise UserError("is empty; name a GPU from the catalogue, e.g. --gpu 'A100 80GB'", where="--gpu")
    if args.gpu is not None and args.device == "cpu":
        raise UserError(f"--gpu '{args.gpu}' asks for a GPU verdict, which a CPU target has none of; use "
                        "--device cuda (the default) or drop --gpu", where="--device cpu")
    for opt, value in (("-o", getattr(args, "output", None)), ("--html", getattr(args, "html", None)),
                       ("--json", getattr(args, "json_out", None)), ("--csv", getattr(args, "csv", None)),
                       ("--jsonl", getattr(args, "jsonl", None))):
        if value is not None and not str(value).strip():
            raise UserError("is an empty file name; give a path", where=opt)
        if value == "-":  # not standard output here: it wrote a file named '-'
            raise UserError("'-' would write a file named '-'; give a file name, or /dev/stdout for standard "
                            "output", where=opt)


def source_from_args(args: argparse.Namespace) -> ModelSource:
    from engine.models.sources import resolve_source

    return resolve_source(args.model)


def check_writable(path: str | Path) -> Path:
    """Fail early, before minutes of work, when an output path cannot be written."""
    too_long = name_too_long(path)
    if too_long:
        raise UserError(too_long)
    try:
        return _check_writable(path)
    except OSError as e:  # a path the system refuses to look at (too long, a loop of links)
        raise UserError(f"cannot write '{str(path)[:80]}': {e.strerror or e}") from None


def _check_writable(path: str | Path) -> Path:
    if writes_in_place(path):  # a device or a pipe: written directly
        if not os.access(path, os.W_OK):
            raise UserError(f"cannot write '{path}': permission denied")
        return Path(path)
    p = target_of(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write '{p}': folder '{parent}' does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"cannot write '{p}': permission denied")
    return p


def print_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def write_json_atomic(path: str | Path, obj: object) -> None:
    p = check_writable(path)
    try:
        replace_atomically(p, json.dumps(obj, indent=2))
    except OSError as e:
        raise UserError(f"cannot write '{p}': {e.strerror or e}") from None
