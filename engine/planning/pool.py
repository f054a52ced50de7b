"""The planner's re-traced candidates estimated at once, in worker processes.

A candidate that changes the forward or backward (AMP, checkpointing, LoRA/QLoRA, a shorter input, the first
micro-batch gradient accumulation tries) needs its own trace. Which ones a plan will trace is known before any
is traced: a survey runs the levers with every estimate declined, noting what each asks for. Those are traced in
a pool of `workers` processes, and the real pass of the levers takes their answers from it; what a lever asks for
beyond them (the later steps of the accumulation's bisection) is traced in this process as before. The answers
are the same estimates a sequential plan computes: each worker runs the same
`engine.planning.levers.estimate_of_config` on the same configuration.

The workers are forked where that is safe (Linux, and no CUDA context in this process: a forked child cannot make
one): each starts as a copy of this process, its imports done, the model's source resolved and the fake-tensor
cache warm, so a worker costs its traces only. Elsewhere they are spawned: each imports torch and the engine
itself and resolves the model from its name (`ref`), which only pays where the traces are long.

Not in a daemonic process (the app's engine worker: multiprocessing refuses it children) — the plan then runs
its traces one after another, as it always did.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.parent_watch import exit_with_parent
from ..core.progress import CancelToken
from ..finetune.adapters import import_libraries
from ..models.source import ModelSource
from ..results.types import Estimate
from .levers import Planning

Lever = Callable[[Planning], None]
FAILED = (UserError, RuntimeError, ValueError, NotImplementedError)  # a candidate that does not build or trace
MAX_WORKERS = 8  # a plan has at most a handful of candidates to trace at once
_FORKED_SOURCE: ModelSource | None = None  # the model a forked worker estimates (set before the pool starts)
_ONE_POOL = threading.Lock()  # one pool at a time in this process: _FORKED_SOURCE is the running pool's


def can_fork_workers() -> bool:
    """Whether this process may start worker processes (a daemonic one may not)."""
    return not multiprocessing.current_process().daemon


def forks_workers(device: str) -> bool:
    """Whether the workers for a target `device` are forked copies of this process (else spawned): on Linux, for a
    GPU target, with no CUDA context here. Not for a CPU target: its trace runs real CPU kernels (their scratch
    measured: engine.trace.cpu_kernels) on torch's OpenMP threads, which do not survive a fork — a child's first
    parallel kernel would wait for ever — and whose number the kernels' scratch depends on."""
    import torch

    cuda_made = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # unannotated in torch
    return device != "cpu" and sys.platform.startswith("linux") and \
        "fork" in multiprocessing.get_all_start_methods() and not cuda_made


def default_workers(device: str) -> int:
    """How many processes a plan for a target `device` traces its candidates in when not told: one per core this
    process may run on (at most MAX_WORKERS) where the workers are forked, else 1 (a spawned worker's imports cost
    more than a small model's traces)."""
    if not (can_fork_workers() and forks_workers(device)):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_WORKERS))


def _start_forked_worker(parent_pid: int) -> None:
    """A forked worker's set-up: it ends with its parent, and runs torch's CPU ops on its own thread (torch's OpenMP
    pool does not survive a fork; a GPU target's trace runs no kernel whose figures depend on it)."""
    import torch

    exit_with_parent(parent_pid)
    torch.set_num_threads(1)


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


def _estimate_in_worker(ref: str | None, cfg: TrainConfig) -> Estimate | str:
    """A worker's answer: the estimate, or the one-line error of a candidate that does not build or trace. A forked
    worker estimates the source its parent resolved (`ref` None), a spawned one resolves `ref`."""
    from ..models.sources import resolve_source
    from .levers import estimate_of_config

    try:
        source = _FORKED_SOURCE if ref is None else resolve_source(ref)
        assert source is not None  # (set before a forked pool starts)
        return estimate_of_config(source, cfg)
    except FAILED as e:
        return str(e) or type(e).__name__


def _stop(pool: ProcessPoolExecutor) -> None:
    """The pool's queued candidates dropped and its workers ended, without waiting for the traces they run."""
    # (the executor's own workers, read before its shutdown forgets them; no public way before Python 3.14)
    procs = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()


def _longest_first(configs: Sequence[TrainConfig]) -> list[TrainConfig]:
    """The candidates in the order the workers take them: the adapters' (a copy of the model with LoRA layers, and
    QLoRA's quantized weights: the longest traces) first, so that no worker starts a long one last."""
    return sorted(configs, key=lambda c: c.peft is None)


def pooled(source: ModelSource, ref: str | None, configs: Sequence[TrainConfig], workers: int,
           run: Callable[[TrainConfig], Estimate], cancel: CancelToken | None = None
           ) -> Callable[[TrainConfig], Estimate]:
    """`run` with `configs` estimated first, at once in `workers` processes (forked copies of this one estimating
    `source`, or spawned ones resolving `ref`: forks_workers): the answer of a configuration traced there, else
    `run`'s."""
    global _FORKED_SOURCE
    done: dict[TrainConfig, Estimate | str] = {}
    if not configs:
        return run
    device = configs[0].device
    one_device = all(c.device == device for c in configs)
    if one_device and forks_workers(device):
        # what the adapters' estimates import, imported once here (each fork would import it again); bitsandbytes
        # may set up CUDA as it loads, after which nothing is forked (forks_workers, asked again below)
        for kind in sorted({c.peft for c in configs if c.peft}):
            try:
                import_libraries(kind)
            except UserError:
                pass  # (the worker's estimate says it)
    fork = one_device and forks_workers(device)
    if not fork and ref is None:
        return run  # (a spawned worker resolves the model by its name)
    with _ONE_POOL:  # (the forked workers read the source from this module)
        _FORKED_SOURCE = source if fork else None
        pool = ProcessPoolExecutor(max_workers=min(workers, len(configs)),
                                   mp_context=multiprocessing.get_context("fork" if fork else "spawn"),
                                   initializer=_start_forked_worker if fork else exit_with_parent,
                                   initargs=(os.getpid(),))
        try:
            futures: dict[Future[Estimate | str], TrainConfig] = {
                pool.submit(_estimate_in_worker, None if fork else ref, c): c for c in _longest_first(configs)}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for f in finished:
                    done[futures[f]] = f.result()
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
        except BaseException:  # cancelled, interrupted (Ctrl+C), a worker's failure: stop the others now
            _stop(pool)
            raise
        finally:
            pool.shutdown(wait=True)
            _FORKED_SOURCE = None

    def answer(cfg: TrainConfig) -> Estimate:
        got = done.get(cfg)
        if got is None:
            return run(cfg)
        if isinstance(got, str):
            raise UserError(got)
        return got

    return answer
