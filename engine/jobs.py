"""The engine calls the app makes, as plain picklable functions, and the worker process that runs them.

Qt-free: the GUI's bridge sends an EngineCall (a module-level function of this module and its arguments;
pickle carries the function by reference) to a worker process that imports only the engine. A model is
named by a source spec — ("sketch", sketch JSON) or ("ref", template name / sketch path / file.py:function)
— so that what crosses the process boundary is data, never a live model.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .progress import CancelToken, Progress

if TYPE_CHECKING:  # the engine's heavy modules load in the worker process, when a job needs them
    from .analytic import AnalyticResult
    from .config import TrainConfig
    from .model_source import ModelSource
    from .plan_reuse import TracedStep
    from .planner import MaxBatchResult, MaxContextResult, Recommendation
    from .results import Estimate
    from .snapshot_model import Beside, FitAnswer

T = TypeVar("T")



# What names a model across the process boundary: ("sketch", sketch JSON, path or None) or ("ref", reference).
SourceSpec = tuple[Any, ...]


@dataclass(frozen=True)
class EngineCall(Generic[T]):
    """A picklable job: `fn` (a module-level function) called as fn(*args, cancel=token, progress=callback).

    Runs in the engine process when its kind has one, else on a thread like any other job.
    """

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()

    def __call__(self, cancel: CancelToken, progress: Progress) -> T:
        return self.fn(*self.args, cancel=cancel, progress=progress)


def make_source(spec: SourceSpec) -> ModelSource:
    kind = spec[0]
    if kind == "sketch":
        from engine.sketch import Sketch
        from engine.sources import SketchSource

        _, data, *rest = spec
        path = Path(rest[0]) if rest and rest[0] else None
        return SketchSource(Sketch.from_json(data), path)
    if kind == "ref":
        from engine.sources import resolve_source

        return resolve_source(spec[1])
    raise ValueError(f"unknown source spec {kind!r}")


# The last traced step of this (engine) process, kept for the planner: (source spec, configuration, traced step).
# The Plan tab's jobs run in the process that traced the estimate on screen, so a change of optimizer needs only
# its optimizer step traced (engine.plan_reuse).
_last_step: list[tuple[SourceSpec, TrainConfig, TracedStep]] = []


def estimate(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> Estimate:
    from engine.plan_reuse import traced_step

    est, step = traced_step(make_source(spec), cfg, cancel=cancel, progress=progress)
    _last_step[:] = [(spec, cfg, step)]
    return est


def kept_step(spec: SourceSpec, cfg: TrainConfig) -> TracedStep | None:
    """The traced step of `spec` under `cfg` when it is the last one this process traced."""
    return next((step for s, c, step in _last_step if s == spec and cfg in (c, step.cfg)), None)


def analytic(sketch_json: dict[str, Any], cfg: TrainConfig, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> AnalyticResult:
    from engine.analytic import analytic as run
    from engine.sketch import Sketch

    return run(Sketch.from_json(sketch_json), cfg)


def max_batch(spec: SourceSpec, cfg: TrainConfig, budget_bytes: int, figure: str = "peak", *,
              cancel: CancelToken | None = None, progress: Progress | None = None) -> MaxBatchResult:
    from engine.planner import max_batch as run

    return run(make_source(spec), cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure)


def max_context(spec: SourceSpec, cfg: TrainConfig, budget_bytes: int, figure: str = "peak", *,
                cancel: CancelToken | None = None, progress: Progress | None = None) -> MaxContextResult:
    """The longest prompt (generation) or sequence that fits, as the CLI's max-context finds it."""
    from engine.hf_source import HFConfigSource
    from engine.planner import max_context as run

    src = make_source(spec)
    limit = src.context_limit() if isinstance(src, HFConfigSource) else None
    return run(src, cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure, limit=limit)


