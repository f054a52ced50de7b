"""Questions answered over the estimator: the largest batch that fits a budget, the longest context, and ranked
changes that make a model fit (AMP, checkpointing, accumulation, a lighter or 8-bit optimizer, LoRA/QLoRA,
sharding, a smaller input), each with the bytes it saves — from a real re-estimate wherever the engine can trace
the change, else an analytic figure, labelled so.

The levers live in engine/planning/levers.py (generation's in engine/planning/generation_advice.py); a change of
optimizer is answered from the traced step (engine/planning/reuse.py); the candidates needing their own trace can be
traced at once in worker processes (engine/planning/pool.py). This module searches and ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.progress import CancelToken, Progress
from ..core.units import format_bytes
from ..models.source import ModelSource
from ..results.types import Estimate
from .levers import (
    Planning,
    Recommendation,
    accumulation,
    adafactor_state_bytes,
    adapters,
    checkpointing,
    estimate_of_config,
    fine_tuned,
    input_size,
    mixed_precision,
    optimizers,
    sharding,
)
from .pool import Lever, can_fork_workers, forks_workers, pooled, wanted_traces
from .reuse import TracedStep, traced_step, with_optimizer

__all__ = ["FIGURES", "MIN_SAVING_FRACTION", "MaxBatchResult", "MaxContextResult", "Recommendation",
           "adafactor_state_bytes", "figure_of", "fine_tuned", "max_batch", "max_context", "recommend"]

FIGURES = ("peak", "reserved", "nvidia_smi")


def _resolved(source: ModelSource | str) -> ModelSource:
    """`source` itself, or the model a name or path stands for."""
    if isinstance(source, str):
        from ..models.sources import resolve_source

        return resolve_source(source)
    return source


def _stepper(source: ModelSource | str, cancel: CancelToken | None,
             estimator: Callable[[TrainConfig], Estimate] | None) -> Callable[[TrainConfig], Estimate]:
    """What answers a configuration's estimate: `estimator` where given, else a traced step of `source` (a name is
    resolved once, here)."""
    if estimator is not None:
        return estimator
    model = _resolved(source)
    return lambda c: estimate_of_config(model, c, cancel)


def figure_of(est: Estimate, figure: str = "peak") -> int:
    """The number a budget is compared with: live tensor peak, predicted reserved, or predicted nvidia-smi."""
    if figure == "peak" or est.gpu is None:
        return est.peak_bytes
    if figure == "reserved":
        return est.gpu.reserved_bytes
    if figure == "nvidia_smi":
        return est.gpu.nvidia_smi_bytes
    raise UserError(f"unknown figure '{figure}'; choose one of: {', '.join(FIGURES)}")


def _check(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


@dataclass(frozen=True)
class _SearchResult:
    """What the max-batch and max-context results share: their fields as JSON, `tried` (the (value searched,
    figure) pair of every trace, in order) as lists of pairs."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tried"] = [list(t) for t in d["tried"]]
        return d


# --------------------------------------------------------------------------------------------------- max batch


@dataclass(frozen=True)
class MaxBatchResult(_SearchResult):
    batch_size: int
    peak_bytes: int  # the compared figure at batch_size
    traces_run: int
    fits_at_next: bool  # always False: the estimate at batch_size + 1 exceeds the budget
    peak_next: int | None  # the figure at batch_size + 1 (None when the search stopped at max_batch_size)
    budget_bytes: int
    figure: str = "peak"
    tried: tuple[tuple[int, int], ...] = ()  # (batch, figure) of every trace, in order


