"""Quantized frozen weights as a transform of a built model: every Linear but the output layer becomes
bitsandbytes 4-bit (nf4/fp4, double quantization) or 8-bit (LLM.int8), or float8 storage.

The layers run bitsandbytes' own autograd functions and ops (their fake kernels on fake tensors, their CPU
kernels for real); only where a tensor lives differs from bitsandbytes' modules: the packed weight is a frozen
parameter and its quantization state buffers, so that the tracer sees and counts them (bitsandbytes keeps them
on a tensor subclass that fake tensors cannot carry). The fused 4-bit matmul is traced through the
dequantize-then-linear code bitsandbytes runs on the CPU and on CUDA for more than 1536 rows (`decomposition`).
The bitsandbytes layers themselves are in engine.finetune.quantized_bnb, imported once bitsandbytes is known to be
there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import UserError
from ..core.library_noise import quiet_libraries
from .quantized_weights import Decompose, QuantizedWeights

if TYPE_CHECKING:
    from .quantized_bnb import Linear4bitState, Linear8bitState

__all__ = ["Float8Linear", "QuantizedWeights", "decomposition", "load_bitsandbytes", "make_linear4bit",
           "make_linear8bit", "output_layer_names", "quantize_linears"]


def _require_bnb() -> None:
    quiet_libraries()
    try:
        import bitsandbytes  # noqa: F401
        import bitsandbytes.functional  # noqa: F401
    except ImportError as e:
        raise UserError(f"quantized weights and 8-bit optimizers need bitsandbytes: pip install bitsandbytes ({e})"
                        ) from None


def load_bitsandbytes() -> None:
    """bitsandbytes and its layers' states (engine.finetune.quantized_bnb) imported, or a UserError saying so."""
    _require_bnb()
    from . import quantized_bnb  # noqa: F401


def output_layer_names(model: nn.Module) -> set[str]:
    """Linear layers that project onto a vocabulary (an embedding's size) or are called lm_head: kept in full
    precision by quantization (transformers' bitsandbytes loader skips them) and not LoRA targets by default."""
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    return {n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and (n.rsplit(".", 1)[-1] == "lm_head" or m.out_features in vocab)}


def make_linear4bit(lin: nn.Linear, quant_type: str, compute_dtype: torch.dtype,
                    double_quant: bool = True) -> Linear4bitState:
    """`lin` as a bitsandbytes 4-bit layer (engine.finetune.quantized_bnb.Linear4bitState)."""
    _require_bnb()
    from . import quantized_bnb

    return quantized_bnb.make_linear4bit(lin, quant_type, compute_dtype, double_quant)


def make_linear8bit(lin: nn.Linear, cuda_target: bool) -> Linear8bitState:
    """`lin` as a bitsandbytes LLM.int8 layer (engine.finetune.quantized_bnb.Linear8bitState)."""
    _require_bnb()
    from . import quantized_bnb

    return quantized_bnb.make_linear8bit(lin, cuda_target)


class _Float8Matmul(torch.autograd.Function):
    """y = x @ (w8 · scale)ᵀ with the dequantized weight made in forward and again in backward, never kept."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(w8, scale)
        return F.linear(x, w8.to(x.dtype) * scale.to(x.dtype), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        w8, scale = ctx.saved_tensors
        return grad @ (w8.to(grad.dtype) * scale.to(grad.dtype)), None, None, None


class Float8Linear(QuantizedWeights):
    """float8_e4m3fn weights with one float32 scale per output row (torchao's float8 weight-only layout),
    dequantized to the compute dtype in forward and in backward. Modelled: no library kernel runs."""

    scale: torch.Tensor

    def __init__(self, lin: nn.Linear, compute_dtype: torch.dtype):
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.compute_dtype = lin.in_features, lin.out_features, compute_dtype
        w = lin.weight.detach()
        if w.is_meta:
            w8 = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device="meta")
            scale = torch.empty(w.shape[0], 1, dtype=torch.float32, device="meta")
        else:
            scale = (w.abs().amax(dim=1, keepdim=True).float() / torch.finfo(torch.float8_e4m3fn).max).clamp(
                min=1e-12)
            w8 = (w.float() / scale).to(torch.float8_e4m3fn)
        self.weight = nn.Parameter(w8, requires_grad=False)
        self.register_parameter("bias", None if lin.bias is None else nn.Parameter(lin.bias.detach(),
                                                                                  requires_grad=False))
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x.dtype
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        # torch.autograd.Function.apply is unannotated
        y: torch.Tensor = _Float8Matmul.apply(x.to(self.compute_dtype), self.weight,  # type: ignore[no-untyped-call]
                                              self.scale, bias)
        return y.to(inp)


def quantize_linears(model: nn.Module, fmt: str, compute_dtype: torch.dtype, cuda_target: bool) -> list[str]:
    """Replaces every nn.Linear except the output layer by its `fmt` version, in place. Returns their names."""
    skip = output_layer_names(model)
    done: list[str] = []
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or full in skip:
                continue
            if fmt in ("nf4", "fp4"):
                new: nn.Module = make_linear4bit(child, fmt, compute_dtype)
            elif fmt == "int8":
                new = make_linear8bit(child, cuda_target)
            else:
                new = Float8Linear(child, compute_dtype)
            setattr(mod, child_name, new)
            done.append(full)
    if not done:
        raise UserError(f"--weights {fmt}: the model has no nn.Linear layers to quantize (output layers excluded)")
    # What transformers sets on a bitsandbytes-loaded model: peft reads it to wrap these layers with its
    # bitsandbytes LoRA layers (which, for 4-bit, clone the base output), as it does for a real QLoRA model.
    # (A plain attribute, as transformers sets it; nn.Module.__setattr__ is typed for tensors and modules only.)
    if fmt in ("nf4", "fp4"):
        model.__dict__["is_loaded_in_4bit"] = True
    elif fmt == "int8":
        model.__dict__["is_loaded_in_8bit"] = True
    return done


def decomposition(cuda_target: bool) -> Decompose:
    """For the tracer: the Python code bitsandbytes runs inside an op whose fake kernel only makes the output
    (engine.finetune.quantized_bnb.decomposition); without bitsandbytes, nothing is decomposed."""
    quiet_libraries()
    try:
        from . import quantized_bnb
    except ImportError:
        return lambda func, args, kwargs: None
    return quantized_bnb.decomposition(cuda_target)
