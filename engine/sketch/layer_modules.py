"""The modules the builder's layers build that torch.nn lacks (reshape, add, concatenate, permute, mean, a learned
positional embedding, a causal transformer block); engine.sketch.codegen emits the same classes as text."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Reshape(nn.Module):
    """Reshapes each sample to `shape` (the batch dimension is kept)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return ", ".join(map(str, self.shape))


class Add(nn.Module):
    """Sums its inputs (residual connections)."""

    def forward(self, *xs: Tensor) -> Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out


class Concat(nn.Module):
    """Concatenates its inputs along `dim` (batch = dim 0)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, *xs: Tensor) -> Tensor:
        return torch.cat(xs, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Permute(nn.Module):
    """Reorders the dimensions (batch stays first); a view, no new memory."""

    def __init__(self, *dims: int) -> None:
        super().__init__()
        self.dims = tuple(dims)

    def forward(self, x: Tensor) -> Tensor:
        return x.permute(*self.dims)

    def extra_repr(self) -> str:
        return ", ".join(map(str, self.dims))


class Mean(nn.Module):
    """Averages over one dimension (e.g. the sequence, for a classifier head)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PositionalEmbedding(nn.Module):
    """Adds a learned position vector to each step of a (batch, sequence, features) input."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, max_len, dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.weight[:, : x.shape[1]]


class CausalTransformerBlock(nn.TransformerEncoderLayer):
    """A decoder-only (GPT-style) block: self-attention under a causal mask, then the feed-forward.

    The arguments mirror nn.TransformerEncoderLayer.forward, but it is always causal: it builds its own mask
    (a `src_mask` is refused, `is_causal` is ignored) and passes a key-padding mask on."""

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = True) -> Tensor:
        if src_mask is not None:
            raise ValueError("CausalTransformerBlock builds its own causal mask: call it without src_mask")
        mask = nn.Transformer.generate_square_subsequent_mask(src.shape[1], device=src.device, dtype=src.dtype)
        return super().forward(src, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=True)