def recommend(spec: SourceSpec, cfg: TrainConfig, base: Estimate | None = None,
              quick: bool = False, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> list[Recommendation]:
    from engine.planner import recommend as run

    return run(make_source(spec), cfg, cancel=cancel, progress=progress, base=base, quick=quick,
               traced=kept_step(spec, cfg))


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def profile(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
            progress: Progress | None = None) -> tuple[Estimate, Estimate | None]:
    """(measured, against): the real run here, and the estimate for the device it ran on when that is not the
    configured target (a CPU run of a GPU-target estimate), else None: compare the measurement with that."""
    from engine.estimator import estimate
    from engine.room import profile_within_room as run

    src = make_source(spec)
    other_device = cfg.device == "cuda" and not torch_cuda_available()
    share = 0.85 if other_device else 1.0  # the comparison estimate takes the rest of the bar

    def part(fraction: float, message: str = "") -> None:
        if progress is not None:
            progress(share * fraction, message)

    measured = run(src, cfg, cancel=cancel, progress=part)
    if measured.config.device == cfg.device:
        return measured, None
    if progress is not None:
        progress(share, f"estimating the same step for the {measured.config.device.upper()} to compare")
    against = estimate(src, cfg.with_(device=measured.config.device, gpu=None), cancel=cancel)
    if progress is not None:
        progress(1.0, "done")
    return measured, against


def calibrate(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> str:
    """Calibrate this machine's GPU 0 with the model's kernels and keep the profile; a one-line summary."""
    from engine.calibrate import calibrate as run
    from engine.gpu_profile import profile_summary, save_profile

    prof = run(0, make_source(spec), cfg, progress=progress)
    return f"{profile_summary(prof)} (saved to {save_profile(prof)})"


def open_snapshot(path: str, *, cancel: CancelToken | None = None, progress: Progress | None = None) -> Estimate:
    """A real run's PyTorch memory snapshot as an Estimate (engine.snapshot), read off the GUI thread."""
    from engine.snapshot import open_snapshot as run

    return run(path, cancel=cancel, progress=progress)


def snapshot_beside(spec: SourceSpec, snap: Estimate, *, cancel: CancelToken | None = None,
                    progress: Progress | None = None) -> Beside:
    """A snapshot beside the model that ran: the estimate of the step the snapshot shows, figure by figure."""
    from engine.snapshot_model import beside

    return beside(snap, make_source(spec), cancel=cancel)


def what_fits(spec: SourceSpec, snap: Estimate, cfg: TrainConfig, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> FitAnswer:
    """For a snapshot taken at an out-of-memory error: what would have fit, for the model and configuration given."""
    from engine.estimator import estimate
    from engine.snapshot_model import what_fits as run

    src = make_source(spec)
    return run(snap, src, cfg, estimate(src, cfg, cancel=cancel), cancel=cancel, progress=progress)


def module_tree(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                progress: Progress | None = None) -> list[tuple[str, str, int, int]]:
    """(dotted name, type, own parameters, total parameters) of the model, built on the meta device."""
    import torch

    src = make_source(spec)
    with torch.device("meta"):
        model, _inputs = src.build(cfg.with_(batch_size=1))
    rows = []
    for name, mod in model.named_modules():
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        total = sum(p.numel() for p in mod.parameters())
        rows.append((name, type(mod).__name__, own, total))
    return rows


def warm_up(*, cancel: CancelToken | None = None, progress: Progress | None = None) -> bool:
    """Import the engine's heavy modules once, so the first real job answers quickly."""
    import engine.estimator  # noqa: F401
    import engine.planner  # noqa: F401
    import engine.sketch  # noqa: F401
    import engine.sources  # noqa: F401

    return True


# --------------------------------------------------------------------------------------------------------------
# the worker process

def one_line(exc: BaseException) -> str:
    """A user-facing one-line message: UserError text as is; anything else named, first line only."""
    from engine.errors import UserError

    if isinstance(exc, UserError):
        text = str(exc)
    elif isinstance(exc, MemoryError):
        text = "out of host memory while estimating; try a smaller batch or sequence"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = " ".join(text.split())  # one line, whatever the engine wrote
    return text if len(text) <= 300 else text[:297] + "…"


class _Token:
    """The cancel token a job sees in the worker process: set when the parent names this job in `cancel_id`."""

    def __init__(self, cancel_id: Any, job_id: int):
        self._v, self._id = cancel_id, job_id

    def is_set(self) -> bool:
        return bool(self._v.value == self._id)


def _progress_to(outbox: Any, jid: int, token: _Token) -> Progress:
    """The job's progress callback: raises Cancelled once the job is cancelled, else sends a few updates a second."""
    import time

    from engine.errors import Cancelled

    last = [0.0]

    def progress(fraction: float, message: str = "") -> None:
        if token.is_set():
            raise Cancelled()
        now = time.monotonic()
        if now - last[0] >= 0.05 or fraction >= 1.0:  # a few updates a second is all a progress bar needs
            last[0] = now
            outbox.put(("progress", jid, max(-1.0, min(1.0, float(fraction))), message))

    return progress


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """A daemon thread that ends this process once `parent_pid` is no longer its parent (the app was killed,
    even with kill -9): a worker blocked in its inbox, or deep in a job, would otherwise live on forever."""

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(0)

    t = threading.Thread(target=watch, name="vramscope-parent-watch", daemon=True)
    t.start()
    return t


def serve(inbox: Any, outbox: Any, cancel_id: Any) -> None:
    """Worker-process main loop: run (job id, pickled (function, args)) messages one at a time.

    Replies: ("started", id), ("progress", id, fraction, text), ("result", id, pickled value),
    ("error", id, one-line message, traceback text), ("cancelled", id).
    """
    import pickle
    import signal
    import traceback

    from engine.errors import Cancelled

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in the terminal is the parent's to handle
    except (ValueError, OSError):
        pass
    exit_with_parent(os.getppid())
    while True:
        msg = inbox.get()
        if msg is None:
            return
        jid, payload = msg
        token = _Token(cancel_id, jid)
        progress = _progress_to(outbox, jid, token)
        outbox.put(("started", jid))
        try:
            fn, args = pickle.loads(payload)
            value = fn(*args, cancel=token, progress=progress)
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Cancelled:
            outbox.put(("cancelled", jid))
            continue
        except BaseException as e:  # noqa: BLE001 — the process must outlive any one job
            if isinstance(e, KeyboardInterrupt):
                return
            if token.is_set():
                outbox.put(("cancelled", jid))
            else:
                outbox.put(("error", jid, one_line(e), traceback.format_exc()))
            continue
        outbox.put(("cancelled", jid) if token.is_set() else ("result", jid, data))
