"""The global-memory scratch of PyTorch's CUDA reduction kernels (sum, mean), which a fake tensor cannot show.

A reduction over many inputs per output (a bias gradient: the sum of a (tokens, features) gradient over its tokens)
is split across thread blocks, which stage their partial results in a buffer and count finished blocks in
semaphores, both taken from the caching allocator for the call and freed when it returns. Their size follows from
ATen's launch configuration (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig and ReduceConfig's
global_memory_size / semaphore_size), replicated here for a contiguous input: the TensorIterator's geometry
(reduced dimensions first, adjacent ones merged), the block shape, and how many blocks share one output, which
depends on the GPU's multiprocessor count and threads per multiprocessor (resources/cuda_kernels.json,
"reduction"). Checked against every sum measured on an H200 (benchmarks/gpu/h200/ops-*.jsonl.gz): a (8192, 512)
float32 bias gradient takes 32 MiB + 512 bytes; a (16, 256, 8000) fp16 one 132.8 MiB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

REDUCTION_OPS = frozenset({"sum.dim_IntList", "mean.dim", "sum.default", "mean.default"})
MAX_THREADS = 512  # ReduceConfig::MAX_NUM_THREADS
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
VT0 = 4  # gpu_reduce_kernel's default values per thread and input vector size


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(1, n).bit_length() - 1))


def _geometry(shape: Sequence[int], strides: Sequence[int] | None,
              dims: Sequence[int]) -> list[tuple[int, int, int, bool]]:
    """The TensorIterator's dimensions for reducing a tensor of `shape` (and `strides`, contiguous when None) over
    `dims` (all when empty): reduced dimensions first, each group fastest first, neighbours in memory merged.
    Entries: (size, input stride, output stride, reduced), strides in elements; the output is contiguous."""
    n = len(shape)
    reduced = {d % n for d in dims} if dims else set(range(n))
    in_stride = list(strides) if strides is not None else [math.prod(shape[d + 1:]) for d in range(n)]
    kept = [d for d in range(n) if d not in reduced]
    out_stride = {d: math.prod(shape[k] for k in kept if k > d) for d in kept}
    order = sorted((d for d in range(n) if d in reduced and shape[d] != 1), key=lambda d: (in_stride[d], -d)) + \
        sorted((d for d in range(n) if d not in reduced and shape[d] != 1), key=lambda d: (in_stride[d], -d))
    out: list[tuple[int, int, int, bool]] = []
    for d in order:
        red = d in reduced
        if out:
            size, ins, outs, last = out[-1]
            if last == red and in_stride[d] == ins * size and (red or out_stride[d] == outs * size):
                out[-1] = (size * shape[d], ins, outs, red)  # the next slower dimension, adjacent in memory: merged
                continue
        out.append((shape[d], in_stride[d], 0 if red else out_stride[d], red))
    return out


def reduction_requests(shape: Sequence[int], dims: Sequence[int], acc_itemsize: int, sms: int,
                       threads_per_sm: int, strides: Sequence[int] | None = None) -> tuple[int, ...]:
    """The kernel's two requests, in order, as it makes them: the staging buffer, then the semaphores (a few bytes,
    from the small pool), both freed when it returns — the H200's GPT-2 trace shows each pair (12,582,912 then 24
    bytes; 50,331,648 then 96). Empty when the kernel stages nothing (one block per output)."""
    geo = _geometry(shape, strides, dims)
    n_red = sum(1 for g in geo if g[3])
    outputs = math.prod(g[0] for g in geo if not g[3])
    inputs = math.prod(g[0] for g in geo if g[3])
    if not geo or inputs <= 1:
        return ()
    on_fastest = n_red == len(geo) or geo[0][1] < geo[n_red][1]
    if on_fastest:
        dim0, dim1, fastest = inputs, outputs, geo[0][1]
    else:
        dim0, dim1, fastest = outputs, inputs, geo[n_red][1]
    vec = 1
    if fastest == 1:
        if on_fastest and dim0 > 128 and n_red == 1:
            dim0 //= VT0  # vectorised along the input
        elif not on_fastest:
            vec = 4  # vectorised along the output: as wide as the output's sizes and strides allow
            for v in [geo[n_red][0]] + [g[2] for i, g in enumerate(geo) if i != n_red]:
                while v % vec:
                    vec //= 2
            dim0 //= vec
    most = MAX_THREADS // vec
    d0 = _last_pow2(dim0) if dim0 < most else most
    d1 = _last_pow2(dim1) if dim1 < most else most
    width = min(d0, WARP)
    height = min(d1, most // width)
    width = min(d0, most // height)
    threads = width * height
    step_in, step_out = (width, 1) if on_fastest else (1, width)
    across_warps = _div_up(inputs, step_in) >= min(height * 16, MAX_VALUES_PER_THREAD)
    if across_warps:
        step_in *= height
    else:
        step_out *= height
    per_thread = _div_up(inputs, step_in)
    grid = _div_up(outputs // vec, step_out)
    target = sms * (threads_per_sm // threads)
    if not (across_warps and per_thread >= MAX_VALUES_PER_THREAD and grid <= target):
        return ()
    ctas = max(min(_div_up(target, grid), _div_up(per_thread, MIN_VALUES_PER_THREAD)),
               _div_up(per_thread, MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return ()
    buffer = acc_itemsize * outputs * ctas * (1 if on_fastest else width * vec)
    semaphores = 4 * grid
    return (buffer, semaphores)
