"""The app's engine session: which engine jobs run, which answers are stale, and where each answer goes.

Every job is submitted with its own typed callbacks (superqt's worker shape: `returned`, `errored`, `progress`,
`cancelled` per job), so nothing dispatches on a string naming the result's kind. Staleness is one rule, kept
here: each job remembers the edit revision it was submitted at (`edited()` starts a new one); a traced
estimate on screen marks its revision shown, and an analytic answer of that revision or an older one is
dropped, never drawn over it; a traced estimate that failed marks its revision failed, and a later analytic answer
of that revision or an older one gives its per-node figures only (its error is dropped: the trace said why). The
bridge (gui.bridge) keeps one lane per kind, so a newer job of a kind cancels the older one; this class only routes
what comes back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from PySide6.QtCore import QObject, Signal

from engine.config.train_config import TrainConfig
from engine.core.progress import CancelToken, Progress
from engine.jobs import calls as jobs
from engine.jobs.calls import EngineCall, SourceSpec
from engine.planning.planner import MaxBatchResult, MaxContextResult, Recommendation
from engine.planning.snapshot_fit import Beside, FitAnswer
from engine.results.types import Estimate
from engine.sketch.analytic import AnalyticResult

from .bridge import EngineBridge

T = TypeVar("T")


@dataclass
class JobCallbacks(Generic[T]):
    """Where one job's answers go; every one is called on the GUI thread, and only while the job is current."""

    done: Callable[[T], None]
    failed: Callable[[str], None] | None = None
    progress: Callable[[float, str], None] | None = None
    cancelled: Callable[[], None] | None = None


@dataclass
class _Route:
    callbacks: JobCallbacks[Any]
    revision: int


