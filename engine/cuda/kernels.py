"""What CUDA kernels allocate inside themselves: cuDNN convolution and attention workspaces, per kernel call.

A fake tensor knows an op's outputs but not the scratch its kernel takes and frees before returning. For a CUDA
target each such call (a convolution forward or backward, a cuDNN / flash / memory-efficient attention backward)
is costed here, in this order of trust:
1. measured: the GPU's calibration profile (engine.cuda.gpu_profile) has this exact call (op, input shapes and dtypes,
   output bytes), measured on that GPU model with the same cuDNN major version: the largest scratch measured;
2. modelled: a rule fitted to the measured calls (resources/cuda_kernels.json), with a central figure and an upper
   bound that covers every measured call; the lower bound is 0 (cuDNN may pick an implicit-GEMM kernel that needs
   no workspace).
Attention backward kernels keep a float32 dQ accumulator and the softmax statistics as scratch (cuDNN's and
FlashAttention-2's backward alike); that rule is checked against the measured calls as well.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..config.gpus import GpuSpec
from ..core.resources import resource_path
from .gpu_profile import KERNEL_OPS, GpuProfile, Signature
from .reduce import REDUCTION_OPS, reduction_requests

_ALIGN = 512  # the caching allocator rounds every request up to 512 bytes
MIB = 1 << 20


@dataclass(frozen=True)
class KernelCost:
    """Scratch bytes of one kernel call: the figure used, its range, and whether it was measured.

    `requests`: the call's allocations in order, when the profile recorded them (engine.cuda.gpu_profile.KernelRecord);
    empty: `scratch` is one request after the outputs."""

    scratch: int
    low: int
    high: int
    measured: bool
    requests: tuple[int, ...] = ()


@lru_cache(maxsize=1)
def rules() -> dict[str, Any]:
    with open(resource_path("cuda_kernels.json"), encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _round(n: int) -> int:
    return ((max(0, int(n)) + _ALIGN - 1) // _ALIGN) * _ALIGN


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    size = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "uint8": 1,
            "bool": 1, "int8": 1}.get(dtype, 4)
    return int(math.prod(shape)) * size


def signature(args: Any, kwargs: Any) -> Signature:
    """The tensors an op is called with, as the measurements record them: ((shape, dtype), ...)."""
    return tuple(
        (tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""))
        for t in tree_flatten((args, kwargs or {}))[0]
        if isinstance(t, torch.Tensor)
    )


def output_bytes(out: Any) -> int:
    seen: dict[int, int] = {}
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


class KernelModel:
    """Scratch of the kernels of one target GPU: its profile (when it has one) and the fitted rules."""

    def __init__(self, cc: tuple[int, int], profile: GpuProfile | None = None, *, live: bool = False,
                 gpu: GpuSpec | None = None) -> None:
        self.cc = cc
        red = rules()["reduction"]
        self.sms = gpu.sm_count if gpu is not None else int(red["default_sm_count"])
        self.threads_per_sm = int(red["threads_per_sm"].get(f"{cc[0]}.{cc[1]}", red["default_threads_per_sm"]))
        self.profile = profile if profile is not None and tuple(profile.compute_capability) == tuple(cc) else None
        self._table = self.profile.table() if self.profile is not None else {}
        self.live = live  # the target GPU is this machine's: calls no profile has are run for real and measured
        self._live: dict[tuple[str, Signature, int], int] = {}
        self.measured_calls = 0
        self.modelled_calls = 0

    def cost(self, op: str, sig: Signature, out: int,
             measure: Callable[[], int | None] | None = None) -> KernelCost | None:
        """The scratch of one call of `op` (the tracer's name, 'convolution.default'), or None if it has none.

        `measure` runs the call for real on this machine's GPU (only asked when `live`)."""
        if op not in KERNEL_OPS:
            return None
        key = (op, sig, out)
        hit = self._table.get(key)
        if hit is not None:
            self.measured_calls += 1
            return KernelCost(hit.scratch, hit.scratch_min, hit.scratch, True, hit.requests)
        if self.live and measure is not None:
            real = self._live.get(key)
            if real is None:
                real = measure()
                if real is not None:
                    self._live[key] = real
            if real is not None:
                self.measured_calls += 1
                return KernelCost(real, real, real, True)
        cost = self._rule(op, sig, out)
        if cost is not None:
            self.modelled_calls += 1
        return cost

    def reduction(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
        """The staging buffer and semaphores a sum / mean kernel requests, in order (engine.cuda.reduce); empty for
        other ops and for reductions that stage nothing."""
        if op not in REDUCTION_OPS or not args or not isinstance(args[0], torch.Tensor):
            return ()
        t = args[0]
        dims = args[1] if op.endswith(("dim_IntList", ".dim")) and len(args) > 1 else kwargs.get("dim")
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if t.dim() == 0 or t.layout != torch.strided or t.is_nested:
            return ()
        # the accumulator: float32 below 64-bit floats, the dtype itself for doubles and complex, int64 for integers
        acc = t.element_size() if t.dtype == torch.float64 or t.is_complex() else 4 if t.is_floating_point() else 8
        return reduction_requests(tuple(t.shape), dims, acc, self.sms, self.threads_per_sm, tuple(t.stride()))

    def _rule(self, op: str, sig: Signature, out: int) -> KernelCost | None:
        r = rules()
        if op in ("convolution.default", "convolution_backward.default"):
            f = conv_features(op, sig, out)
            if f is None:
                return None
            xb, yb, wb, depthwise = f
            rule = r["convolution_forward" if op == "convolution.default" else "convolution_backward"]
            if depthwise:
                return KernelCost(0, 0, _round(rule["depthwise_high_mib"] * MIB), False)
            sized = rule["alpha"] * (xb + yb) + rule["beta"] * wb
            high = sized + rule["const_mib"] * MIB
            # the central figure: the median measured share of the bound, but never more than the median share of
            # the size-dependent part alone (a tiny convolution needs a tiny workspace)
            central = min(rule["central_of_bound"] * high, rule["central"] * sized)
            return KernelCost(_round(central), 0, _round(high), False)
        if op == "_transformer_encoder_layer_fwd.default" and len(sig) >= 2 and len(sig[0][0]) == 3:
            # the fused layer's intermediates: the feed-forward hidden layer and one more activation, or the
            # q/k/v projection and the attention output (../shared/gpu and benchmarks/gpu/h200 measurements)
            (b, s, d), dtype = sig[0]
            ff = next((w[0][0] for w in sig[2:] if len(w[0]) == 2 and w[0][1] == d and w[0][0] != d), 4 * d)
            elem = _nbytes((1,), dtype)
            rule = r["transformer_encoder_layer"]
            central = b * s * max(ff + d, 4 * d) * elem
            return KernelCost(_round(central), _round(b * s * max(ff, 3 * d) * elem),
                              _round(central * rule["high_factor"]), False)
        if op == "_scaled_dot_product_cudnn_attention.default":  # cuDNN's forward: a small workspace of its own
            n = int(r["cudnn_attention_forward"]["workspace_bytes"])
            return KernelCost(n, n, n, False)
        if op.endswith("attention_backward.default") and len(sig) >= 2:
            q = sig[1]  # grad_out, query, key, value, …
            if len(q[0]) != 4:
                return None
            b, h, s, d = q[0]
            rule = r["attention_backward"]
            dq = b * h * s * d * 4  # float32 dQ accumulator
            stats = b * h * s * 4  # softmax statistics (float32)
            # one request of both and a small header, which the allocator rounds (GPT-2's trace: 6,390,016 bytes)
            central = dq + stats + int(rule["extra_bytes"])
            return KernelCost(central, central, _round(central * rule["high_factor"]), False)
        return None


def conv_features(op: str, sig: Signature, out: int) -> tuple[int, int, int, bool] | None:
    """(input bytes, output bytes, weight bytes, depthwise) of a convolution call; None if it is not one."""
    if op == "convolution.default":
        if len(sig) < 2:
            return None
        x, w = sig[0], sig[1]
        yb = out
    else:
        if len(sig) < 3:
            return None
        g, x, w = sig[0], sig[1], sig[2]
        yb = _nbytes(*g)
    if len(x[0]) < 3 or len(w[0]) < 3:
        return None
    # one input channel per group with several channels in: a depthwise convolution (MobileNet), no workspace
    depthwise = w[0][1] == 1 and x[0][1] > 1
    return _nbytes(*x), yb, _nbytes(*w), depthwise
