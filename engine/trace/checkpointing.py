"""Activation checkpointing of a model's repeated blocks (the children of containers of same-type modules)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def repeated_blocks(model: nn.Module, min_repeats: int = 2) -> list[tuple[str, nn.Module]]:
    """Children of ModuleList/Sequential containers holding ≥ min_repeats modules of one type.

    Outermost containers win: blocks inside an already chosen block are not returned. A model may name its
    own blocks with a `checkpoint_blocks()` method (a builder sketch's module does).
    """
    own = getattr(model, "checkpoint_blocks", None)
    if callable(own):
        return list(own())
    chosen: list[tuple[str, nn.Module]] = []
    taken: list[str] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        if any(name == t or name.startswith(t + ".") for t in taken):
            continue
        kids = list(mod.named_children())
        if len(kids) < min_repeats:
            continue
        types = {type(k) for _, k in kids}
        if len(types) != 1 or not any(True for _ in next(iter(kids))[1].parameters()):
            continue
        for kname, kid in kids:
            full = f"{name}.{kname}" if name else kname
            chosen.append((full, kid))
            taken.append(full)
    return chosen


def apply_checkpointing(model: nn.Module) -> list[str]:
    """Wrap each repeated block's forward in non-reentrant checkpointing; returns the wrapped names."""
    names = []
    for name, block in repeated_blocks(model):
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward
        names.append(name)
    return names
