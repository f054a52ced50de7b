"""Quantized frozen weights as a transform of a built model: every Linear but the output layer becomes
bitsandbytes 4-bit (nf4/fp4, double quantization) or 8-bit (LLM.int8), or float8 storage.

The layers run bitsandbytes' own autograd functions and ops (their fake kernels on fake tensors, their CPU
kernels for real); only where a tensor lives differs from bitsandbytes' modules: the packed weight is a frozen
parameter and its quantization state buffers, so that the tracer sees and counts them (bitsandbytes keeps them
on a tensor subclass that fake tensors cannot carry). The fused 4-bit matmul is traced through the
dequantize-then-linear code bitsandbytes runs on the CPU and on CUDA for more than 1536 rows (`decomposition`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import UserError

BLOCKSIZE_4BIT = 64  # bitsandbytes' default for quantize_4bit
NESTED_BLOCKSIZE = 256  # double quantization: the absmax are themselves quantized per 256 blocks
CUDA_FUSED_MAX_ROWS = 1536  # bitsandbytes' CUDA gemm_4bit dequantizes the weight past this many rows


def _bnb():
    try:
        import bitsandbytes
        import bitsandbytes.functional
    except ImportError as e:
        raise UserError(f"quantized weights and 8-bit optimizers need bitsandbytes: pip install bitsandbytes ({e})"
                        ) from None
    return bitsandbytes


def output_layer_names(model: nn.Module) -> set[str]:
    """Linear layers that project onto a vocabulary (an embedding's size) or are called lm_head: kept in full
    precision by quantization (transformers' bitsandbytes loader skips them) and not LoRA targets by default."""
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    return {n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and (n.rsplit(".", 1)[-1] == "lm_head" or m.out_features in vocab)}


class QuantizedWeights:
    """Mixin of the quantized layers (nn.Linear subclasses): their parameters and buffers keep their dtypes when
    the model is cast."""

    in_features: int
    out_features: int
    bias: nn.Parameter | None

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        dtypes = {k: v.dtype for k, v in self._buffers.items() if v is not None}  # type: ignore[attr-defined]
        weight_dtype = self.weight.dtype  # type: ignore[attr-defined]
        super()._apply(fn, recurse)  # type: ignore[misc]
        for k, dt in dtypes.items():
            b = self._buffers[k]  # type: ignore[attr-defined]
            if b is not None and b.dtype != dt:
                self._buffers[k] = b.to(dt)  # type: ignore[attr-defined]
        w = self.weight  # type: ignore[attr-defined]
        if w.dtype != weight_dtype:
            self.weight = nn.Parameter(w.data.to(weight_dtype), requires_grad=False)
        return self


def _linear4bit_base():
    return _bnb().nn.Linear4bit


def make_linear4bit(lin: nn.Linear, quant_type: str, compute_dtype: torch.dtype, double_quant: bool = True):
    bnb = _bnb()

    class Linear4bitState(QuantizedWeights, bnb.nn.Linear4bit):
        """bitsandbytes.nn.Linear4bit whose packed weight is a frozen parameter and whose QuantState
        tensors are buffers; forward is Linear4bit's (bitsandbytes.matmul_4bit)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inp_dtype = x.dtype
            x = x.to(self.compute_dtype)
            bias = None if self.bias is None else self.bias.to(self.compute_dtype)
            return bnb.matmul_4bit(x, self.weight, bias=bias, quant_state=self.state()).to(inp_dtype)

        def state(self):
            QS = bnb.functional.QuantState
            state2 = None
            if self.double_quant:
                state2 = QS(absmax=self.absmax2, code=self.absmax2_code, blocksize=NESTED_BLOCKSIZE,
                            dtype=torch.float32)
            return QS(absmax=self.absmax, shape=torch.Size([self.out_features, self.in_features]),
                      code=self.quant_code, blocksize=BLOCKSIZE_4BIT, quant_type=self.quant_type,
                      dtype=self.compute_dtype, offset=self.absmax_offset if self.double_quant else None,
                      state2=state2)

    layer = Linear4bitState(lin.in_features, lin.out_features, bias=lin.bias is not None,
                            compute_dtype=compute_dtype, compress_statistics=double_quant, quant_type=quant_type,
                            device="meta")
    w = lin.weight
    if w.is_meta:
        tensors = [torch.empty(s, dtype=d, device="meta") for s, d in _meta_4bit(tuple(w.shape), quant_type,
                                                                               double_quant)]
    else:
        tensors = _quantize_4bit(w.detach(), quant_type, double_quant)  # from the weight's dtype, as Params4bit
    layer.weight = nn.Parameter(tensors[0], requires_grad=False)
    layer.bias = None if lin.bias is None else nn.Parameter(lin.bias.detach(), requires_grad=False)
    layer.quant_type, layer.double_quant = quant_type, double_quant
    layer.weight.compress_statistics, layer.weight.quant_type = double_quant, quant_type  # as Params4bit: peft reads
    for name, t in zip(("absmax", "quant_code", "absmax_offset", "absmax2", "absmax2_code"), tensors[1:], strict=False):
        layer.register_buffer(name, t)
    return layer


def _quantize_4bit(w: torch.Tensor, quant_type: str, double_quant: bool) -> list[torch.Tensor]:
    """bitsandbytes.functional.quantize_4bit's packed weight and QuantState tensors, in buffer order."""
    bnb = _bnb()
    # bitsandbytes caches its dynamic map on the device of its first call: keep that a real (CPU) tensor, or a
    # later real quantization would find a meta one.
    if "dynamic" not in bnb.functional.name2qmap:
        with torch.device("cpu"):
            bnb.functional.name2qmap["dynamic"] = bnb.functional.create_dynamic_map()
    packed, qs = bnb.functional.quantize_4bit(w, blocksize=BLOCKSIZE_4BIT, compress_statistics=double_quant,
                                             quant_type=quant_type)
    out = [packed, qs.absmax, qs.code.to(w.device)]
    if double_quant:
        out += [qs.offset.reshape(()).to(w.device), qs.state2.absmax, qs.state2.code.to(w.device)]
    return out


_META_SHAPES: dict[tuple, list[tuple[tuple[int, ...], torch.dtype]]] = {}


def _meta_4bit(shape: tuple[int, ...], quant_type: str, double_quant: bool):
    """Shapes and dtypes of _quantize_4bit's tensors for a weight shape, from bitsandbytes on meta, once per
    shape (a 70B model has 560 Linear layers of 4 shapes)."""
    key = (shape, quant_type, double_quant)
    if key not in _META_SHAPES:
        ts = _quantize_4bit(torch.empty(shape, dtype=torch.bfloat16, device="meta"), quant_type, double_quant)
        _META_SHAPES[key] = [(tuple(t.shape), t.dtype) for t in ts]
    return _META_SHAPES[key]


def make_linear8bit(lin: nn.Linear, cuda_target: bool):
    bnb = _bnb()
    from bitsandbytes.autograd._functions import MatMul8bitLt, MatmulLtState

    class Linear8bitState(QuantizedWeights, bnb.nn.Linear8bitLt):
        """bitsandbytes.nn.Linear8bitLt (threshold 0, int8 weights) whose row scales are a buffer. For a CUDA
        target it runs MatMul8bitLt, the CUDA path (the CPU trains through MatMul8bitFp instead)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            st = MatmulLtState()
            st.CB, st.SCB, st.has_fp16_weights, st.is_training = self.weight, self.SCB, False, self.training
            bias = self.bias
            if bias is not None and bias.dtype != x.dtype:
                bias = bias.to(x.dtype)
            if self.cuda_target:
                return MatMul8bitLt.apply(x, self.weight, None, bias, st)
            return bnb.matmul(x, self.weight, bias=bias, state=st)

    layer = Linear8bitState(lin.in_features, lin.out_features, bias=lin.bias is not None, has_fp16_weights=False,
                            threshold=0.0, device="meta")
    w = lin.weight
    src = torch.empty(w.shape, dtype=torch.float16, device="meta") if w.is_meta else w.detach().to(torch.float16)
    cb, scb, _ = bnb.functional.int8_vectorwise_quant(src)
    layer.weight = nn.Parameter(cb, requires_grad=False)
    layer.bias = None if lin.bias is None else nn.Parameter(lin.bias.detach(), requires_grad=False)
    layer.register_buffer("SCB", scb)
    layer.cuda_target = cuda_target
    return layer


class _Float8Matmul(torch.autograd.Function):
    """y = x @ (w8 · scale)ᵀ with the dequantized weight made in forward and again in backward, never kept."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, bias):  # type: ignore[override]
        ctx.save_for_backward(w8, scale)
        return F.linear(x, w8.to(x.dtype) * scale.to(x.dtype), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        w8, scale = ctx.saved_tensors
        return grad @ (w8.to(grad.dtype) * scale.to(grad.dtype)), None, None, None


class Float8Linear(QuantizedWeights, nn.Linear):
    """float8_e4m3fn weights with one float32 scale per output row (torchao's float8 weight-only layout),
    dequantized to the compute dtype in forward and in backward. Modelled: no library kernel runs."""

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
        self.bias = None if lin.bias is None else nn.Parameter(lin.bias.detach(), requires_grad=False)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = x.dtype
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return _Float8Matmul.apply(x.to(self.compute_dtype), self.weight, self.scale, bias).to(inp)


def quantize_linears(model: nn.Module, fmt: str, compute_dtype: torch.dtype, cuda_target: bool) -> list[str]:
    """Replaces every nn.Linear except the output layer by its `fmt` version, in place. Returns their names."""
    skip = output_layer_names(model)
    done = []
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
    if fmt in ("nf4", "fp4"):
        model.is_loaded_in_4bit = True
    elif fmt == "int8":
        model.is_loaded_in_8bit = True
    return done


def decomposition(cuda_target: bool) -> Callable[[Any, tuple, dict], Callable | None]:
    """For the tracer: the Python code bitsandbytes runs inside an op whose fake kernel only makes the output,
    so that the temporaries it allocates (the dequantized weight) are traced. On the CPU gemm_4bit is that code;
    on CUDA it is for more than 1536 rows (a fused kernel below, whose scratch is not modelled)."""
    table: dict[Any, Callable] = {}
    try:
        import bitsandbytes  # noqa: F401
        from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl
    except ImportError:
        return lambda func, args, kwargs: None
    ops = torch.ops.bitsandbytes
    table[ops.gemm_4bit.default] = _gemm_4bit_default_impl
    int8_mm = ops.int8_scaled_mm.default

    def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None):
        # bitsandbytes' default kernel (CPU and CUDA): int32 product, then dequantized with the scales.
        out_i32 = ops.int8_linear_matmul.default(A, B)
        return ops.int8_mm_dequant.default(out_i32, row_stats, col_stats, dtype=dtype or torch.float16, bias=bias)

    table[int8_mm] = int8_scaled_mm
    if not cuda_target:
        # bitsandbytes' 8-bit optimizer step on the CPU is Python (fp32 copies of the states, then requantized);
        # its CUDA kernels update in place and allocate nothing, as the fake kernels do.
        from bitsandbytes.backends.cpu.ops import _optimizer_update_8bit_blockwise_cpu

        table[ops.optimizer_update_8bit_blockwise.default] = _optimizer_update_8bit_blockwise_cpu

    def find(func, args: tuple, kwargs: dict) -> Callable | None:
        impl = table.get(func)
        if impl is None:
            return None
        if cuda_target and func is ops.gemm_4bit.default:
            a = args[0]
            if a.numel() // a.shape[-1] <= CUDA_FUSED_MAX_ROWS:
                return None
        return impl

    return find
