"""Whether a real run of a step fits this machine: its estimate against the free host (or GPU) memory, checked
before `profile` runs it, so a step that cannot fit is refused in one line instead of meeting the OOM killer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..core.units import format_bytes
from ..measure.cpu_profiler import profile
from ..measure.real_fallback import available_host_memory
from ..models.source import ModelSource
from ..results.types import Estimate
from .estimator import estimate

# The share of free memory a measured step may take: the profiler's own records and the allocator's
# caching need the rest.
ROOM_SHARE = 0.8


def check_room(source: ModelSource, cfg: TrainConfig, on_gpu: bool, *, cancel: Any = None) -> None:
    """UserError when cfg's step, as estimated, needs more than ROOM_SHARE of the free host (or GPU) memory."""
    est = estimate(source, cfg, cancel=cancel)
    free: int | None
    if on_gpu:
        free = torch.cuda.mem_get_info()[0]
        need = est.gpu.reserved_bytes if est.gpu is not None else est.peak_bytes
        where = f"free memory of {torch.cuda.get_device_name()}"
    else:
        free = available_host_memory()
        need = est.peak_bytes
        where = "this machine's free host memory"
    if free is not None and need > ROOM_SHARE * free:
        raise UserError(f"the step needs about {format_bytes(need)} (estimated), more than {ROOM_SHARE:.0%} of "
                        f"{where} ({format_bytes(free)}); lower --batch-size, or use `estimate` instead",
                        where="profile")


def profile_within_room(source: ModelSource, cfg: TrainConfig, *, cancel: Any = None,
                        progress: Callable[[float, str], None] | None = None) -> Estimate:
    """engine.measure.cpu_profiler.profile, after the step's estimate: a model error is the same one line as `estimate`
    gives, and a step that cannot fit this machine is refused before it runs."""
    on_gpu = cfg.device == "cuda" and torch.cuda.is_available()
    check_room(source, cfg if on_gpu else cfg.with_(device="cpu", gpu=None), on_gpu, cancel=cancel)
    return profile(source, cfg, cancel=cancel, progress=progress)
