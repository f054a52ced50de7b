"""When fake tensors cannot trace a step (an op whose output size depends on the data), the step is run for real on
the CPU and measured by the profiler (engine.measure.cpu_profiler), if the model is small enough for this machine. The
tracer (engine.trace.tracer) is handed `run_for_real` by its callers (engine.planning.estimator) and never imports the
profiler itself.
"""

from __future__ import annotations

import os

from ..config.train_config import TrainConfig
from ..core.errors import UserError
from ..core.progress import CancelToken
from ..models.source import ModelSource
from ..results.types import Trace
from ..trace.recorded_step import ModelInfo
from .cpu_profiler import measure_cpu

REAL_FALLBACK_LIMIT = 2 * 1024**3  # parameter bytes under which a data-dependent model is run for real


def run_for_real(source: ModelSource, cfg: TrainConfig, info: ModelInfo, err: Exception,
                 cancel: CancelToken | None, partial_peak: int = 0) -> tuple[Trace, ModelInfo]:
    """Fake tensors cannot know how big a data-dependent output is: run the step for real on the CPU,
    measured by the profiler (engine.measure.cpu_profiler), when the model is small enough for this machine.

    `partial_peak` is what the fake trace had reached before the data-dependent op: the real run needs at
    least that, and the parameters' training state besides; both must fit in half the free host memory."""
    need = max(partial_peak, 0) + (4 if cfg.training else 1) * 4 * info.parameters
    free = available_host_memory()
    if 4 * info.parameters > REAL_FALLBACK_LIMIT or (free is not None and need > free // 2):
        raise UserError(
            f"the model uses an op whose output size depends on the data ({err}); running it for real would "
            f"need at least {need / 1024**3:.1f} GiB of host memory, more than this machine can spare"
        )
    trace, real_info, _peak = measure_cpu(source, cfg, cancel=cancel)
    real_info.notes = info.notes + ["an op's output size depends on the data: measured with a real run on the CPU"]
    return Trace(events=trace.events, source="tracer", device=cfg.device), real_info


def available_host_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
