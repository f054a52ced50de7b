"""The engine calls the app makes, as plain picklable functions (engine.jobs.worker is the process that runs them).

Qt-free: the GUI's bridge sends an EngineCall (a module-level function of this module and its arguments;
pickle carries the function by reference) to a worker process that imports only the engine. A model is
named by a source spec — ("sketch", sketch JSON) or ("ref", template name / sketch path / file.py:function)
— so that what crosses the process boundary is data, never a live model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from ..config.train_config import TrainConfig
from ..core.progress import CancelToken, Progress
from ..cuda import gpu_profile
from ..measure import calibrate as calibration
from ..models import sources
from ..models.hf_source import HFConfigSource
from ..models.source import ModelSource
from ..planning import estimator, planner, reuse as plan_reuse, room, snapshot_fit as snapshot_model
from ..planning.planner import MaxBatchResult, MaxContextResult, Recommendation
from ..planning.reuse import TracedStep
from ..planning.snapshot_fit import Beside, FitAnswer
from ..results.types import Estimate
from ..sketch import analytic as sketch_analytic
from ..sketch.analytic import AnalyticResult
from ..sketch.document import Sketch
from ..snapshots import reader as memory_snapshot
from ..trace.meta_build import build_on_meta

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

    @property
    def subject(self) -> str | None:
        """What the job reads, as a failure's message names it: a snapshot's path, a model's reference or a
        sketch's file; None for an unsaved sketch or a job of no file."""
        first = self.args[0] if self.args else None
        if isinstance(first, str):
            return first
        if isinstance(first, tuple) and len(first) >= 2 and first[0] == "ref":
            return str(first[1])
        if isinstance(first, tuple) and len(first) >= 3 and first[0] == "sketch" and first[2]:
            return str(first[2])
        return None


def make_source(spec: SourceSpec) -> ModelSource:
    kind = spec[0]
    if kind == "sketch":
        _, data, *rest = spec
        path = Path(rest[0]) if rest and rest[0] else None
        return sources.SketchSource(Sketch.from_json(data), path)
    if kind == "ref":
        return sources.resolve_source(spec[1])
    raise ValueError(f"unknown source spec {kind!r}")


# The last traced step of this (engine) process, kept for the planner: (source spec, configuration, traced step).
# The Plan tab's jobs run in the process that traced the estimate on screen, so a change of optimizer needs only
# its optimizer step traced (engine.planning.reuse).
_last_step: list[tuple[SourceSpec, TrainConfig, TracedStep]] = []