def max_batch(
    source: ModelSource | str,
    cfg: TrainConfig,
    budget_bytes: int,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    figure: str = "peak",
    max_batch_size: int = 1 << 20,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
    knob: str = "batch_size",
    noun: str = "batch size",
    second: int = 2,
) -> MaxBatchResult:
    """Largest batch whose estimated figure ≤ budget (it fits at N, not at N+1), with few traces.

    Memory is nearly affine in the batch: fit it from two traces, jump to the prediction, then verify with
    exact traces at the answer and the answer + 1, refitting (or bisecting) if the prediction was off.
    `knob` names another TrainConfig field searched the same way (max_context: the prompt or sequence length),
    `noun` what it is called in messages, `second` the second value traced after 1.
    """
    if budget_bytes <= 0:
        raise UserError(f"the budget must be positive, got {budget_bytes} bytes", where="--budget")
    run = _stepper(source, cancel, estimator)
    values: dict[int, int] = {}
    order: list[tuple[int, int]] = []

    def value(b: int) -> int:
        if b not in values:
            _check(cancel)
            if progress:
                progress(min(0.95, 0.1 + 0.15 * len(values)), f"estimating {noun} {b}")
            values[b] = figure_of(run(cfg.with_(**{knob: b})), figure)
            order.append((b, values[b]))
        return values[b]

    p1 = value(1)
    if p1 > budget_bytes:
        raise UserError(
            f"even {noun} 1 does not fit: it needs {format_bytes(p1)}, "
            f"{format_bytes(p1 - budget_bytes)} more than the budget of {format_bytes(budget_bytes)}",
            where="max-batch" if knob == "batch_size" else "max-context",
        )
    lo, hi = 1, None  # lo fits, hi does not
    second = max(2, min(second, max_batch_size))
    if value(second) > budget_bytes:
        hi = second
    else:
        lo = second
    same_side, last_fits = 0, None  # consecutive guesses landing on the same side of the budget
    while (hi is None or hi - lo > 1) and lo < max_batch_size:
        (xa, ya), (xb, yb) = order[-2], order[-1]
        both_fit = ya <= budget_bytes and yb <= budget_bytes and xa != xb
        if hi is not None and (hi - lo <= 4 or same_side >= 3):
            guess = (lo + hi) // 2
        elif both_fit or hi is None:
            # extrapolate along the last two fitting traces: exact once both lie on the final affine stretch
            # (memory is a maximum of affine pieces in the batch, e.g. a constant optimizer-step peak)
            slope = (yb - ya) / (xb - xa) if xb != xa else 0.0
            guess = lo + math.floor((budget_bytes - values[lo]) / slope) if slope > 0 else lo * 8
            if hi is None:
                guess = min(guess, lo * 64)
        else:
            guess = lo + math.floor((budget_bytes - values[lo]) * (hi - lo) / (values[hi] - values[lo]))
        guess = max(lo + 1, min(guess, hi - 1 if hi is not None else max_batch_size))
        fits = value(guess) <= budget_bytes
        same_side = same_side + 1 if fits == last_fits else 0
        last_fits = fits
        if fits:
            lo = guess
        else:
            hi = guess
    if progress:
        progress(1.0, "done")
    return MaxBatchResult(
        batch_size=lo,
        peak_bytes=values[lo],
        traces_run=len(values),
        fits_at_next=False,
        peak_next=values.get(lo + 1),
        budget_bytes=budget_bytes,
        figure=figure,
        tried=tuple(order),
    )


# ------------------------------------------------------------------------------------------------- max context


@dataclass(frozen=True)
class MaxContextResult(_SearchResult):
    """The longest context that fits: prompt + new tokens when generating, else the sequence length."""

    context_tokens: int
    length: int  # the searched length: the prompt (generation) or the sequence
    new_tokens: int  # 0 unless generating
    peak_bytes: int  # the compared figure at that length
    peak_next: int | None  # at one token more (None when the model's positions stop there)
    limit: int | None  # the model's longest context (its position embeddings), when it has one
    traces_run: int
    budget_bytes: int
    figure: str = "peak"
    tried: tuple[tuple[int, int], ...] = ()


def max_context(
    source: ModelSource | str,
    cfg: TrainConfig,
    budget_bytes: int,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    figure: str = "peak",
    limit: int | None = None,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
) -> MaxContextResult:
    """Longest context whose estimated figure ≤ budget, at cfg's batch size: the prompt length with cfg.new_tokens
    generated after it (mode generate), else the sequence length. `limit`: the model's longest context."""
    new = cfg.new_tokens if cfg.generating else 0
    upper = (limit - new) if limit else 1 << 22
    if upper < 1:
        raise UserError(f"{new} new tokens already exceed the model's context of {limit} tokens",
                        where="--new-tokens")
    knob, noun = ("prompt_len", "prompt length") if cfg.generating else ("seq_len", "sequence length")
    r = max_batch(source, cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure,
                  max_batch_size=upper, estimator=estimator, knob=knob, noun=noun, second=min(upper, 512))
    return MaxContextResult(
        context_tokens=r.batch_size + new,
        length=r.batch_size,
        new_tokens=new,
        peak_bytes=r.peak_bytes,
        peak_next=r.peak_next,
        limit=limit,
        traces_run=r.traces_run,
        budget_bytes=budget_bytes,
        figure=figure,
        tried=r.tried,
    )


