"""What the window writes out: the PDF memory report (off the GUI thread, through the report package, with the
planner's answers for the estimate shown: it waits for them when they are still coming) and the sketch as
PyTorch code (engine.sketch.codegen). A screenshot is gui.app's `--screenshot`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QStatusBar

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
    """`gpu_snapshot()`: the GPUs as the monitor last saw them (None without the monitor or a GPU)."""

    def __init__(self, ws: Workspace, snapshots: SnapshotLink, results: ResultsPanel, files: Files,
                 status_bar: QStatusBar, gpu_snapshot: Callable[[], dict[str, Any] | None]):
        super().__init__(files)
        self.ws, self.snapshots, self.results, self.files = ws, snapshots, results, files
        self.status_bar, self._gpu_snapshot = status_bar, gpu_snapshot
        self.waiting: str | None = None  # a report to write once the planner has answered
        ws.opened.connect(self._drop_waiting)  # opening a model drops a waiting report
        ws.planSettled.connect(self._write_waiting)

    def _drop_waiting(self) -> None:
        self.waiting = None

    def _write_waiting(self) -> None:
        if self.waiting and not self.ws.session.planning():
            self.report(self.waiting)

    def report_dialog(self) -> None:
        if self.ws.estimate is None and self.snapshots.alone() is None:
            self.files.message("Export report", NO_ESTIMATE)
            return
        path = self.files.save_path("Export report", f"{self.ws.display_name().removesuffix('.json')}-memory.pdf",
                                    "PDF (*.pdf)")
        if path:
            self.report(path if path.lower().endswith(".pdf") else path + ".pdf")

    def report(self, path: str) -> int:
        """Write the PDF report off the GUI thread. While the planner still works on this estimate, the report
        waits for its answers (the app's plan goes into it), and says so; 0 then, else the job's id."""
        ws = self.ws
        if ws.session.planning() and self.snapshots.alone() is None:
            self.waiting = path
            self.results.tabs.setCurrentWidget(self.results.plan)
            self.status_bar.showMessage("The report will be written with the planner's answers as soon as they "
                                        "come (the Plan tab shows how far it is).")
            return 0
        self.waiting = None
        est = self.snapshots.alone() or ws.estimate
        measured, against = self.snapshots.for_report() or (ws.measured, ws.measured_against)
        if est is None:  # the dialog asks only with one on screen, and opening a model drops a waiting report
            self.files.message("Export report", NO_ESTIMATE)
            return 0
        kwargs: ReportContent = {
            "measured": measured, "measured_against": against, "recommendations": ws.recommendations,
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
