"""Building a model on the meta device, its weight initialisation skipped.

A meta tensor has no values: `nn.init.kaiming_uniform_` on one only checks its shape, yet each call goes through
PyTorch's function dispatch (and the device context's) several times over. An 80-layer Llama's 563 Linear layers
spent 14 of the 36 ms of its meta build in their `reset_parameters` (benchmarks/RESULTS.md, depth section). Under
`init_skipped()` the initialisers and the in-place fills they use return their meta tensor as it is; on any other
tensor, and for every other function, nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import init
from torch.overrides import TorchFunctionMode

from ..config.train_config import TrainConfig
from ..models.source import ModelSource

# The initialisers that dispatch as themselves (torch.overrides.handle_torch_function), and the in-place methods
# the others (zeros_, ones_, xavier_*, …) come down to. Each one's first argument is the tensor it fills.
_SKIPPED: frozenset[Callable[..., Any]] = frozenset({
    init.uniform_, init.normal_, init.constant_, init.kaiming_uniform_,
    torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.zero_, torch.Tensor.fill_,
})


class init_skipped(TorchFunctionMode):  # noqa: N801  (used as a context manager, as torch.device is)
    """`with torch.device("meta"), init_skipped(): model = build()`: the build's initialisers of meta tensors are
    not run (see the module's docstring)."""

    def __torch_function__(self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        if func in _SKIPPED:
            target = args[0] if args else (kwargs or {}).get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **(kwargs or {}))


def build_on_meta(source: ModelSource, cfg: TrainConfig) -> tuple[nn.Module, Any]:
    """`source.build(cfg)` on the meta device (model, inputs), its initialisers skipped."""
    with torch.device("meta"), init_skipped():
        return source.build(cfg)
