"""Example inputs of the templates (random images, random token ids) and the checks of their sizes.

Tensors are made with factory calls on the current default device, so inside `with torch.device("meta"):`
they cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ...core.errors import UserError

# (batch_size, seq_len, image_size) -> (model, inputs); inputs: a tensor, a tuple (model(*x)) or a dict (model(**x)).
BuildFn = Callable[[int, int | None, int | None], tuple[nn.Module, Any]]


def check_image_size(template: str, image_size: int | None, *, default: int, minimum: int, multiple: int = 1) -> int:
    size = default if image_size is None else image_size
    if not isinstance(size, int) or size < minimum or size % multiple:
        rule = f"at least {minimum}" + (f" and a multiple of {multiple}" if multiple > 1 else "")
        raise UserError(f"image size {size} does not fit template '{template}': it must be {rule}")
    return size


def check_seq_len(template: str, seq_len: int | None, *, default: int, maximum: int | None = None) -> int:
    n = default if seq_len is None else seq_len
    if not isinstance(n, int) or n < 1 or (maximum is not None and n > maximum):
        limit = f" between 1 and {maximum}" if maximum is not None else " at least 1"
        raise UserError(f"sequence length {n} does not fit template '{template}': it must be{limit}")
    return n


def tensor(x: object) -> torch.Tensor:
    """A submodule's output as the Tensor it is (nn.Module.__call__ is typed as returning Any). The templates'
    forwards keep their line numbers: a recorded snapshot names its call sites by them."""
    return cast(torch.Tensor, x)


def images(batch_size: int, channels: int, size: int) -> torch.Tensor:
    return torch.randn(batch_size, channels, size, size)


def token_ids(batch_size: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch_size, seq_len), dtype=torch.long)
