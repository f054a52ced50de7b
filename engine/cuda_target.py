"""The kernel choices PyTorch makes on a CUDA GPU, applied while tracing on fake CPU tensors.

A CPU-only PyTorch cannot run autograd on fake CUDA tensors, so the CUDA target is traced on fake CPU tensors
with the few choices that change what is allocated redirected to what CUDA would pick:
- dropout uses the fused kernel (`native_dropout`), which saves a 1-byte mask, not the CPU's float mask;
- scaled-dot-product attention takes flash attention (fp16/bf16, no mask, head size ≤ 256, sm80+) or the
  memory-efficient kernel (masks, fp32), which save the output and log-sum-exp rather than the attention
  matrix; otherwise the math path, as on the CPU. Under autocast the inputs are cast first, as CUDA's
  autocast puts attention on its lower-precision list.
(The optimizer's foreach default is set in engine.step.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

DEFAULT_CC = (8, 0)  # an A100, when no GPU is named


def compute_capability(gpu_name: str | None) -> tuple[int, int]:
    if not gpu_name:
        return DEFAULT_CC
    from .gpus import find_gpu

    return tuple(find_gpu(gpu_name).compute_capability)


class CudaKernelChoices(TorchFunctionMode):
    def __init__(self, cc: tuple[int, int] = DEFAULT_CC) -> None:
        super().__init__()
        self.cc = cc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = self._attention(*args, **kwargs)
            if out is not None:
                return out
        elif func is F.dropout:
            out = self._dropout(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    @staticmethod
    def _dropout(input, p=0.5, training=True, inplace=False):
        if not training or inplace or not (0.0 < p < 1.0) or input.numel() == 0:
            return None
        return torch.native_dropout(input, p, True)[0]

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or (enable_gqa and k.size(1) != q.size(1)):
            return None
        if q.size(-1) != v.size(-1) or q.size(-1) != k.size(-1):
            return None
        if torch.is_autocast_enabled("cpu") and q.dtype == torch.float32:
            dt = torch.get_autocast_dtype("cpu")
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
        half = q.dtype in (torch.float16, torch.bfloat16)
        bf16_ok = q.dtype != torch.bfloat16 or self.cc >= (8, 0)
        head = q.size(-1)
        with torch.autocast("cpu", enabled=False):
            if half and attn_mask is None and head <= 256 and self.cc >= (8, 0):
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale
                )[0]
            if bf16_ok and self.cc >= (5, 0) and q.dtype in (torch.float32, torch.float16, torch.bfloat16):
                bias = attn_mask
                if bias is not None:
                    if bias.dtype == torch.bool:  # CUDA turns a boolean mask into an additive one
                        bias = torch.zeros(bias.shape, dtype=q.dtype).masked_fill_(~bias, float("-inf"))
                    elif bias.dtype != q.dtype:
                        bias = bias.to(q.dtype)
                    bias = bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
                need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, bias, need_lse, dropout_p, is_causal, scale=scale
                )[0]
        return None