def estimate(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> Estimate:
    # The step kept for the planner is of the estimate before: let it go before tracing this one (kept alive
    # through the trace, its objects made every full garbage collection of the new trace longer, 0.3-0.5 s of an
    # 8B QLoRA estimate's 2 s in the app).
    _last_step.clear()
    est, step = plan_reuse.traced_step(make_source(spec), cfg, cancel=cancel, progress=progress)
    _last_step[:] = [(spec, cfg, step)]
    return est


def kept_step(spec: SourceSpec, cfg: TrainConfig) -> TracedStep | None:
    """The traced step of `spec` under `cfg` when it is the last one this process traced."""
    return next((step for s, c, step in _last_step if s == spec and cfg in (c, step.cfg)), None)


def analytic(sketch_json: dict[str, Any], cfg: TrainConfig, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> AnalyticResult:
    return sketch_analytic.analytic(Sketch.from_json(sketch_json), cfg)


def max_batch(spec: SourceSpec, cfg: TrainConfig, budget_bytes: int, figure: str = "peak", *,
              cancel: CancelToken | None = None, progress: Progress | None = None) -> MaxBatchResult:
    return planner.max_batch(make_source(spec), cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure)


def max_context(spec: SourceSpec, cfg: TrainConfig, budget_bytes: int, figure: str = "peak", *,
                cancel: CancelToken | None = None, progress: Progress | None = None) -> MaxContextResult:
    """The longest prompt (generation) or sequence that fits, as the CLI's max-context finds it."""
    src = make_source(spec)
    limit = src.context_limit() if isinstance(src, HFConfigSource) else None
    return planner.max_context(src, cfg, budget_bytes, cancel=cancel, progress=progress, figure=figure, limit=limit)


def recommend(spec: SourceSpec, cfg: TrainConfig, base: Estimate | None = None,
              quick: bool = False, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> list[Recommendation]:
    return planner.recommend(make_source(spec), cfg, cancel=cancel, progress=progress, base=base, quick=quick,
                             traced=kept_step(spec, cfg))


def torch_cuda_available() -> bool:
    return torch.cuda.is_available()


def profile(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
            progress: Progress | None = None) -> tuple[Estimate, Estimate | None]:
    """(measured, against): the real run here, and the estimate for the device it ran on when that is not the
    configured target (a CPU run of a GPU-target estimate), else None: compare the measurement with that."""
    src = make_source(spec)
    other_device = cfg.device == "cuda" and not torch_cuda_available()
    share = 0.85 if other_device else 1.0  # the comparison estimate takes the rest of the bar

    def part(fraction: float, message: str = "") -> None:
        if progress is not None:
            progress(share * fraction, message)

    measured = room.profile_within_room(src, cfg, cancel=cancel, progress=part)
    if measured.config.device == cfg.device:
        return measured, None
    if progress is not None:
        progress(share, f"estimating the same step for the {measured.config.device.upper()} to compare")
    against = estimator.estimate(src, cfg.with_(device=measured.config.device, gpu=None), cancel=cancel)
    if progress is not None:
        progress(1.0, "done")
    return measured, against


def calibrate(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> str:
    """Calibrate this machine's GPU 0 with the model's kernels and keep the profile; a one-line summary."""
    prof = calibration.calibrate(0, make_source(spec), cfg, progress=progress)
    return f"{gpu_profile.profile_summary(prof)} (saved to {gpu_profile.save_profile(prof)})"


def open_snapshot(path: str, *, cancel: CancelToken | None = None, progress: Progress | None = None) -> Estimate:
    """A real run's PyTorch memory snapshot as an Estimate (engine.snapshots.reader), read off the GUI thread."""
    return memory_snapshot.open_snapshot(path, cancel=cancel, progress=progress)


def snapshot_beside(spec: SourceSpec, snap: Estimate, *, cancel: CancelToken | None = None,
                    progress: Progress | None = None) -> Beside:
    """A snapshot beside the model that ran: the estimate of the step the snapshot shows, figure by figure."""
    return snapshot_model.beside(snap, make_source(spec), cancel=cancel)


def what_fits(spec: SourceSpec, snap: Estimate, cfg: TrainConfig, *, cancel: CancelToken | None = None,
              progress: Progress | None = None) -> FitAnswer:
    """For a snapshot taken at an out-of-memory error: what would have fit, for the model and configuration given."""
    src = make_source(spec)
    return snapshot_model.what_fits(snap, src, cfg, estimator.estimate(src, cfg, cancel=cancel), cancel=cancel,
                                    progress=progress)


def module_tree(spec: SourceSpec, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                progress: Progress | None = None) -> list[tuple[str, str, int, int]]:
    """(dotted name, type, own parameters, total parameters) of the model, built on the meta device."""
    src = make_source(spec)
    model, _inputs = build_on_meta(src, cfg.with_(batch_size=1))
    rows = []
    for name, mod in model.named_modules():
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        total = sum(p.numel() for p in mod.parameters())
        rows.append((name, type(mod).__name__, own, total))
    return rows


def warm_up(*, cancel: CancelToken | None = None, progress: Progress | None = None) -> bool:
    """The worker's first call: it returns once this module, and with it the engine's modules, are imported,
    so the first real job answers quickly."""
    return True
