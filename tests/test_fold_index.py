"""engine.trace.fold_index: a traced block's read of its index attribute declines a fold unless the read only passes
it along to another object (a cache's slot), and the module is back to its own class after."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.trace.fold_index import IndexWatch


class _Cache:
    def __init__(self) -> None:
        self.slots: list[torch.Tensor] = []

    def update(self, t: torch.Tensor, layer: int) -> torch.Tensor:
        self.slots.append(t)
        return self.slots[layer]  # indexing a list by it is not a use


class _GrowingCache(_Cache):
    def update(self, t: torch.Tensor, layer: int) -> torch.Tensor:
        while len(self.slots) <= layer:  # a test of the index where it was handed: only Hugging Face's caches may
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


def _line(text: str) -> int:
    """The line of this file that holds `text` (first)."""
    return next(i for i, s in enumerate(Path(__file__).read_text().splitlines(), 1) if text in s)


def _read(how: str, cache: type[_Cache] = _Cache) -> tuple[str | None, type]:
    attn = _Attention(0)
    watch = IndexWatch([(attn, frozenset({"layer_idx"}))])
    watch.start()
    try:
        attn(torch.ones(2), cache(), how)
    finally:
        watch.stop()
    assert attn.layer_idx == 0 and type(attn.layer_idx) is int
    return watch.read, type(attn)


def test_an_index_passed_along_to_another_objects_method_is_no_read() -> None:
    for how in ("", "cache", "keyword"):
        assert _read(how) == (None, _Attention), how


def test_an_index_handed_on_then_tested_where_it_went_is_a_read() -> None:
    for how in ("cache", "keyword"):
        read, _ = _read(how, _GrowingCache)
        at = _line("while len(self.slots) <= layer")  # (`len(…) <= layer` asks layer >=)
        want = f"_Attention.layer_idx handed on, then used (__ge__) at line {at} "
        assert read is not None and read.startswith(want), (how, read)


def test_an_index_handed_to_hugging_faces_cache_may_be_used_there() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    class _HFAttention(_Attention):
        def forward(self, x: torch.Tensor, cache: DynamicCache | None = None, how: str = "") -> torch.Tensor:
            assert cache is not None
            k, _ = cache.update(x, x, self.layer_idx)
            return k

    attn = _HFAttention(0)
    watch = IndexWatch([(attn, frozenset({"layer_idx"}))])
    watch.start()
    try:
        attn(torch.ones(1, 1, 2, 4), DynamicCache())
    finally:
        watch.stop()
    assert watch.read is None, transformers.__version__


def test_an_index_tested_computed_with_or_handed_to_the_modules_own_method_is_a_read() -> None:
    for how, line in (("branch", _line("if self.layer_idx % 4")), ("scale", _line("x / float(self.layer_idx")),
                      ("own-method", _line("self.scaled(x, self.layer_idx)")),
                      ("tested-call", _line("cache.update(x, self.layer_idx).shape"))):
        read, cls = _read(how)
        assert cls is _Attention
        assert read is not None and read.startswith(f"_Attention.layer_idx, line {line} of "), (how, read)
