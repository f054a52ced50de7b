"""The mark of a quantized layer (engine.finetune.quantized, engine.finetune.quantized_bnb): a module whose packed
weight and quantization state keep their dtypes when the model is cast, and that the tracer and recorder recognise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._ops import OpOverload

# decompose(func, args, kwargs) -> the Python code a library kernel runs instead of its fake kernel, or None
# (engine.finetune.quantized.decomposition makes one; the recorder, engine.trace.recorder, runs it).
Decompose = Callable[[OpOverload[..., Any], tuple[Any, ...], dict[str, Any]], Callable[..., Any] | None]


class QuantizedWeights(nn.Linear):
    """Base of the quantized Linear layers (mixed in before a library's Linear class where there is one): their
    parameters and buffers keep their dtypes when the model is cast. in_features and out_features are the
    weight's logical shape, whatever its packed storage."""

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> QuantizedWeights:
        dtypes = {k: v.dtype for k, v in self._buffers.items() if v is not None}
        weight_dtype = self.weight.dtype
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # nn.Module._apply is unannotated
        for k, dt in dtypes.items():
            b = self._buffers[k]
            if b is not None and b.dtype != dt:
                self._buffers[k] = b.to(dt)
        w = self.weight
        if w.dtype != weight_dtype:
            self.weight = nn.Parameter(w.data.to(weight_dtype), requires_grad=False)
        return self
