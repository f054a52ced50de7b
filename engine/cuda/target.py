"""The kernel choices PyTorch makes on a CUDA GPU, applied while tracing on fake CPU tensors.

A CPU-only PyTorch cannot run autograd on fake CUDA tensors, so the CUDA target is traced on fake CPU tensors
with the few choices that change what is allocated redirected to what CUDA would pick:
- dropout uses the fused kernel (`native_dropout`), which saves a 1-byte mask, not the CPU's float mask;
- scaled-dot-product attention takes cuDNN attention on sm90+ (Hopper, Blackwell) for fp16/bf16 without a
  mask and a head size ≤ 128 divisible by 8 (measured on an H200: ../shared/gpu/h200-ops.jsonl.gz), flash
  attention (fp16/bf16, no mask, head size ≤ 256, sm80+) or the memory-efficient kernel (masks, fp32), which
  save the output and log-sum-exp rather than the attention matrix; otherwise the math path, as on the CPU.
  Every fused kernel needs a unit stride on the last dimension of q, k, v and (memory-efficient) the mask; a mask
  without one takes the math path (measured on an H200: transformers 5.17 passed T5's relative-position bias as
  the permuted view compute_bias returns, and every T5 self-attention ran bmm + _safe_softmax, while its
  cross-attention, whose mask is contiguous, ran the memory-efficient kernel). The math path's dropout is CUDA's
  fused one (a 1-byte mask).
  Under autocast the inputs are cast first, as CUDA's
  autocast puts attention on its lower-precision list.
- autocast follows CUDA's op lists, not the CPU's: matmuls and convolutions run in fp16/bf16 (casts of
  parameters cached for the forward), while softmax, log-softmax, layer and group norm, exp/log/pow and the
  losses run in fp32 — on the CPU these last stay in half precision. Cross-entropy is on neither CUDA list:
  its log-softmax runs in the logits' half precision and only the nll_loss inside gets a float32 copy (the CPU
  autocast casts the whole loss to float32 first). Ops on neither list are left to the
  CPU autocast, whose lower-precision list is the same for the ops that remain (einsum's inner bmm, …).
- nn.LSTM and nn.GRU run as one cuDNN call with its reserve and workspaces (engine.cuda.rnn);
- nn.TransformerEncoderLayer and nn.MultiheadAttention take their fused inference fast path (eval, no grad), as
  CUDA does; the fused kernel's intermediates are costed by engine.cuda.kernels.
(The optimizer's foreach default is set in engine.trace.step.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..config.gpus import GpuSpec
from ..core.tensor_tree import map_tensors
from .kernels import KernelCost
from .rnn import RNN_ENTRIES, cast_reflatten, cudnn_rnn, is_rnn

# a torch function as __torch_function__ sees it: torch.matmul, Tensor.exp, F.linear, …
TorchFunction = Callable[..., Any]

DEFAULT_CC = (8, 0)  # an A100, when no GPU is named


def compute_capability(spec: GpuSpec | None) -> tuple[int, int]:
    return spec.compute_capability if spec is not None else DEFAULT_CC


def _lower_precision_ops() -> frozenset[TorchFunction]:
    T = torch.Tensor
    return frozenset({
        F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
        F.prelu, F.bilinear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.addbmm,
        torch.addmv, torch.mv, torch.chain_matmul, torch.linalg.multi_dot, T.__matmul__, T.__rmatmul__, T.matmul,
        T.mm, T.bmm, T.addmm, T.baddbmm, T.mv,
    })


def _fp32_ops() -> frozenset[TorchFunction]:
    T = torch.Tensor
    names = ("exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "pow", "acos", "asin",
             "cosh", "sinh", "tan", "erfinv", "softmax", "log_softmax", "cumsum", "cumprod", "prod", "norm")
    ops: set[TorchFunction] = {getattr(torch, n) for n in names if hasattr(torch, n)}
    ops |= {getattr(T, n) for n in names if hasattr(T, n)}
    ops |= {T.__pow__, torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.dist, torch.cdist, torch.renorm,
            torch.logsumexp, T.logsumexp}
    ops |= {F.softmax, F.log_softmax, F.layer_norm, F.group_norm, F.softplus, F.cosine_similarity,
            F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.nll_loss, F.kl_div, F.cross_entropy,
            F.binary_cross_entropy_with_logits, F.poisson_nll_loss, F.cosine_embedding_loss,
            F.hinge_embedding_loss, F.margin_ranking_loss, F.multilabel_margin_loss, F.soft_margin_loss,
            F.triplet_margin_loss, F.multi_margin_loss}
    return frozenset(ops)


_HALF = (torch.float16, torch.bfloat16)


class CudaKernelChoices(TorchFunctionMode):
    def __init__(self, cc: tuple[int, int] = DEFAULT_CC, costs: list[KernelCost] | None = None) -> None:
        super().__init__()
        self.cc = cc
        self.costs = costs  # where the cuDNN RNN calls' modelled reserve and workspace are noted (for the range)
        self._lower = _lower_precision_ops()
        self._fp32 = _fp32_ops()
        self._cache: dict[int, torch.Tensor] = {}  # parameter casts, as autocast's weight cache
        self._saved_has_tf: list[Any] = []  # torch.overrides.has_torch_function as each entry found it
        # what this mode changes outside autocast: every other call runs as it is
        self._special = frozenset({torch.Tensor.backward, F.multi_head_attention_forward,
                                   F.scaled_dot_product_attention, F.dropout, *RNN_ENTRIES})

    def __torch_function__(self, func: TorchFunction, types: Iterable[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cpu"):  # the hot path: most calls (a parameter's .grad, …) change nothing
            if self._cache:
                self._cache.clear()  # autocast has exited: its cache goes with it
            try:
                plain = func not in self._special
            except TypeError:  # an unhashable callable (a user's own object handed to handle_torch_function)
                plain = False
            if plain:
                return func(*args, **kwargs)
        if func is torch.Tensor.backward:
            done = self._backward(*args, **kwargs)
            if done:
                return None
        if torch.is_autocast_enabled("cpu"):
            if func in self._lower:
                dt = torch.get_autocast_dtype("cpu")
                args, kwargs = self._cast_last_first(args, kwargs, dt)
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs)
            if func is F.cross_entropy:
                out = autocast_cross_entropy(*args, **kwargs)
                if out is not None:
                    return out
            if func in self._fp32:
                args, kwargs = self._cast_last_first(args, kwargs, torch.float32)
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs)
        elif self._cache:
            self._cache.clear()  # autocast has exited: its cache goes with it
        rnn = is_rnn(func)
        if rnn is not None:
            if torch.is_autocast_enabled("cpu"):  # CUDA's autocast runs cuDNN RNNs in half precision
                dt = torch.get_autocast_dtype("cpu")
                weights = cast_reflatten(args[2], dt) if isinstance(args[2], (list, tuple)) else args[2]
                hx = self._cast(args[1], dt)
                args = (self._cast(args[0], dt), hx, weights, *args[3:])
            with torch.autocast("cpu", enabled=False):
                fused = cudnn_rnn(rnn, args, kwargs, self.costs)
            if fused is not None:
                return fused
        if func is F.multi_head_attention_forward:
            return self._inside(func, args, kwargs)
        if func is F.scaled_dot_product_attention:
            out = self._attention(*args, **kwargs)
            if out is not None:
                return out
        elif func is F.dropout:
            out = self._dropout(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    def __enter__(self) -> CudaKernelChoices:
        # nn.TransformerEncoderLayer / nn.MultiheadAttention take CUDA's fused inference fast path only when no
        # tensor argument "has a torch function"; with this mode active every tensor has one, so their checks
        # look past this mode (a real tensor subclass still counts).
        original = torch.overrides.has_torch_function
        # one saved function per entry: _backward enters this mode again inside its own handler, and a single
        # attribute overwritten there restored the outer wrapper, not torch's function (a wrapper more per trace)
        self._saved_has_tf.append(original)

        def has_torch_function(args: Iterable[Any]) -> bool:
            if torch._C._len_torch_function_stack() == 0:  # inside a handler: the mode is already off
                return bool(original(args))
            with torch.overrides._pop_mode_temporarily():
                return bool(original(args))

        torch.overrides.has_torch_function = has_torch_function
        super().__enter__()  # type: ignore[no-untyped-call]  # TorchFunctionMode is unannotated in torch
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.overrides.has_torch_function = self._saved_has_tf.pop()
        super().__exit__(*exc)  # type: ignore[no-untyped-call]  # TorchFunctionMode is unannotated in torch

    def _inside(self, func: TorchFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A Python function with its own torch-function override (nn.MultiheadAttention's functional form): this
        mode is off while it runs, so the attention it calls inside is redirected by name for that call."""
        original = F.scaled_dot_product_attention

        def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> torch.Tensor:
            out = self._attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            return out if out is not None else original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                                        enable_gqa=enable_gqa)

        F.scaled_dot_product_attention = sdpa  # type: ignore[assignment]  # the name multi_head_attention_forward looks up in its module
        try:
            return func(*args, **kwargs)
        finally:
            F.scaled_dot_product_attention = original

    def _backward(self, tensor: torch.Tensor, gradient: torch.Tensor | None = None, retain_graph: bool | None = None,
                  create_graph: bool = False, inputs: object = None) -> bool:
        """loss.backward() with this mode active: the mode is off while its own handler runs, and backward
        recomputes checkpointed blocks, which must make the same kernel choices as their forward did."""
        run = getattr(torch.autograd.graph, "_engine_run_backward", None)
        if run is None or gradient is not None or inputs is not None or tensor.numel() != 1:
            return False
        with self:
            run((tensor,), (torch.ones_like(tensor),), bool(retain_graph or create_graph), create_graph, (),
                allow_unreachable=True, accumulate_grad=True)
        return True

    def _cast_last_first(self, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype
                         ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """An op's arguments as CUDA's autocast casts them: its wrapper casts each argument in a call expression,
        which GCC evaluates last argument first — `linear`'s bias, then its weight, then its input, as the H200's
        GPT-2 trace shows (4,608, 3,538,944, then 3,145,728 bytes)."""
        cast_kwargs = {k: self._cast(kwargs[k], dtype) for k in reversed(list(kwargs))}
        cast_args = tuple(reversed([self._cast(a, dtype) for a in reversed(args)]))
        return cast_args, cast_kwargs  # a call binds keywords by name: their order here changes nothing

    def _cast(self, x: Any, dtype: torch.dtype) -> Any:
        """`x` (a tensor, or a list/tuple/dict of them) as autocast would cast it to `dtype`."""
        return map_tensors(x, lambda t: self._cast_tensor(t, dtype))

    def _cast_tensor(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not x.is_floating_point() or x.dtype == dtype or (dtype == torch.float32 and x.dtype not in _HALF):
            return x
        if dtype in _HALF and x.dtype != torch.float32:
            return x  # autocast casts only fp32 down
        if x.requires_grad and x.is_leaf and dtype in _HALF:  # a parameter: cast once per forward
            hit = self._cache.get(id(x))
            if hit is None:
                hit = self._cache[id(x)] = x.to(dtype)
            return hit
        return x.to(dtype)

    @staticmethod
    def _dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                 inplace: bool = False) -> torch.Tensor | None:
        if not training or inplace or not (0.0 < p < 1.0) or input.numel() == 0:
            return None
        return torch.native_dropout(input, p, True)[0]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> torch.Tensor | None:
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or (enable_gqa and k.size(1) != q.size(1)):
            return None
        if q.size(-1) != v.size(-1) or q.size(-1) != k.size(-1):
            return None
        if torch.is_autocast_enabled("cpu") and q.dtype == torch.float32:
            dt = torch.get_autocast_dtype("cpu")
            v, k, q = v.to(dt), k.to(dt), q.to(dt)  # last argument first, as CUDA's autocast casts them
        half = q.dtype in (torch.float16, torch.bfloat16)
        bf16_ok = q.dtype != torch.bfloat16 or self.cc >= (8, 0)
        head = q.size(-1)
        # every fused kernel needs a unit stride on the last dimension: cuDNN's and flash's of q, k and v (a size-1
        # one aside), the memory-efficient kernel's of the mask too (sdp_utils' check_last_dim_stride_equals_1)
        unit = all(t.stride(-1) == 1 or t.size(-1) == 1 for t in (q, k, v))
        unit_mask = all(t.stride(-1) == 1 for t in (q, k, v)) and (attn_mask is None or attn_mask.stride(-1) == 1)
        with torch.autocast("cpu", enabled=False):
            if half and attn_mask is None and head <= 128 and head % 8 == 0 and self.cc >= (9, 0) \
                    and not enable_gqa and unit:
                need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                cudnn: torch.Tensor = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    q, k, v, None, need_lse, dropout_p, is_causal, False, scale=scale
                )[0]
                return cudnn
            if half and attn_mask is None and head <= 256 and self.cc >= (8, 0) and unit:
                flash: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale
                )[0]
                return flash
            if bf16_ok and self.cc >= (5, 0) and q.dtype in (torch.float32, torch.float16, torch.bfloat16) \
                    and unit_mask:
                bias = attn_mask
                if bias is not None:
                    if bias.dtype == torch.bool:  # CUDA turns a boolean mask into an additive one
                        bias = torch.zeros(bias.shape, dtype=q.dtype).masked_fill_(~bias, float("-inf"))
                    elif bias.dtype != q.dtype:
                        bias = bias.to(q.dtype)
                    bias = bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
                need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                efficient: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, bias, need_lse, dropout_p, is_causal, scale=scale
                )[0]
                return efficient
            return _math_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    dropout_p: float, is_causal: bool, scale: float | None) -> torch.Tensor:
    """ATen's math attention (_scaled_dot_product_attention_math) as CUDA runs it: half inputs computed in float32,
    q and k each scaled by sqrt(scale), the mask added, _safe_softmax, and CUDA's fused dropout (a 1-byte mask,
    where the CPU's composite keeps a float one); the attention weights it also returns are cast back and dropped."""
    dtype = q.dtype
    if dtype in _HALF:
        q, k, v = q.float(), k.float(), v.float()
    root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.size(-1)))
    attn = torch.matmul(q * root, k.transpose(-2, -1) * root)
    if is_causal:
        causal = torch.ones(attn.shape[-2:], dtype=torch.bool).tril()
        attn = attn.masked_fill(~causal, float("-inf"))
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=attn.dtype).masked_fill(~mask, float("-inf"))
    attn = torch.ops.aten._safe_softmax(attn + mask if mask is not None else attn, -1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    if dtype in _HALF:
        attn.to(dtype)  # the weights the composite returns beside the output, in the input's dtype: dropped
    out = torch.matmul(attn, v)
    return out.to(dtype)


def autocast_cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                   size_average: bool | None = None, ignore_index: int = -100, reduce: bool | None = None,
                   reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor | None:
    """F.cross_entropy under CUDA's autocast, for class-index targets: ATen's cross_entropy_loss is on no autocast
    list, so its log_softmax keeps the logits' dtype and only nll_loss (on the float32 list) casts its input; a
    label-smoothing sum is float32 (sum's autocast policy). None for other forms (left to the float32 path).
    Measured on an H200 (gru-lm AMP fp16: _log_softmax in fp16, a float32 _to_copy into nll_loss_forward)."""
    if input.dtype not in _HALF or target.is_floating_point() or size_average is not None or reduce is not None:
        return None
    dim = 1 if input.dim() >= 2 else 0
    with torch.autocast("cpu", enabled=False):
        logp = torch.log_softmax(input, dim, dtype=input.dtype)
        w = weight.float() if weight is not None else None
        loss = F.nll_loss(logp.float(), target, w, ignore_index=ignore_index, reduction=reduction)
        if label_smoothing <= 0.0:
            return loss
        weighted = logp * w.view([-1] + [1] * (logp.dim() - dim - 1)) if w is not None else logp
        smooth = -weighted.sum(dim, dtype=torch.float32)
        smooth = smooth.masked_fill(target == ignore_index, 0.0)
        if reduction == "mean":
            kept = target != ignore_index
            # (no boolean indexing: its size depends on the data, which fake tensors cannot know)
            per = w[target.clamp(0, w.numel() - 1)] * kept if w is not None else kept
            smooth = smooth.sum() / per.sum()
        elif reduction == "sum":
            smooth = smooth.sum()
        return (1 - label_smoothing) * loss + smooth * (label_smoothing / input.size(dim))
