"""What the window writes out: the PDF memory report (off the GUI thread, through the report package) and the sketch
as PyTorch code (engine.sketch.codegen). A screenshot is gui.app's `--screenshot`.

The report carries the planner's cheap answers, as the CLI's `report --plan quick` (its default) does: the
recommendations that need no new forward/backward, which come in seconds after the estimate (asked for here when
the planner is off); it is written as soon as they are there, never waiting for the re-traced ones or the largest
batch (what of those is already on screen goes in). File ▸ Export report with full plan… waits for the whole
plan (`--plan full`), with its progress shown in a dialog that cancels the wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QProgressDialog, QStatusBar

from engine.core.progress import CancelToken, Progress
from engine.sketch.codegen import export
from report import build_report
from report.content import ReportContent

from .files import Files
from .results import ResultsPanel
from .session import JobCallbacks
from .snapshot_link import SnapshotLink
from .workspace import Workspace

NO_ESTIMATE = "There is no traced estimate yet; wait for it or fix the model first."


class Exports(QObject):
    """`gpu_snapshot()`: the GPUs as the monitor last saw them (None without the monitor or a GPU).

    `waiting`: (path, full) of a report that waits for the planner's answers (the quick ones, or with `full` the
    whole plan); `progress`: the dialog shown while a full-plan report waits (None otherwise)."""

    def __init__(self, ws: Workspace, snapshots: SnapshotLink, results: ResultsPanel, files: Files,
                 status_bar: QStatusBar, gpu_snapshot: Callable[[], dict[str, Any] | None]):
        super().__init__(files)
        self.ws, self.snapshots, self.results, self.files = ws, snapshots, results, files
        self.status_bar, self._gpu_snapshot = status_bar, gpu_snapshot
        self.waiting: tuple[str, bool] | None = None
        self.progress: QProgressDialog | None = None
        ws.opened.connect(self.cancel_waiting)  # opening a model drops a waiting report
        ws.quickPlan.connect(self._write_waiting)
        ws.planSettled.connect(self._write_waiting)
        ws.estimateReady.connect(self._write_waiting)  # a new estimate: its answers are asked for if need be
        ws.planProgress.connect(self._show_progress)
        ws.maxBatchProgress.connect(self._show_progress)

    def cancel_waiting(self) -> None:
        """Drop the report waiting for the planner (the planner goes on: its answers are the Plan tab's too)."""
        was = self.waiting
        self.waiting = None
        self._close_progress()
        if was is not None:
            self.status_bar.showMessage("Report not written: the wait for the full plan was cancelled.", 6000)

    def _close_progress(self) -> None:
        dialog, self.progress = self.progress, None
        if dialog is not None:
            dialog.canceled.disconnect()
            dialog.rejected.disconnect()
            dialog.close()
            dialog.deleteLater()

    def _write_waiting(self, *_answer: object) -> None:
        """An answer came (or a new estimate, whose answers the planner, off, is asked for): write if ready."""
        if self.waiting is not None:
            path, full = self.waiting
            self.report(path, full=full)

    def _show_progress(self, fraction: float, message: str) -> None:
        dialog = self.progress
        if dialog is None:
            return
        if fraction < 0:
            dialog.setRange(0, 0)  # busy: the step does not know how far it is
        else:
            dialog.setRange(0, 100)
            dialog.setValue(int(100 * min(fraction, 1.0)))
        if message:
            dialog.setLabelText(f"Waiting for the full plan: {message}")

    def _ready(self, full: bool) -> bool:
        """Whether the planner's answers the report carries are there (or will not come)."""
        ws = self.ws
        if full:
            return not ws.session.planning() and (ws.recommendations is not None or bool(ws.plan_failed))
        return (ws.recommendations is not None or ws.quick_recommendations is not None
                or (bool(ws.plan_failed) and not ws.session.is_busy("plan_quick")))

    def report_dialog(self, full: bool = False) -> None:
        if self.ws.estimate is None and self.snapshots.alone() is None:
            self.files.message("Export report", NO_ESTIMATE)
            return
        path = self.files.save_path("Export report", f"{self.ws.display_name().removesuffix('.json')}-memory.pdf",
                                    "PDF (*.pdf)")
        if path:
            self.report(path if path.lower().endswith(".pdf") else path + ".pdf", full=full)

    def report(self, path: str, full: bool = False) -> int:
        """Write the PDF report off the GUI thread, with the planner's quick answers (or, `full`, the whole plan):
        when they are not there yet it waits for them and says so (0 then), else it returns the job's id."""
        ws = self.ws
        if self.snapshots.alone() is None and ws.estimate is not None and not self._ready(full):
            self._wait(path, full)
            return 0
        self.waiting = None
        self._close_progress()
        est = self.snapshots.alone() or ws.estimate
        measured, against = self.snapshots.for_report() or (ws.measured, ws.measured_against)
        if est is None:  # the dialog asks only with one on screen, and opening a model drops a waiting report
            self.files.message("Export report", NO_ESTIMATE)
            return 0
        recommendations = ws.recommendations if ws.recommendations is not None else ws.quick_recommendations
        kwargs: ReportContent = {
            "measured": measured, "measured_against": against, "recommendations": recommendations,
            "max_batch": ws.max_batch.batch_size if ws.max_batch is not None else None,
            "max_batch_none": ws.max_batch_none, "gpu_snapshot": self._gpu_snapshot()}

        def job(cancel: CancelToken, progress: Progress) -> str:
            build_report(path, est, progress=progress, cancel=cancel, **kwargs)
            return path

        say = self.status_bar.showMessage
        say("Writing the report…")
        return ws.session.submit("report", job, JobCallbacks(
            lambda written: say(f"Report written: {written}", 8000),
            lambda message: self.files.message("VRAMScope", message),
            lambda _fraction, message: say(message or "exporting…", 3000)))

    def _wait(self, path: str, full: bool) -> None:
        ws = self.ws
        self.waiting = (path, full)
        if full:
            if not ws.plan_asked(full=True):
                ws.plan()  # the planner is off: it runs now, for the estimate shown
            self.results.tabs.setCurrentWidget(self.results.plan)
            if self.progress is None:
                dialog = QProgressDialog("Waiting for the full plan…", "Cancel", 0, 0, self.files.window)
                dialog.setWindowTitle("Export report with full plan")
                dialog.setMinimumDuration(0)
                dialog.setAutoClose(False)
                dialog.setAutoReset(False)
                dialog.canceled.connect(self.cancel_waiting)  # its Cancel button
                dialog.rejected.connect(self.cancel_waiting)  # Escape
                self.progress = dialog
                dialog.show()
            self.status_bar.showMessage("The report will be written with the full plan as soon as it comes (the "
                                        "Plan tab shows how far it is; Cancel stops the wait).")
            return
        if not ws.plan_asked(full=False):
            ws.quick_plan()  # the planner is off: its cheap answers are asked for now
        self.status_bar.showMessage("The report will be written as soon as the planner's quick answers come "
                                    "(seconds).")

    def code_dialog(self) -> None:
        if self.ws.model_kind != "sketch":
            self.files.message("Export code", "Only sketches export as code; built-in models are already code.")
            return
        path = self.files.save_path("Export PyTorch code", f"{self.ws.display_name().removesuffix('.json')}.py",
                                    "Python (*.py)")
        if path:
            self.code(path if path.endswith(".py") else path + ".py")

    def code(self, path: str) -> bool:
        """Write the sketch as a readable nn.Module file (atomic, through engine.sketch.codegen)."""
        sketch = self.ws.current_sketch()
        if sketch is None:
            return False
        if self.files.guard(lambda: export(sketch, path)):
            self.status_bar.showMessage(f"PyTorch code written: {path}", 6000)
            return True
        return False
