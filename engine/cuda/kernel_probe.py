"""Running one traced kernel call for real on this machine's GPU (zero tensors of the traced shapes), for estimates
whose target GPU is this machine's: their kernel scratch is measured, not modelled. The recorder
(engine.trace.recorder) calls it; the calibrate command (engine.measure.calibrate) learns whole profiles instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

PROBE_LIMIT = 1 << 30  # bytes of inputs above which a kernel call is not run for real (the rule costs it)
PROBE_HEADROOM = 1 << 30  # free GPU memory left untouched when a kernel call is measured


def measure_kernel(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device_index: int = 0) -> int | None:
    """Scratch of one kernel call run for real on this machine's GPU (zero tensors of the same shapes and strides):
    the peak inside it minus the larger of before and after. None when it cannot run here, or when its inputs are
    over 1 GiB or would leave under 1 GiB of the GPU free (a training run may be using it)."""
    try:
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        need = sum(t.untyped_storage().nbytes() for t in flat)
        if need > PROBE_LIMIT:
            return None
        free, _total = torch.cuda.mem_get_info(device_index)
        if free < 2 * need + PROBE_HEADROOM:  # never crowd out what else runs on this GPU
            return None

        def real(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=f"cuda:{device_index}").zero_()
            return x

        with _disable_current_modes():
            rargs, rkwargs = tree_map(real, args), tree_map(real, kwargs)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*rargs, **rkwargs)
            torch.cuda.synchronize()
            peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
            del out, rargs, rkwargs
        return max(0, peak - max(before, after))
    except Exception:  # noqa: BLE001 - out of memory, an op that needs real values: fall back on the model
        return None
