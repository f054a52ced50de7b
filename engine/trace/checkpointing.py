"""Activation checkpointing of a model's repeated blocks (the children of containers of same-type modules).

A Hugging Face model is checkpointed as its users do it, with transformers' own `gradient_checkpointing_enable`
(non-reentrant): its layers then run without the KV cache in training (a cache a checkpointed layer wrote would be
written again by the backward's recompute, and a sliding-window cache would no longer match its mask). Any other
model gets each repeated block's forward wrapped in `torch.utils.checkpoint` (non-reentrant)."""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.library_noise import quiet_libraries


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


def _hugging_face_layers(model: nn.Module) -> list[str] | None:
    """A Hugging Face model (or one inside an adapter wrapper) checkpointed by transformers' own switch: the names of
    its checkpointed layers. None when `model` holds none, or transformers is too old to checkpoint per layer."""
    if "transformers" not in sys.modules:  # nothing built from transformers
        return None
    from transformers import PreTrainedModel

    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # before transformers checkpointed layer by layer: wrapped like any model's blocks
        return None
    hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel) and m.supports_gradient_checkpointing),
              None)
    if hf is None:
        return None
    quiet_libraries()
    kwargs = {"use_reentrant": False}
    if hasattr(PreTrainedModel, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # transformers ≥ 5.24's name
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[no-untyped-call]  # untyped in transformers
    return [name for name, m in model.named_modules()
            if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def apply_checkpointing(model: nn.Module) -> list[str]:
    """Checkpoint the model's repeated blocks (non-reentrant); returns the checkpointed blocks' names."""
    layers = _hugging_face_layers(model)
    if layers:
        return layers
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
