"""`vramscope.estimate_step(step, *args, **kwargs)`: the memory of the user's own training step (their loss, their
optimizers, clipping, accumulation, schedulers), traced as the canonical step is, into the same Estimate."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.config.train_config import Device, TrainConfig
from engine.core.errors import UserError
from engine.planning.estimator import estimate_of_trace, with_target_gpu
from engine.results.types import Estimate
from engine.trace.user_step import trace_user_step

from .options import IMPLIED, OPTIONS

STEP_OPTIONS = ("device", "gpu", "alloc_conf")


def estimate_step(step: Callable[..., Any], *args: Any, device: Device = "cuda", gpu: str | None = None,
                  alloc_conf: str | None = None, **kwargs: Any) -> Estimate:
    """Peak memory of your own step: `step(*args, **kwargs)` is called twice (the second call is the steady state,
    with the optimizers' state already made) on fake copies of the models, optimizers, LR schedulers and tensors in
    its arguments, under VRAMScope's tracer; nothing real is trained and no memory is taken. Returns the Estimate
    `vramscope estimate` gives, with the same categories and timeline; for a CUDA target (`device`, `gpu` as in the
    CLI) the allocator's reserve, the CUDA context, workspaces and the verdict too. The step itself is described in
    `Estimate.step`.

    The step must reach its models and optimizers through its arguments (a bound method's object counts), and
    may not need tensors' values (`.item()`, printing, data-dependent shapes): fake tensors have none. Its
    `torch.autocast("cuda", …)` is honoured for a CUDA target. A failure is engine.core.errors.UserError, one line
    naming your line."""
    own = [k for k in kwargs if (k in OPTIONS or k in IMPLIED) and not _accepts(step, k)]
    if own:
        raise UserError(f"vramscope.estimate_step: {own[0]}= is set by your step itself, which is traced as it is; "
                        f"the estimate's options are {', '.join(f'{o}=' for o in STEP_OPTIONS)}")
    if not callable(step):
        raise UserError(f"vramscope.estimate_step: the step must be a function; got {type(step).__name__}")
    t0 = time.perf_counter()
    if gpu is not None and device == "cpu":
        raise UserError(f"vramscope.estimate_step: gpu={gpu!r} asks for a GPU verdict, which device='cpu' has none "
                        "of; drop one of them")
    cfg, origin = with_target_gpu(TrainConfig(device=device, gpu=gpu, alloc_conf=alloc_conf))
    trace, info, program, cfg = trace_user_step(step, args, kwargs, cfg)
    est = estimate_of_trace(trace, info, cfg, origin=origin, t0=t0)
    return replace(est, step=program)


def _accepts(step: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(step).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
