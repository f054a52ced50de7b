"""What the CPU's own kernels add that fake tensors cannot know: oneDNN scratch space and workspaces.

A few ops (convolutions, oneDNN RNN layers) allocate scratch inside the kernel, or return a workspace whose
size only oneDNN decides. For the CPU target each distinct call of such an op is run once for real, on
zero tensors of the same shapes, under the profiler: its transient scratch and its true output sizes are
measured and cached by signature.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch._C._autograd import _ProfilerResult
from torch._C._profiler import _ExtraFields_Allocation
from torch._ops import OpOverload
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

PROBED_OPS = frozenset(
    {
        "convolution.default",
        "convolution_backward.default",
        "mkldnn_rnn_layer.default",
        "mkldnn_rnn_layer_backward.default",
        "_transformer_encoder_layer_fwd.default",
        "_native_multi_head_attention.default",
        "_scaled_dot_product_flash_attention_for_cpu.default",
        "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    }
)
# Reductions the CPU computes in fp32 for half-precision inputs (a float copy of the input inside the kernel).
HALF_REDUCTIONS = frozenset({"mean.dim", "mean.default", "sum.dim_IntList", "sum.default"})
# Matrix products in half precision: a CPU without native bf16 arithmetic (no AVX512_BF16 or AMX) has oneDNN
# accumulate into an fp32 copy of the output inside the kernel (measured on an AVX-512 Xeon: twice the bf16
# output's bytes); with native support it takes nothing. Measured per shape, so both come out right.
HALF_MATMULS = frozenset({"mm.default", "addmm.default", "bmm.default", "baddbmm.default"})
PROBE_LIMIT = 1 << 30  # bytes of real inputs above which an op is not probed

_Sig = tuple[object, ...] | str
_cache: dict[tuple[str, _Sig, _Sig], tuple[int, tuple[int, ...]] | None] = {}


def _sig(x: object) -> _Sig:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype))
    if isinstance(x, (list, tuple)):
        return tuple(_sig(v) for v in x)
    return repr(x)


def _real(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).zero_()
    return x


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """The profiler's C++ side prints a line to stderr at each start and stop; keep the user's terminal clean."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def probe(func: OpOverload[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], strict: bool = True
          ) -> tuple[int, tuple[int, ...]] | None:
    """(scratch bytes beyond the outputs, real nbytes of each tensor output), or None if not probed. Not `strict`:
    None too where the real kernel refuses the arguments (a meta kernel's output dtype the CPU's differs from, such
    as a bf16 batch norm's saved statistics, met by the backward)."""
    key = (func.__name__, _sig(args), _sig(kwargs))
    if key in _cache:
        return _cache[key]
    flat, _ = tree_flatten((args, kwargs))
    if sum(t.untyped_storage().nbytes() for t in flat if isinstance(t, torch.Tensor)) > PROBE_LIMIT:
        return None
    with _disable_current_modes():
        rargs = tree_map(_real, args)
        rkwargs = tree_map(_real, kwargs)
        with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            try:
                out = func(*rargs, **rkwargs)
            except Exception:  # noqa: BLE001 - not strict: any refusal of the real kernel leaves the call unprobed
                if strict:
                    raise
                _cache[key] = None
                return None
        cur = peak = 0
        for ev in sorted(_alloc_events(prof), key=lambda e: e[0]):
            cur += ev[1]
            peak = max(peak, cur)
        outs = tuple(t.untyped_storage().nbytes() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        # (an in-place op's output is its input, there before the profile began: its storage is no allocation)
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((rargs, rkwargs))[0]
                 if isinstance(t, torch.Tensor)}
        kept = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given}.values())
    result = (max(0, peak - kept), outs)
    _cache[key] = result
    return result


def kineto_results(prof: profile) -> _ProfilerResult:
    """The records of a finished `torch.profiler.profile` run (its event tree, its memory timeline)."""
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise RuntimeError("the profiler has not run: its results are read after its `with` block")
    return results


def _alloc_events(prof: profile) -> Iterator[tuple[int, int]]:
    stack = list(kineto_results(prof).experimental_event_tree())
    while stack:
        ev = stack.pop()
        stack.extend(ev.children)
        fields = ev.typed[1]
        if isinstance(fields, _ExtraFields_Allocation) and fields.device.type == "cpu":
            yield ev.start_time_ns, fields.alloc_size
