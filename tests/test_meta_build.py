"""A model built on the meta device skips its weight initialisers (engine.trace.meta_build): they only check a
meta tensor's shape, and cost a deep model's build a third of its time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from engine.config.train_config import TrainConfig
from engine.models.sources import resolve_source
from engine.trace.meta_build import build_on_meta, init_skipped


class _Seen(TorchFunctionMode):
    """Every function that reaches the modes below init_skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.funcs: list[Callable[..., Any]] = []

    def __torch_function__(self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


def test_initialisers_of_meta_tensors_are_not_run() -> None:
    seen = _Seen()
    with torch.device("meta"), seen, init_skipped():
        layer = nn.Linear(64, 32)  # reset_parameters: kaiming_uniform_ and uniform_
        norm = nn.LayerNorm(32)  # ones_ and zeros_: fill_ and zero_
        w = torch.empty(4, 4)
        assert nn.init.normal_(tensor=w) is w  # (the tensor passed by name)
    assert layer.weight.is_meta and tuple(layer.weight.shape) == (32, 64) and tuple(norm.bias.shape) == (32,)
    skipped = {nn.init.kaiming_uniform_, nn.init.uniform_, nn.init.normal_, torch.Tensor.fill_, torch.Tensor.zero_}
    assert not skipped & set(seen.funcs)
    with torch.device("meta"), seen:  # without it, they do reach the modes below
        nn.Linear(64, 32)
    assert nn.init.kaiming_uniform_ in seen.funcs


def test_tensors_with_values_are_still_initialised() -> None:
    with init_skipped():
        w = nn.init.constant_(torch.zeros(3), 2.0)
        b = torch.zeros(2).fill_(5.0)
    assert w.tolist() == [2.0, 2.0, 2.0] and b.tolist() == [5.0, 5.0]


def test_a_template_builds_the_same_parameters() -> None:
    src, cfg = resolve_source("gpt2"), TrainConfig(batch_size=1, seq_len=64)
    model, inputs = build_on_meta(src, cfg)
    with torch.device("meta"):
        plain, plain_inputs = src.build(cfg)
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in model.named_parameters()] == \
        [(n, p.shape, p.dtype, p.requires_grad) for n, p in plain.named_parameters()]
    assert {k: v.shape for k, v in inputs.items()} == {k: v.shape for k, v in plain_inputs.items()}
