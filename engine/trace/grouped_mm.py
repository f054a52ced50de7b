"""`torch._grouped_mm` on fake tensors in any dtype: transformers' default experts implementation (`grouped_mm`)
runs it, in fp32 too on the CPU, whose kernel accepts every float dtype; torch's fake kernel copies the CUDA
kernel's bfloat16-only check and refuses the rest. Here its output is made as the kernel makes it (one tensor of
the result's shape and stride, in the inputs' dtype) from the fake kernel run on bfloat16 stand-ins."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

OP = "_grouped_mm.default"


def needs_stand_in(args: tuple[Any, ...]) -> bool:
    """Fake operands the fake kernel would refuse (not bfloat16)."""
    a, b = args[0], args[1]
    return (isinstance(a, FakeTensor) and isinstance(b, FakeTensor)
            and (a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16))


def fake_grouped_mm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """The op's output for operands of any float dtype. The bfloat16 stand-ins and their result are fake and
    never tracked: only the returned tensor is the op's allocation."""
    a, b, *rest = args
    dtype = kwargs.get("out_dtype") or a.dtype
    shaped = func(a.to(torch.bfloat16), b.to(torch.bfloat16), *rest,
                  **{k: v for k, v in kwargs.items() if k != "out_dtype"})
    return torch.empty_strided(shaped.shape, shaped.stride(), dtype=dtype, device=a.device)
