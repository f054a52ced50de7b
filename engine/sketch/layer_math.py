"""Closed-form sizes with no sketch needed: bytes per element of a precision, the optimizer's state, parameter
counts of linear, convolution and batch-norm layers, a convolution's output shape, a tensor's bytes."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..config.optimizers import OPTIMIZER_TABLE
from ..core.errors import UserError
from .layer_types import conv_out_len

IntOrInts = int | tuple[int, ...] | list[int]  # a size given once for every dimension, or per dimension


def dtype_bytes(precision: str) -> int:
    """Bytes per element of parameters for a precision: fp32 and amp-* 4 (fp32 weights), fp16/bf16 2."""
    if precision in ("fp16", "bf16"):
        return 2
    if precision in ("fp32", "amp-fp16", "amp-bf16"):
        return 4
    raise UserError(f"unknown precision '{precision}'")


def optimizer_state_bytes(n_params: int, optimizer: str, precision: str = "fp32") -> int:
    """State the optimizer keeps: sgd 0, sgd-momentum 1×, adam/adamw 2×, rmsprop 1×, adagrad 1× the params
    (in the parameters' dtype: fp32 under AMP, whose parameters are the fp32 master weights)."""
    if optimizer not in OPTIMIZER_TABLE:
        raise UserError(f"unknown optimizer '{optimizer}'")
    spec = OPTIMIZER_TABLE[optimizer]
    return spec.state_per_param * n_params * (spec.state_bytes or dtype_bytes(precision))


def linear_params(in_features: int, out_features: int, bias: bool = True) -> int:
    """in·out + out: Linear(512, 256) = 131,328."""
    return in_features * out_features + (out_features if bias else 0)


def conv_params(in_channels: int, out_channels: int, kernel_size: IntOrInts, groups: int = 1, bias: bool = True) -> int:
    """out·(in/groups)·∏k + out: Conv2d(3, 64, 3) = 1,792; Conv2d(64, 128, 3) = 73,856."""
    k = kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size, kernel_size)
    return out_channels * (in_channels // groups) * math.prod(k) + (out_channels if bias else 0)


def batchnorm_params(num_features: int) -> tuple[int, int]:
    """(parameters, buffer elements): weight + bias = 2C; running mean + var (2C) and a step counter."""
    return 2 * num_features, 2 * num_features + 1


def conv_output_shape(in_size: IntOrInts, kernel_size: IntOrInts, stride: IntOrInts = 1, padding: IntOrInts = 0,
                      dilation: IntOrInts = 1) -> tuple[int, ...]:
    """Spatial output size: floor((n + 2p − d(k−1) − 1)/s) + 1 per dimension; 224, k7, s2, p3 → 112."""
    sizes = tuple(in_size) if isinstance(in_size, (tuple, list)) else (in_size,)
    n = len(sizes)

    def rep(v: IntOrInts) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n

    return tuple(conv_out_len(s, k, st, p, d) for s, k, st, p, d in
                 zip(sizes, rep(kernel_size), rep(stride), rep(padding), rep(dilation), strict=False))


def tensor_bytes(shape: Sequence[int], bytes_per_element: int = 4) -> int:
    """∏shape · bytes: 64×64×112×112 fp32 = 205,520,896 B (≈196 MiB)."""
    return math.prod(shape) * bytes_per_element
