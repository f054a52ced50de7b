"""The planner's re-traced candidates estimated at once, in worker processes.

A candidate that changes the forward or backward (AMP, checkpointing, LoRA/QLoRA, a shorter input, the first
micro-batch gradient accumulation tries) needs its own trace. Which ones a plan will trace is known before any
is traced: a survey runs the levers with every estimate declined, noting what each asks for. Those are traced in
a pool of `workers` processes (spawned: each imports torch and the engine itself, and resolves the model from
its name, so nothing unpicklable crosses), and the real pass of the levers takes their answers from it; what a
lever asks for beyond them (the later steps of the accumulation's bisection) is traced in this process as
before. The answers are the same estimates a sequential plan computes: each worker runs the same
`engine.planning.estimator.estimate` on the same configuration.

Not in a daemonic process (the app's engine worker: multiprocessing refuses it children) — the plan then runs
its traces one after another, as it always did.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.progress import CancelToken
from ..results.types import Estimate
from .levers import Planning

Lever = Callable[[Planning], None]
FAILED = (UserError, RuntimeError, ValueError, NotImplementedError)  # a candidate that does not build or trace


def can_fork_workers() -> bool:
    """Whether this process may start worker processes (a daemonic one may not)."""
    return not multiprocessing.current_process().daemon


class _Survey(Planning):
    """A Planning that traces nothing: each estimate a lever asks for is noted and declined (None)."""

    wanted: list[TrainConfig]

    def estimate(self, new_cfg: TrainConfig, reusable: bool = False) -> Estimate | None:
        if reusable and self.reuse is not None:
            return None  # answered from the traced step, in this process
        if not self.quick and new_cfg not in self.wanted:
            self.wanted.append(new_cfg)
        return None


def wanted_traces(plan: Planning, levers: Sequence[Lever]) -> list[TrainConfig]:
    """The configurations `levers` would trace first for `plan` (in order, each once). Of the accumulation's
    bisection only its first micro-batch is known before an answer: the rest depend on whether that one fits."""
    from .levers import accumulation

    survey = _Survey(plan.source, plan.cfg, plan.base, plan.run, quick=plan.quick, reuse=plan.reuse)
    survey.wanted = []
    for lever in levers:
        before = len(survey.wanted)
        lever(survey)
        if lever is accumulation:
            del survey.wanted[before + 1:]
    return survey.wanted


def _estimate_in_worker(ref: str, cfg: TrainConfig) -> Estimate | str:
    """A worker's answer: the estimate, or the one-line error of a candidate that does not build or trace."""
    from ..models.sources import resolve_source
    from .levers import estimate_of_config

    try:
        return estimate_of_config(resolve_source(ref), cfg)
    except FAILED as e:
        return str(e) or type(e).__name__


def pooled(ref: str, configs: Sequence[TrainConfig], workers: int, run: Callable[[TrainConfig], Estimate],
           cancel: CancelToken | None = None) -> Callable[[TrainConfig], Estimate]:
    """`run` with `configs` estimated first, at once in `workers` processes: the answer of a configuration traced
    there, else `run`'s."""
    done: dict[TrainConfig, Estimate | str] = {}
    if configs:
        with ProcessPoolExecutor(max_workers=min(workers, len(configs)),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures: dict[Future[Estimate | str], TrainConfig] = {
                pool.submit(_estimate_in_worker, ref, c): c for c in configs}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for f in finished:
                    done[futures[f]] = f.result()
                if cancel is not None and cancel.is_set():
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise Cancelled()

    def answer(cfg: TrainConfig) -> Estimate:
        got = done.get(cfg)
        if got is None:
            return run(cfg)
        if isinstance(got, str):
            raise UserError(got)
        return got

    return answer