# --------------------------------------------------------------------------------------------------- recommend


MIN_SAVING_FRACTION = 0.01  # recommendations saving less than this share of the peak are not offered


def recommend(
    source: ModelSource | str,
    cfg: TrainConfig,
    *,
    cancel: CancelToken | None = None,
    progress: Progress | None = None,
    base: Estimate | None = None,
    estimator: Callable[[TrainConfig], Estimate] | None = None,
    quick: bool = False,
    traced: TracedStep | None = None,
    workers: int = 1,
    ref: str | None = None,
) -> list[Recommendation]:
    """Changes that lower the step's peak, ranked by the bytes they save (most first).

    `quick`: only the answers that need no new forward/backward (sharding from the traced step, a lighter
    optimizer's state from the parameter shapes, and, given the traced step, each other optimizer with only its
    step traced again), in about the time it takes to build the model: the app shows them first, while the
    re-traced answers (AMP, checkpointing, accumulation, …) are worked out. `traced`: cfg's traced step
    (engine.planning.reuse.traced_step), traced here when neither it nor `base` is given; with it, a candidate that
    changes only the optimizer is answered from its forward and backward. The target GPU is cfg's
    (`cfg.gpu_spec`, resolved when the configuration was built).
    `workers` > 1: the candidates that need their own trace are traced at once in that many processes
    (engine.planning.pool: forked copies of this one where that is safe, else spawned ones that resolve the model
    from `ref`, the name or path `source` stands for; `source` itself when it is one)."""
    ref = source if isinstance(source, str) else ref
    source = _resolved(source)
    run = _stepper(source, cancel, estimator)
    if base is None and traced is None and estimator is None:
        base, traced = traced_step(source, cfg, cancel=cancel)
    base = base or run(cfg)
    reuse = None
    if traced is not None and estimator is None:
        step = traced

        def reuse(new_cfg: TrainConfig) -> Estimate | None:
            return with_optimizer(source, step, new_cfg, cancel)

    plan = Planning(source, cfg, base, run, quick=quick, reuse=reuse, cancel=cancel, progress=progress)
    levers: tuple[tuple[str, Lever], ...] = (
        ("mixed precision", mixed_precision), ("activation checkpointing", checkpointing),
        ("gradient accumulation", accumulation), ("optimizer", optimizers), ("LoRA / QLoRA", adapters))
    pool_ok = ref is not None or forks_workers(cfg.device)  # (a spawned worker resolves the model by its name)
    if workers > 1 and not quick and estimator is None and can_fork_workers() and pool_ok:
        surveyed = [lv for _, lv in levers if lv is not optimizers or reuse is None] + [input_size]
        if progress:
            progress(0.05, f"tracing the candidates in {workers} processes")
        plan.run = pooled(source, ref, wanted_traces(plan, surveyed), workers, run, cancel)
    for what, lever in levers:
        plan.tick(what)
        lever(plan)
    if not cfg.training and not quick:
        from .generation_advice import generation_levers

        plan.tick("generation" if cfg.generating else "inference")
        generation_levers(source, cfg, base, run, plan.offer, lambda: _longest_prompt(source, cfg, run))
    plan.tick("sharding")
    sharding(plan)
    plan.tick("input size")
    input_size(plan)
    plan.tick("ranking")
    # A change that saves almost nothing here (the peak lies elsewhere) is not worth its cost: left out.
    out = [r for r in plan.out if r.saves_bytes >= MIN_SAVING_FRACTION * base.peak_bytes]
    # The changes that keep the training the same first, those that change what is trained after them.
    out.sort(key=lambda r: (r.changes_training, -r.saves_bytes))
    if progress:
        progress(1.0, "done")
    return out


def _longest_prompt(source: ModelSource, cfg: TrainConfig, run: Callable[[TrainConfig], Estimate]) -> int | None:
    """The longest prompt whose predicted nvidia-smi figure fits the target (None: not even one token does)."""
    from ..models.hf_source import HFConfigSource

    spec = cfg.gpu_spec
    if spec is None:
        return None
    limit = source.context_limit() if isinstance(source, HFConfigSource) else None
    try:
        r = max_context(source, cfg, spec.usable_bytes, figure="nvidia_smi", limit=limit, estimator=run)
    except UserError:
        return None
    return r.length
