"""The memory snapshot open in the window and the model it belongs to: read, shown alone or beside that model's
estimate of the step the snapshot shows (engine.planning.snapshot_fit.beside, as the CLI's `open --model`), closed when
another model opens or from the File menu, with the Measured tab, the timeline's overlay, the Plan tab's
"what would have fit" and the report's comparison following it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from engine.core.units import format_bytes
from engine.jobs.calls import SourceSpec
from engine.planning.snapshot_fit import Beside, FitAnswer, render_fit
from engine.results.types import Estimate

from .config_panel import in_panel_terms
from .results import ResultsPanel
from .results.compare_view import comparison_rows
from .session import EngineSession, JobCallbacks

NO_MEASUREMENT = "No measurement yet. A profile run takes real memory on this machine."


class SnapshotLink(QObject):
    """One open snapshot at most. `model()` is the window's open model (None: no model, an empty sketch);
    `say(text, ms)` a status-bar message. `opened(bool)`: whether a snapshot is open now (File ▸ Close
    snapshot); `reading(bool)`: whether one is being read (Stop)."""

    opened = Signal(bool)
    reading = Signal(bool)

    def __init__(self, session: EngineSession, results: ResultsPanel, model: Callable[[], SourceSpec | None],
                 say: Callable[[str, int], None], parent: QObject | None = None):
        super().__init__(parent)
        self.session, self.results, self._model, self._say = session, results, model, say
        self.snap: Estimate | None = None  # as read
        self.spec: SourceSpec | None = None  # the model it belongs to; None while shown alone
        self.found: Beside | None = None  # beside that model, once estimated
        self.name = ""

    # ---- what the window asks
    def alone(self) -> Estimate | None:
        """The snapshot when it is shown alone (no model's estimate): what the views and the report show."""
        return self.snap if self.snap is not None and self.spec is None else None

    def for_report(self) -> tuple[Estimate | None, Estimate | None] | None:
        """(measured, the estimate it is compared with) for the report while a snapshot is beside a model (both None
        until it is estimated, or when the model is not the one that ran); None with no snapshot beside one."""
        if self.snap is None or self.spec is None:
            return None
        f = self.found
        return (f.snapshot, f.comparison.estimate) if f is not None and not f.mismatch else (None, None)

    # ---- lifecycle
    def open(self, path: str) -> int:
        """Read a torch.cuda.memory._dump_snapshot file in the engine's snapshot process, with progress."""
        self.results.compare.set_running(True, -1, f"Reading {Path(path).name}…")
        self.results.tabs.setCurrentWidget(self.results.compare)
        self.reading.emit(True)
        return self.session.open_snapshot(str(path), JobCallbacks(
            self._read, self._ended, lambda f, m: self.results.compare.set_running(True, f, m),
            lambda: self._ended("Stopped reading the snapshot.")))

    def model_opened(self) -> None:
        """Another model is open: a snapshot shown alone goes beside it (as the Measured tab invited: open the
        model that ran); one that belonged to the model before is closed."""
        if self.snap is None:
            return
        spec = self._model()
        if self.spec is None and spec is not None:
            self._attach(spec)
            return
        self._say(f"Closed the snapshot {self.name}: it belongs to the model it was opened with.", 10000)
        self.close()

    def estimating(self) -> bool:
        """The window is about to estimate its model (an edit, a setting): True when a snapshot is shown alone (the
        views stay the run's, not the empty sketch's hint). The model is looked at once a model being opened has
        had its say (model_opened, later in the same call)."""
        if self.snap is not None:
            QTimer.singleShot(0, self._follow_model)
        return self.show_alone()

    def _follow_model(self) -> None:
        """A snapshot beside layers now gone, or shown alone while a sketch is built (not the model that ran),
        closes; beside an edited sketch it is compared again."""
        spec = self._model()
        if self.snap is None or spec == self.spec:
            return
        if spec is None or self.spec is None:
            self._say(f"Closed the snapshot {self.name}: " + ("the model it was beside is gone." if spec is None else
                      "the sketch built is not the model that ran (open that model, then the snapshot)."), 10000)
            if self.close():
                self.results.clear("")  # the run is not what these views show now; the sketch's figures come
        else:
            self._attach(spec)

    def show_alone(self) -> bool:
        """Show the snapshot alone again when it is (True), else leave the views (False)."""
        snap = self.alone()
        if snap is None:
            return False
        self.results.set_estimate(snap)  # every view shows the run; the Measured tab has no estimate
        self.results.set_current()  # not an empty sketch's hint: the figures are the run's
        self.results.compare.set_estimate(None)
        self.results.compare.set_measured(snap)
        return True

    def close(self) -> bool:
        """Drop the snapshot from every view; True when it was shown alone (the window shows its model again)."""
        if self.snap is None:
            return False
        for kind in ("snapshot", "beside", "what_fits"):
            self.session.cancel(kind)
        was_alone = self.spec is None
        self.snap = self.spec = self.found = None
        self.results.set_measured(None)
        self.results.compare.set_message(NO_MEASUREMENT)
        self.results.plan.set_real_run("")
        self.opened.emit(False)
        return was_alone

    # ---- answers
    def _ended(self, message: str = "") -> None:
        self.results.compare.set_running(False, message=message)
        self.reading.emit(False)
        if message:
            self._say(message, 10000)

    def _read(self, snap: Estimate) -> None:
        self.close()
        path = snap.snapshot.path if snap.snapshot is not None else None
        self.snap, self.name = snap, Path(path or snap.model_name).name
        self.results.compare.set_running(False)
        self.reading.emit(False)
        spec = self._model()
        if spec is None:
            self.show_alone()
        else:
            self._attach(spec)
        self.results.tabs.setCurrentWidget(self.results.compare)
        self.opened.emit(True)
        oom = snap.oom.message if snap.oom is not None else None
        self._say(f"Snapshot: out of memory, {oom}" if oom
                  else f"Snapshot: peak {format_bytes(snap.peak_bytes)} in {snap.peak_phase}", 15000)

    def _attach(self, spec: SourceSpec) -> None:
        snap = self.snap
        assert snap is not None
        self.spec, self.found = spec, None
        self.session.cancel("what_fits")
        self.results.plan.set_real_run("")
        self.results.set_measured(snap)
        self.results.compare.set_message(f"Real run ({self.name}): estimating the open model in the configuration "
                                         "the snapshot shows…")
        self.session.snapshot_beside(spec, snap, JobCallbacks(self._beside, self._beside_failed))

    def _beside_failed(self, message: str) -> None:
        self.results.compare.set_message(f"Real run ({self.name}): the open model could not be estimated beside it: "
                                         f"{in_panel_terms(message)}")

    def _beside(self, found: Beside) -> None:
        self.found = found
        snap, cfg = found.snapshot, found.config
        failed = snap.oom is not None
        self.results.set_measured(snap)
        self.results.compare.set_comparison(comparison_rows(found.comparison, cfg.peft is not None, failed))
        oom = snap.oom.message if snap.oom is not None else None
        step = f"{cfg.mode}, batch {cfg.batch_size}, {cfg.precision}" + (f", {cfg.optimizer}" if cfg.training else "")
        notes = "; ".join(in_panel_terms(n) for n in found.notes)
        text = (f"Real run ({self.name}): " + (f"out of memory: {oom}." if oom else f"peak in {snap.peak_phase}.")
                + f" Beside the estimate of the step the snapshot shows ({step}"
                + (f"; {notes}" if notes else "") + "), not the panel's settings.")
        if found.mismatch:
            warning = (f"Warning: {found.mismatch}. Open the model that ran, or File ▸ Close snapshot; nothing is "
                       "planned or reported from this comparison.")
            self.results.timeline.set_measured(None)  # not this model's run: no line over its timeline
            self.results.compare.set_message(f"{warning}\n{text}")
            self._say(warning, 15000)
            return
        self.results.compare.set_message(text)
        if failed and self.spec is not None:
            self.results.plan.set_real_run("Working out what would have fit in the memory the failed run had…")
            self.session.what_fits(self.spec, snap, cfg, JobCallbacks(self._fit, self.results.plan.set_real_run))

    def _fit(self, answer: FitAnswer) -> None:
        if self.found is not None:
            self.results.plan.set_real_run(render_fit(answer, self.found.config))
