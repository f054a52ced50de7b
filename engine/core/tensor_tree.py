"""Mapping a function over the tensors of a model's inputs or outputs: a tensor, or dicts, tuples and lists of
them, nested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`x` (a tensor, or a dict/tuple/list of them, nested) with `fn` applied to each tensor in order; anything else
    is kept as it is."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(map_tensors(v, fn) for v in x)
    return x
