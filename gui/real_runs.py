"""Real runs beside the estimate: the configured step profiled on this machine (the workspace keeps the
measurement; the Measured tab shows it), this machine's GPU calibrated (engine.measure.calibrate, through the engine
session), and a real run's PyTorch memory snapshot opened and closed (gui.snapshot_link reads and shows it)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QStatusBar

from .config_panel import ConfigPanel
from .files import Files
from .results import ResultsPanel
from .session import JobCallbacks
from .snapshot_link import SnapshotLink
from .workspace import Workspace

SNAPSHOT_FILTER = "PyTorch memory snapshots (*.pickle *.pickle.gz *.pkl *.gz)"


class RealRuns(QObject):
    """canProfile(bool) and canStop(bool): whether Run ▸ Profile and Run ▸ Stop apply now."""

    canProfile = Signal(bool)
    canStop = Signal(bool)

    def __init__(self, ws: Workspace, snapshots: SnapshotLink, results: ResultsPanel, config_panel: ConfigPanel,
                 files: Files, status_bar: QStatusBar):
        super().__init__(files)
        self.ws, self.snapshots, self.results, self.config_panel = ws, snapshots, results, config_panel
        self.files, self.status_bar = files, status_bar
        ws.profileStarted.connect(self._started)
        ws.profileProgress.connect(lambda fraction, message: results.compare.set_running(True, fraction, message))
        ws.profileEnded.connect(self._ended)
        ws.measuredReady.connect(self._measured)
        snapshots.opened.connect(self._snapshot_opened)

    # ---- profile
    def profile(self) -> None:
        self.config_panel.flush()
        self.ws.profile()

    def stop_profile(self) -> None:
        self.ws.session.cancel("profile")
        self.ws.session.cancel("snapshot")

    def _running(self, running: bool) -> None:
        self.canProfile.emit(not running)
        self.canStop.emit(running)

    def _started(self) -> None:
        self.results.compare.set_running(True, -1, "Running the step for real on this machine…")
        self.results.tabs.setCurrentWidget(self.results.compare)
        self._running(True)

    def _ended(self, message: str = "") -> None:
        self.results.compare.set_running(False, message=message)
        self._running(False)

    def _measured(self) -> None:
        self.snapshots.close()  # the Measured tab shows this run now
        self.results.set_measured(self.ws.measured, against=self.ws.measured_against)
        self.results.compare.set_running(False)
        self._running(False)
        self.results.tabs.setCurrentWidget(self.results.compare)

    # ---- calibrate
    def calibrate_gpu(self) -> None:
        """Run `vramscope calibrate` for this machine's GPU 0 and the current model (engine.measure.calibrate)."""
        from engine.measure.calibrate import NO_GPU, cuda_available  # the kernel probe loads when first used

        if not cuda_available():
            self.files.message("Calibrate this GPU", NO_GPU[0].upper() + NO_GPU[1:] + ".")
            return
        spec, cfg = self.ws.source_spec(), self.ws.config()
        if spec is None:
            return
        self.status_bar.showMessage("Calibrating this GPU…")
        self.ws.session.calibrate(spec, cfg, JobCallbacks(self._calibrated, self._calibrate_failed))

    def _calibrated(self, summary: str) -> None:
        self.status_bar.showMessage(f"Calibrated: {summary}", 10000)
        self.ws.request_estimate(immediate=True)  # the estimate now uses the measurements

    def _calibrate_failed(self, message: str) -> None:
        self.status_bar.clearMessage()
        self.files.message("Calibrate this GPU", message)

    # ---- memory snapshots
    def open_snapshot_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.files.window, "Open memory snapshot", self.files.dialog_dir(),
                                              f"{SNAPSHOT_FILTER};;All files (*)")
        if path:
            self.files.remember_dir(path)
            self.open_snapshot(path)

    def open_snapshot(self, path: str) -> int:
        """Read a memory snapshot (gui.snapshot_link): shown beside the open model, or alone with none."""
        return self.snapshots.open(path)

    def _snapshot_opened(self, opened: bool) -> None:
        if opened:  # the Measured tab and the report show the snapshot now, not an earlier profile run
            self.ws.drop_measured()

    def close_snapshot(self) -> None:
        if self.snapshots.close():  # it was shown alone: the model's own figures (or the empty sketch's hint) again
            self.ws.request_estimate(immediate=True)
