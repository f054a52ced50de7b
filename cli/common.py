"""Options shared by every command that takes a MODEL, and their translation into engine objects."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine.atomic_write import replace_atomically
from engine.config import MODES, MOE_ROUTINGS, OPTIMIZERS, PRECISIONS, STRATEGIES, TrainConfig
from engine.errors import UserError


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="template or catalogue name (llama-3.1-8b), sketch .json, Hugging Face config.json (or its "
                        "folder), or path/to/file.py:function")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--optimizer", default="adam", help="|".join(OPTIMIZERS))
    p.add_argument("--precision", default="fp32", help="|".join(PRECISIONS))
    p.add_argument("--mode", default="train", help="|".join(MODES))
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of repeated blocks")
    p.add_argument("--grad-accum", type=int, default=1, metavar="K")
    p.add_argument("--device", default="cuda", help="target whose kernels and defaults are modelled: cuda|cpu")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length of text models")
    p.add_argument("--image-size", type=int, default=None, help="resolution of vision models")
    p.add_argument("--fused", action="store_true", help="fused optimizer kernels")
    p.add_argument("--gpu", default=None, help="target GPU from the catalogue, e.g. 'A100 80GB'")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--strategy", default="ddp", help="|".join(STRATEGIES))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--moe-routing", default="balanced",
                   help="mixture-of-experts routing: " + "|".join(MOE_ROUTINGS) + " (worst: every token to the same "
                        "experts)")
    p.add_argument(
        "--alloc-conf", default=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), help="PYTORCH_CUDA_ALLOC_CONF to model"
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The options add_model_options defines are named as TrainConfig's fields."""
    return TrainConfig.from_options(vars(args))


def source_from_args(args: argparse.Namespace):
    from engine.sources import resolve_source

    return resolve_source(args.model)


def check_writable(path: str | Path) -> Path:
    """Fail early, before minutes of work, when an output path cannot be written."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write '{p}': folder '{parent}' does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"cannot write '{p}': permission denied")
    return p


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def write_json_atomic(path: str | Path, obj) -> None:
    p = check_writable(path)
    try:
        replace_atomically(p, json.dumps(obj, indent=2))
    except OSError as e:
        raise UserError(f"cannot write '{p}': {e.strerror or e}") from None
