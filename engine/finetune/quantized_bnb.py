"""bitsandbytes' quantized Linear layers as the tracer needs them: 4-bit (nf4/fp4, double quantization) and
8-bit (LLM.int8) layers whose packed weight is a frozen parameter and whose quantization state is buffers, and
the Python code bitsandbytes runs inside the ops whose fake kernels only make the output (`decomposition`).

Imported only once bitsandbytes is known to be installed (engine.finetune.quantized checks and says how to install it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import bitsandbytes.functional
import torch
from bitsandbytes.autograd._functions import MatMul8bitLt, MatmulLtState, matmul, matmul_4bit
from bitsandbytes.nn.modules import Linear4bit, Linear8bitLt
from torch import nn
from torch._ops import OpOverload

from .quantized_weights import Decompose, QuantizedWeights

BLOCKSIZE_4BIT = 64  # bitsandbytes' default for quantize_4bit
NESTED_BLOCKSIZE = 256  # double quantization: the absmax are themselves quantized per 256 blocks
CUDA_FUSED_MAX_ROWS = 1536  # bitsandbytes' CUDA gemm_4bit dequantizes the weight past this many rows



class Linear4bitState(QuantizedWeights, Linear4bit):
    """bitsandbytes.nn.Linear4bit whose packed weight is a frozen parameter and whose QuantState tensors are
    buffers; forward is Linear4bit's (bitsandbytes.matmul_4bit)."""

    quant_type: str
    double_quant: bool
    absmax: torch.Tensor
    quant_code: torch.Tensor
    absmax_offset: torch.Tensor
    absmax2: torch.Tensor
    absmax2_code: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool, compute_dtype: torch.dtype,
                 double_quant: bool, quant_type: str) -> None:
        # Linear4bit.__init__ is unannotated in bitsandbytes
        super().__init__(in_features, out_features, bias=bias,  # type: ignore[no-untyped-call]
                         compute_dtype=compute_dtype, compress_statistics=double_quant, quant_type=quant_type,
                         device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        y: torch.Tensor = matmul_4bit(x, self.weight, bias=bias, quant_state=self.state())
        return y.to(inp_dtype)

    def state(self) -> bitsandbytes.functional.QuantState:
        state2 = None
        if self.double_quant:
            state2 = _quant_state(absmax=self.absmax2, code=self.absmax2_code, blocksize=NESTED_BLOCKSIZE,
                                  dtype=torch.float32)
        return _quant_state(absmax=self.absmax, shape=torch.Size([self.out_features, self.in_features]),
                            code=self.quant_code, blocksize=BLOCKSIZE_4BIT, quant_type=self.quant_type,
                            dtype=self.compute_dtype, offset=self.absmax_offset if self.double_quant else None,
                            state2=state2)


def _quant_state(**fields: Any) -> bitsandbytes.functional.QuantState:
    return bitsandbytes.functional.QuantState(**fields)  # type: ignore[no-untyped-call]  # unannotated __init__


def make_linear4bit(lin: nn.Linear, quant_type: str, compute_dtype: torch.dtype,
                    double_quant: bool = True) -> Linear4bitState:
    layer = Linear4bitState(lin.in_features, lin.out_features, lin.bias is not None, compute_dtype, double_quant,
                            quant_type)
    w = lin.weight
    if w.is_meta:
        tensors = [torch.empty(s, dtype=d, device="meta") for s, d in _meta_4bit(tuple(w.shape), quant_type,
                                                                               double_quant)]
    else:
        tensors = _quantize_4bit(w.detach(), quant_type, double_quant)  # from the weight's dtype, as Params4bit
    layer.weight = nn.Parameter(tensors[0], requires_grad=False)
    if lin.bias is not None:
        layer.bias = nn.Parameter(lin.bias.detach(), requires_grad=False)
    layer.quant_type, layer.double_quant = quant_type, double_quant
    # as on a Params4bit: peft reads them
    layer.weight.__dict__.update(compress_statistics=double_quant, quant_type=quant_type)
    for name, t in zip(("absmax", "quant_code", "absmax_offset", "absmax2", "absmax2_code"), tensors[1:], strict=False):
        layer.register_buffer(name, t)
    return layer


def _quantize_4bit(w: torch.Tensor, quant_type: str, double_quant: bool) -> list[torch.Tensor]:
    """bitsandbytes.functional.quantize_4bit's packed weight and QuantState tensors, in buffer order."""
    functional = bitsandbytes.functional
    # bitsandbytes caches its dynamic map on the device of its first call: keep that a real (CPU) tensor, or a
    # later real quantization would find a meta one.
    if "dynamic" not in functional.name2qmap:
        with torch.device("cpu"):
            functional.name2qmap["dynamic"] = functional.create_dynamic_map()  # type: ignore[no-untyped-call]
    packed, qs = functional.quantize_4bit(w, blocksize=BLOCKSIZE_4BIT, compress_statistics=double_quant,
                                          quant_type=quant_type)
    out = [packed, qs.absmax, qs.code.to(w.device)]
    if double_quant:
        out += [qs.offset.reshape(()).to(w.device), qs.state2.absmax, qs.state2.code.to(w.device)]
    return out


_META_SHAPES: dict[tuple[tuple[int, ...], str, bool], list[tuple[tuple[int, ...], torch.dtype]]] = {}


def _meta_4bit(shape: tuple[int, ...], quant_type: str, double_quant: bool) -> list[tuple[tuple[int, ...],
                                                                                          torch.dtype]]:
    """Shapes and dtypes of _quantize_4bit's tensors for a weight shape, from bitsandbytes on meta, once per
    shape (a 70B model has 560 Linear layers of 4 shapes)."""
    key = (shape, quant_type, double_quant)
    if key not in _META_SHAPES:
        ts = _quantize_4bit(torch.empty(shape, dtype=torch.bfloat16, device="meta"), quant_type, double_quant)
        _META_SHAPES[key] = [(tuple(t.shape), t.dtype) for t in ts]
    return _META_SHAPES[key]


class Linear8bitState(QuantizedWeights, Linear8bitLt):
    """bitsandbytes.nn.Linear8bitLt (threshold 0, int8 weights) whose row scales are a buffer. For a CUDA
    target it runs MatMul8bitLt, the CUDA path (the CPU trains through MatMul8bitFp instead)."""

    SCB: torch.Tensor
    cuda_target: bool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = MatmulLtState()
        st.CB, st.SCB, st.has_fp16_weights, st.is_training = self.weight, self.SCB, False, self.training
        bias: torch.Tensor | None = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        y: torch.Tensor
        if self.cuda_target:
            y = MatMul8bitLt.apply(x, self.weight, None, bias, st)  # type: ignore[no-untyped-call]  # torch's apply
        else:
            y = matmul(x, self.weight, bias=bias, state=st)
        return y


def make_linear8bit(lin: nn.Linear, cuda_target: bool) -> Linear8bitState:
    layer = Linear8bitState(lin.in_features, lin.out_features, bias=lin.bias is not None, has_fp16_weights=False,
                            threshold=0.0, device="meta")
    w = lin.weight
    src = torch.empty(w.shape, dtype=torch.float16, device="meta") if w.is_meta else w.detach().to(torch.float16)
    cb, scb, _ = bitsandbytes.functional.int8_vectorwise_quant(src)
    layer.weight = nn.Parameter(cb, requires_grad=False)
    if lin.bias is not None:
        layer.bias = nn.Parameter(lin.bias.detach(), requires_grad=False)
    layer.register_buffer("SCB", scb)
    layer.cuda_target = cuda_target
    return layer


def decomposition(cuda_target: bool) -> Decompose:
    """For the tracer: the Python code bitsandbytes runs inside an op whose fake kernel only makes the output,
    so that the temporaries it allocates (the dequantized weight) are traced. On the CPU gemm_4bit is that code;
    on CUDA it is for more than 1536 rows (a fused kernel below, whose scratch is not modelled)."""
    table: dict[OpOverload[..., Any], Callable[..., Any]] = {}
    try:
        from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl
    except ImportError:
        return lambda func, args, kwargs: None
    ops = torch.ops.bitsandbytes
    table[ops.gemm_4bit.default] = _gemm_4bit_default_impl
    int8_mm = ops.int8_scaled_mm.default

    def int8_scaled_mm(A: torch.Tensor, B: torch.Tensor, row_stats: torch.Tensor, col_stats: torch.Tensor,
                       bias: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        # bitsandbytes' default kernel (CPU and CUDA): int32 product, then dequantized with the scales.
        out_i32 = ops.int8_linear_matmul.default(A, B)
        out: torch.Tensor = ops.int8_mm_dequant.default(out_i32, row_stats, col_stats, dtype=dtype or torch.float16,
                                                        bias=bias)
        return out

    table[int8_mm] = int8_scaled_mm
    if not cuda_target:
        # bitsandbytes' 8-bit optimizer step on the CPU is Python (fp32 copies of the states, then requantized);
        # its CUDA kernels update in place and allocate nothing, as the fake kernels do.
        from bitsandbytes.backends.cpu.ops import _optimizer_update_8bit_blockwise_cpu

        table[ops.optimizer_update_8bit_blockwise.default] = _optimizer_update_8bit_blockwise_cpu

    def find(func: OpOverload[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any] | None:
        impl = table.get(func)
        if impl is None:
            return None
        if cuda_target and func is ops.gemm_4bit.default:
            a = args[0]
            if a.numel() // a.shape[-1] <= CUDA_FUSED_MAX_ROWS:
                return None
        return impl

    return find
