"""nn.LSTM and nn.GRU as cuDNN runs them on the CUDA target, while tracing on fake CPU tensors.

On a GPU one cuDNN call runs every layer and time step: it returns the output, the last hidden (and cell) state
and a *reserve* buffer kept for the backward, and takes a workspace it frees before returning; the backward takes
another workspace and returns the input's, states' and weights' gradients. The CPU instead runs the layers step by
step and saves different intermediates. Here the call is replaced by an autograd function that allocates what
cuDNN does, including its time-major output (with batch_first the module returns a transposed view, which the next
Linear copies, as the H200 showed). Its requests come in the order PyTorch's RNN.cpp makes them: the time-major
copy of a batch-first input, the output and states, the workspace, then the reserve (the workspace and the copy freed
on return); under autocast the weights are first cast into one flat half-precision buffer. The reserve and workspace
sizes are rules of the problem's size
unit = layers × time steps × batch × hidden × directions × element size (resources/cuda_kernels.json, "cudnn_rnn"),
learned from the H200 measurements: the lstm-lm template (../shared/gpu) and the held-out LSTM and GRU language
models (benchmarks/gpu/h200/ops-heldout.jsonl.gz), so those two are no longer blind tests of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kernels import KernelCost, rules

# the fused RNN entries nn.LSTM / nn.GRU call, looked up once: each `torch._VF.x` goes through a module __getattr__,
# and is_rnn runs on every torch call the CUDA target sees
RNN_ENTRIES: dict[Any, str] = {torch._VF.lstm: "lstm", torch._VF.gru: "gru"}


def is_rnn(func: Any) -> str | None:
    """'lstm' / 'gru' when `func` is the fused RNN entry nn.LSTM / nn.GRU call, else None."""
    try:
        return RNN_ENTRIES.get(func)
    except TypeError:  # an unhashable callable (a user's own object handed to handle_torch_function)
        return None


def sizes(mode: str, layers: int, steps: int, batch: int, hidden: int, dirs: int, elem: int) -> tuple[int, int]:
    """(reserve bytes, workspace bytes) of one cuDNN call."""
    r = rules()["cudnn_rnn"]
    unit = layers * steps * batch * hidden * dirs * elem
    reserve = int(r["reserve_per_unit"][mode] * unit)
    workspace = int(r["workspace_per_unit"][mode] * unit + r["workspace_const_mib"] * (1 << 20))
    return reserve, workspace


def spread_of(dirs: int) -> float:
    """How far one call's reserve and workspace may be from the rule, as a fraction of the figure: the measured
    spread for one direction; for two, the wider band of a rule never measured on bidirectional stacks (PyTorch's
    RNN.cpp makes the same requests per call whatever the direction count, but their sizes come from cuDNN's
    cudnnGetRNNTempSpaceSizes, which also reads each layer's input width: 2 × hidden above the first layer)."""
    r = rules()["cudnn_rnn"]
    return float(r["spread"] if dirs == 1 else r["spread_bidirectional"])


def _time_major_copy(t: torch.Tensor, batch_first: bool) -> torch.Tensor | None:
    """The contiguous time-major copy cuDNN's entry makes of a batch-first tensor (`input.transpose(0, 1)
    .contiguous()`), held until the call returns; None where the transposed view is already contiguous."""
    tm = t.transpose(0, 1) if batch_first else t
    return None if tm.is_contiguous() else torch.empty(tm.shape, dtype=t.dtype, device=t.device)


class _CudnnRNN(torch.autograd.Function):
    """What PyTorch's `_cudnn_rnn` / `_cudnn_rnn_backward` (aten/src/ATen/native/cudnn/RNN.cpp) allocate, in their
    order: the forward takes the time-major input copy, the output and final states, then the workspace, then the
    reserve, and frees the workspace and the copy on return. The backward holds zeros for the states' gradients
    nobody produced; its data pass takes the input and output-gradient copies, dx and the states' gradients and a
    workspace; its weight pass another input copy, one flat zeroed weight gradient (each parameter's gradient is a
    view of it) and a workspace."""

    @staticmethod
    def forward(ctx: Any, meta: dict[str, Any], input: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                *weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        steps, batch, width = meta["out_shape"]
        x = _time_major_copy(input, meta["batch_first"])
        out = input.new_empty((steps, batch, width))  # cuDNN writes time-major: batch_first gets a transposed view
        if meta["batch_first"]:
            out = out.transpose(0, 1)
        hy = h0.new_empty(h0.shape)
        cy = c0.new_empty(c0.shape) if c0.numel() else c0.new_empty(0)
        scratch = input.new_empty(meta["workspace"], dtype=torch.uint8)
        reserve = input.new_empty(meta["reserve"], dtype=torch.uint8) if meta["train"] else input.new_empty(0)
        del scratch, x  # the workspace and the input copy, freed before the call returns
        ctx.meta = meta
        ctx.save_for_backward(input, h0, c0, out, reserve, *weights)
        return out, hy, cy

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, h0, c0, _out, _reserve, *weights = ctx.saved_tensors
        meta = ctx.meta
        # the data pass (_cudnn_rnn_backward_input)
        x = _time_major_copy(input, meta["batch_first"])
        dy = _time_major_copy(grads[0], meta["batch_first"])
        dx = torch.empty_like(input, memory_format=torch.contiguous_format)
        dh0 = torch.empty_like(h0)
        dc0 = torch.empty_like(c0) if c0.numel() else None
        scratch = input.new_empty(meta["workspace"], dtype=torch.uint8)
        del scratch, dy, x
        # the weight pass (_cudnn_rnn_backward_weight): one flat gradient, the parameters' gradients views of it
        x = _time_major_copy(input, meta["batch_first"])
        trained = [w for w in weights if w.requires_grad]
        flat = (weights[0].new_zeros(sum(w.numel() for w in trained)) if trained else None)
        scratch = input.new_empty(meta["workspace"], dtype=torch.uint8)
        del scratch, x
        views = iter(_views(flat, trained)) if flat is not None else iter(())
        dws = [next(views) if w.requires_grad else None for w in weights]
        return (None, dx, dh0, dc0, *dws)


def _views(flat: torch.Tensor, weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` cut into consecutive views shaped as `weights` (cuDNN's one flat weight buffer)."""
    views, at = [], 0
    for w in weights:
        views.append(flat[at:at + w.numel()].view(w.shape))
        at += w.numel()
    return views


class _CastReflatten(torch.autograd.Function):
    """CUDA autocast's `_cudnn_rnn_cast_reflatten`: the fp32 weights cast into one flat zeroed buffer of the
    lower precision (each weight a view of it), as the H200's op record shows (one zeros of the whole weight size,
    then a copy into each view); their gradients go back cast to each weight's dtype, the last weight's first."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = weights[0].new_zeros(sum(w.numel() for w in weights), dtype=dtype)
        ctx.dtypes = [w.dtype for w in weights]
        return tuple(_views(flat, weights))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # one copy's backward per weight, which autograd runs last weight first
        back = [g.to(dt) for g, dt in reversed(list(zip(grads, ctx.dtypes, strict=True)))]
        return (None, *reversed(back))


def cast_reflatten(params: list[torch.Tensor] | tuple[torch.Tensor, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """The RNN's weights as CUDA autocast hands them to cuDNN in `dtype`: one flat buffer (unchanged when they are
    not all fp32 tensors)."""
    if not params or not all(isinstance(w, torch.Tensor) and w.dtype == torch.float32 for w in params):
        return list(params)
    return list(_CastReflatten.apply(dtype, *params))  # type: ignore[no-untyped-call]


def cudnn_rnn(mode: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              costs: list[KernelCost] | None) -> tuple[torch.Tensor, ...] | None:
    """nn.LSTM's / nn.GRU's `_VF.lstm(...)` / `_VF.gru(...)` as cuDNN allocates it, or None (packed sequences and
    other forms stay on the traced path)."""
    if kwargs or len(args) != 9:
        return None
    input, hx, params, has_biases, layers, _dropout, train, bidirectional, batch_first = args
    if not isinstance(input, torch.Tensor) or input.dim() != 3 or not isinstance(params, (list, tuple)):
        return None
    if mode == "lstm":
        if not isinstance(hx, (list, tuple)) or len(hx) != 2:
            return None
        h0, c0 = hx
    else:
        if not isinstance(hx, torch.Tensor):
            return None
        h0, c0 = hx, input.new_empty(0)
    if h0.dim() != 3 or (mode == "lstm" and c0.shape[-1] != h0.shape[-1]):
        return None  # an LSTM with projections: left to the traced path
    dirs = 2 if bidirectional else 1
    steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    hidden = h0.shape[-1]
    out_shape = (steps, batch, hidden * dirs)
    reserve, workspace = sizes(mode, int(layers), int(steps), int(batch), int(hidden), dirs, input.element_size())
    if costs is not None:
        spread = spread_of(dirs)
        for n in (workspace, reserve):
            costs.append(KernelCost(n, int(n * (1 - spread)), int(n * (1 + spread)), False))
    meta = {"out_shape": out_shape, "reserve": reserve, "workspace": workspace, "train": bool(train),
            "batch_first": bool(batch_first)}
    out, hy, cy = _CudnnRNN.apply(meta, input, h0, c0, *params)  # type: ignore[no-untyped-call]
    return (out, hy, cy) if mode == "lstm" else (out, hy)
