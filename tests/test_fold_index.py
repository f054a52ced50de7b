"""engine.trace.fold_index: a traced block's read of its index attribute declines a fold unless the read only passes
it along to another object (a cache's slot), and the module is back to its own class after."""

from __future__ import annotations

import torch
from torch import nn

from engine.trace.fold_index import IndexWatch


class _Cache:
    def __init__(self) -> None:
        self.slots: list[torch.Tensor] = []

    def update(self, t: torch.Tensor, layer: int) -> torch.Tensor:
        while len(self.slots) <= layer:  # the cache's own test: its business, as in Hugging Face's Cache.update
            self.slots.append(t)
        return t


class _Attention(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.layer_idx = index

    def forward(self, x: torch.Tensor, cache: _Cache | None = None, how: str = "") -> torch.Tensor:
        if how == "cache" and cache is not None:
            x = cache.update(x, self.layer_idx)
        elif how == "keyword" and cache is not None:
            x = cache.update(x, layer=self.layer_idx)
        elif how == "branch":
            if self.layer_idx % 4 == 0:
                x = x * 2
        elif how == "scale":
            x = x / float(self.layer_idx + 1)
        elif how == "own-method":
            x = self.scaled(x, self.layer_idx)
        elif how == "tested-call" and cache is not None:
            x = x * 2 if cache.update(x, self.layer_idx).shape[0] else x
        return x

    def scaled(self, x: torch.Tensor, index: int) -> torch.Tensor:
        return x * index


def _read(how: str) -> tuple[str | None, type]:
    attn = _Attention(3)
    watch = IndexWatch([(attn, frozenset({"layer_idx"}))])
    watch.start()
    try:
        attn(torch.ones(2), _Cache(), how)
    finally:
        watch.stop()
    assert attn.layer_idx == 3
    return watch.read, type(attn)


def test_an_index_passed_along_to_another_objects_method_is_no_read() -> None:
    for how in ("", "cache", "keyword"):
        assert _read(how) == (None, _Attention), how


def test_an_index_tested_computed_with_or_handed_to_the_modules_own_method_is_a_read() -> None:
    for how, line in (("branch", 33), ("scale", 36), ("own-method", 38), ("tested-call", 40)):
        read, cls = _read(how)
        assert cls is _Attention
        assert read is not None and read.startswith(f"_Attention.layer_idx, line {line} of "), (how, read)
