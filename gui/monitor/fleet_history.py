"""One fleet GPU's history: range queries to Prometheus run on a worker thread, and the monitor's own history plots
draw the answer. A failure (server gone, timeout, credentials) is shown in the dialog; the window never waits."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from engine.monitor.promapi import PromError
from engine.monitor.prometheus import PrometheusSource
from engine.monitor.ringbuffer import RingBuffer
from engine.monitor.samples import GpuSnapshot, Snapshot

from .history import HistoryPlots

WINDOWS = (("15 min", 900), ("1 h", 3600), ("6 h", 6 * 3600), ("24 h", 24 * 3600))


class FleetHistoryDialog(QDialog):
    """`loaded` fires (on the GUI thread) with the number of samples drawn, or -1 after an error."""

    loaded = Signal(int)
    _answer = Signal(object, object, int)  # snapshots or None, error text or None, request number

    def __init__(self, source: PrometheusSource, gpu: GpuSnapshot, parent: QWidget | None = None,
                 window_s: int = 900):
        super().__init__(parent)
        self.source = source
        self.gpu = gpu
        self.setWindowTitle(f"{gpu.label} · {gpu.name or ''} — history from {source.server}")
        self.resize(900, 600)
        lay = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.status = QLabel("Asking Prometheus…")
        bar.addWidget(self.status, 1)
        self.window_combo = QComboBox()
        for label, secs in WINDOWS:
            self.window_combo.addItem(label, secs)
        self.window_combo.setCurrentIndex(max(0, self.window_combo.findData(window_s)))
        self.window_combo.currentIndexChanged.connect(lambda _: self.reload())
        bar.addWidget(self.window_combo)
        self.reload_button = QPushButton("Reload")
        self.reload_button.clicked.connect(self.reload)
        bar.addWidget(self.reload_button)
        lay.addLayout(bar)
        self.buffer: RingBuffer[Snapshot] = RingBuffer(1)
        self.plots = HistoryPlots(self.buffer)
        self.plots.names = {gpu.index: gpu.label}
        lay.addWidget(self.plots, 1)
        self.snapshots: list[Snapshot] = []
        self._request = 0
        self._answer.connect(self._show, Qt.ConnectionType.QueuedConnection)
        self.reload()

    def reload(self) -> None:
        self._request += 1
        n = self._request
        window = int(self.window_combo.currentData())
        end = time.time()
        self.status.setText(f"Asking Prometheus for the last {self.window_combo.currentText()}…")

        def work() -> None:
            try:
                snaps = self.source.history(self.gpu.index, end - window, end)
            except PromError as e:
                self._answer.emit(None, e.message, n)
                return
            except Exception as e:  # a malformed answer must end as a message, not a dead thread
                self._answer.emit(None, f"{type(e).__name__}: {e}", n)
                return
            self._answer.emit(snaps, None, n)

        threading.Thread(target=work, name="vramscope-fleet-history", daemon=True).start()

    def _show(self, snaps: list[Snapshot] | None, error: str | None, n: int) -> None:
        if n != self._request:
            return  # an older request answered late
        if snaps is None:
            self.status.setText(f"Could not read the history: {error}")
            self.status.setStyleSheet("color: #d43c3c")
            self.loaded.emit(-1)
            return
        self.status.setStyleSheet("")
        self.snapshots = snaps
        window = int(self.window_combo.currentData())
        self.buffer = RingBuffer(max(1, len(snaps)), snaps)
        self.plots.set_buffer(self.buffer)
        self.plots.set_window(window)
        self.plots.set_end_time(time.time())
        self.plots.repaint_from_buffer(force=True)
        if snaps:
            step = f" (one every {snaps[1].time - snaps[0].time:g} s)" if len(snaps) > 1 else ""
            self.status.setText(f"{len(snaps)} samples over the last {self.window_combo.currentText()}{step}")
        else:
            self.status.setText(f"Prometheus holds no samples of {self.gpu.label} in the last "
                                f"{self.window_combo.currentText()}")
        self.loaded.emit(len(snaps))

    def done(self, r: int) -> None:
        self.plots.timer.stop()
        super().done(r)
