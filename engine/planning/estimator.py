"""The one entry point every view uses: a model source and a configuration in, an Estimate out."""

from __future__ import annotations

import time
from dataclasses import replace

from ..config.train_config import TrainConfig
from ..core.gc_scope import older_objects_set_aside
from ..core.progress import CancelToken, Progress
from ..measure.real_fallback import run_for_real
from ..models.source import ModelSource
from ..results.estimate_fields import GpuOrigin
from ..results.types import Estimate, Trace
from ..trace.recorded_step import ModelInfo
from ..trace.summary import summarise
from ..trace.tracer import trace_model


def estimate(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> Estimate:
    """Peak memory of cfg's step of the model, traced exactly on fake tensors (no real memory taken).

    For a CUDA target the caching allocator, context and workspaces are added (engine.cuda.device_model); with
    several GPUs the figures are per rank (engine.parallel.sharding).
    """
    return traced_estimate(source, cfg, cancel=cancel, progress=progress)[0]


def traced_estimate(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                    progress: Progress | None = None
                    ) -> tuple[Estimate, Trace, ModelInfo, TrainConfig, GpuOrigin]:
    """`estimate`'s answer with what it came from: the trace, the model's facts, the configuration as traced (its
    target GPU filled in) and where that GPU came from (engine.planning.reuse keeps them for the planner)."""
    t0 = time.perf_counter()
    cfg, origin = with_target_gpu(cfg)
    with older_objects_set_aside():  # its full garbage collections walk only what it makes (engine.core.gc_scope)
        trace, info = trace_model(source, cfg, cancel=cancel, progress=progress, real_run=run_for_real)
        est = estimate_of_trace(trace, info, cfg, origin=origin, t0=t0, progress=progress)
    return est, trace, info, cfg, origin


def with_target_gpu(cfg: TrainConfig) -> tuple[TrainConfig, GpuOrigin]:
    """(cfg, where its GPU comes from): a CUDA target without a GPU named is this machine's GPU 0, when it has one."""
    if cfg.device == "cuda" and not cfg.gpu:
        from ..config.gpus import local_gpu

        local = local_gpu(0)
        if local is not None:  # no --gpu: the GPU of this machine is the target
            return cfg.with_(gpu=local.name), "this machine's GPU 0"
    return cfg, "named"


def estimate_of_trace(trace: Trace, info: ModelInfo, cfg: TrainConfig, *, origin: GpuOrigin = "named",
                      t0: float | None = None, progress: Progress | None = None) -> Estimate:
    """The Estimate of a traced step (the canonical one, or a user's own: engine.trace.user_step): the summary, then
    what the target adds (generation's figures, the ranks' shares, the GPU's allocator, context and workspaces)."""
    t0 = time.perf_counter() if t0 is None else t0
    est = summarise(trace, info, cfg, elapsed_s=time.perf_counter() - t0)
    if cfg.generating:
        from ..trace.text_generation import generation_figures

        est = replace(est, generation=generation_figures(trace, cfg))
    if info.cuda_kernels is not None or origin != "named":
        est = replace(est, gpu_origin=origin, cuda_kernels=info.cuda_kernels)
    sharded = cfg.world_size > 1 or cfg.tp > 1
    if sharded:
        from ..parallel.sharding import rank_trace, sharded_estimate

        # per rank: the timeline scaled by category, then the allocator replayed over the rank's own trace
        single = est
        est = sharded_estimate(single, cfg)
        if cfg.device == "cuda":
            from ..cuda.device_model import with_gpu

            rtrace, rextras = rank_trace(trace, single, cfg)
            est = with_gpu(rtrace, est, cfg, rank_extras=rextras)
    elif cfg.device == "cuda":
        from ..cuda.device_model import with_gpu

        est = with_gpu(trace, est, cfg)
    if progress:
        progress(1.0, "done")
    return replace(est, elapsed_s=time.perf_counter() - t0)