class EngineSession(QObject):
    """The window's one door into the engine: typed job methods, each with its callbacks.

    busyChanged(bool): whether any job is queued or running (the status bar's indicator), said again each time a
    job is queued or ends.
    """

    busyChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None, *, processes: bool | None = None):
        super().__init__(parent)
        self.bridge = EngineBridge(self, processes=processes)
        self.revision = 0  # one per edit of the model or the configuration
        self.shown_revision = -1  # the revision of the traced estimate on screen
        self.failed_revision = -1  # the newest revision whose traced estimate failed
        self._routes: dict[int, _Route] = {}
        self._newest: dict[str, int] = {}  # kind -> its newest job id (an older one's answers never come)
        self.bridge.result.connect(self._on_result)
        self.bridge.error.connect(self._on_error)
        self.bridge.progress.connect(self._on_progress)
        self.bridge.cancelled.connect(self._on_cancelled)
        self.bridge.busyChanged.connect(self.busyChanged)

    # ---- revisions
    def edited(self) -> None:
        """The model or the configuration changed: answers submitted from now on belong to a new revision."""
        self.revision += 1

    def model_opened(self) -> None:
        """A different model: nothing traced is on screen."""
        self.shown_revision = -1

    # ---- jobs
    def submit(self, kind: str, fn: Callable[[CancelToken, Progress], T], callbacks: JobCallbacks[T]) -> int:
        """Run `fn(cancel, progress)` on the lane of `kind` (an older job of that kind is cancelled)."""
        jid = self.bridge.submit(kind, fn)
        self._routes.pop(self._newest.pop(kind, 0), None)
        if jid:
            self._routes[jid] = _Route(callbacks, self.revision)
            self._newest[kind] = jid
        return jid

    def estimate(self, spec: SourceSpec, cfg: TrainConfig, callbacks: JobCallbacks[Estimate]) -> int:
        """The traced estimate; shown, it makes its revision's (and older) analytic answers stale."""
        revision = self.revision
        done, failed = callbacks.done, callbacks.failed

        def shown(est: Estimate) -> None:
            self.shown_revision = revision
            done(est)

        def refused(message: str) -> None:
            self.failed_revision = max(self.failed_revision, revision)
            if failed is not None:
                failed(message)

        # The planner's answers belong to the previous estimate: stop them now.
        self.bridge.cancel("max_batch")
        self.bridge.cancel("max_context")
        self.bridge.cancel("plan")
        self.bridge.cancel("plan_quick")
        call = EngineCall(jobs.estimate, (spec, cfg))
        return self.submit("estimate", call, JobCallbacks(shown, refused, callbacks.progress, callbacks.cancelled))

    def analytic(self, sketch_json: dict[str, Any], cfg: TrainConfig, callbacks: JobCallbacks[AnalyticResult],
                 after_failure: Callable[[AnalyticResult], None] | None = None) -> int:
        """The instant formula figures of a sketch, dropped once a traced estimate of this edit or a newer one
        is on screen; once this edit's (or a newer one's) traced estimate failed, given to `after_failure` instead
        (its per-node figures: the summary keeps the last version that built) and its error dropped."""
        revision = self.revision
        done, failed = callbacks.done, callbacks.failed

        def fresh(res: AnalyticResult) -> None:
            if revision <= self.shown_revision:
                return
            if revision > self.failed_revision:
                done(res)
            elif after_failure is not None:
                after_failure(res)

        def refused(message: str) -> None:
            if revision > self.failed_revision and failed is not None:
                failed(message)

        call = EngineCall(jobs.analytic, (sketch_json, cfg))
        return self.submit("analytic", call, JobCallbacks(fresh, refused))

    def max_batch(self, spec: SourceSpec, cfg: TrainConfig, budget: int, figure: str,
                  callbacks: JobCallbacks[MaxBatchResult]) -> int:
        return self.submit("max_batch", EngineCall(jobs.max_batch, (spec, cfg, budget, figure)), callbacks)

    def max_context(self, spec: SourceSpec, cfg: TrainConfig, budget: int, figure: str,
                    callbacks: JobCallbacks[MaxContextResult]) -> int:
        return self.submit("max_context", EngineCall(jobs.max_context, (spec, cfg, budget, figure)), callbacks)

    def recommend(self, spec: SourceSpec, base: Estimate, callbacks: JobCallbacks[list[Recommendation]],
                  quick: bool = False) -> int:
        """The planner's answers; `quick`: only those that need no new trace (seconds, even for a 70B model)."""
        cfg = base.config
        kind = "plan_quick" if quick else "plan"
        return self.submit(kind, EngineCall(jobs.recommend, (spec, cfg, base, quick)), callbacks)

    def profile(self, spec: SourceSpec, cfg: TrainConfig,
                callbacks: JobCallbacks[tuple[Estimate, Estimate | None]]) -> int:
        return self.submit("profile", EngineCall(jobs.profile, (spec, cfg)), callbacks)

    def calibrate(self, spec: SourceSpec, cfg: TrainConfig, callbacks: JobCallbacks[str]) -> int:
        return self.submit("calibrate", EngineCall(jobs.calibrate, (spec, cfg)), callbacks)

    def open_snapshot(self, path: str, callbacks: JobCallbacks[Estimate]) -> int:
        """A real run's memory snapshot, read in its own engine process (a long one must not hold up estimates)."""
        return self.submit("snapshot", EngineCall(jobs.open_snapshot, (path,)), callbacks)

    def snapshot_beside(self, spec: SourceSpec, snap: Estimate, callbacks: JobCallbacks[Beside]) -> int:
        """The snapshot beside the model that ran: the estimate of the step the snapshot shows, figure by figure."""
        return self.submit("beside", EngineCall(jobs.snapshot_beside, (spec, snap)), callbacks)

    def what_fits(self, spec: SourceSpec, snap: Estimate, cfg: TrainConfig,
                  callbacks: JobCallbacks[FitAnswer]) -> int:
        """After an out-of-memory snapshot: what would have fit in the memory the failed run had (several traces)."""
        return self.submit("what_fits", EngineCall(jobs.what_fits, (spec, snap, cfg)), callbacks)

    def module_tree(self, ref: str, cfg: TrainConfig, callbacks: JobCallbacks[list[tuple[str, str, int, int]]]) -> int:
        return self.submit("tree", EngineCall(jobs.module_tree, (("ref", ref), cfg)), callbacks)

    def cancel(self, kind: str) -> None:
        self.bridge.cancel(kind)

    def is_busy(self, kind: str | None = None) -> bool:
        return self.bridge.is_busy(kind)

    def planning(self) -> bool:
        """The planner's answers for the estimate on screen are still coming: the largest batch, the plan."""
        return self.is_busy("plan") or self.is_busy("max_batch")

    def shutdown(self) -> None:
        self._routes.clear()
        self.bridge.shutdown()

    # ---- answers from the bridge (already filtered to the current job of each kind)
    def _on_result(self, _kind: str, jid: int, value: object) -> None:
        route = self._routes.pop(jid, None)
        if route is not None:
            route.callbacks.done(value)

    def _on_error(self, _kind: str, jid: int, message: str) -> None:
        route = self._routes.pop(jid, None)
        if route is not None and route.callbacks.failed is not None:
            route.callbacks.failed(message)

    def _on_progress(self, _kind: str, jid: int, fraction: float, message: str) -> None:
        route = self._routes.get(jid)
        if route is not None and route.callbacks.progress is not None:
            route.callbacks.progress(fraction, message)

    def _on_cancelled(self, _kind: str, jid: int) -> None:
        route = self._routes.pop(jid, None)
        if route is not None and route.callbacks.cancelled is not None:
            route.callbacks.cancelled()
