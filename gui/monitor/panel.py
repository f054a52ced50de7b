"""The live GPU monitor panel: cards, history plots, process table, alerts, record and replay, estimate overlay.

Sampling runs on the engine's Sampler thread (which also feeds alerts and the recorder); the panel only reads the
ring buffer on its own timers, so neither a slow repaint nor a burst of samples can block the other.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSlider,
    QSplitter,
    QStyle,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from engine.core.errors import UserError
from engine.monitor.alerts import Alert, AlertMonitor, Thresholds
from engine.monitor.nvml import NvmlSource
from engine.monitor.recording import Recorder, ReplaySource, load_recording
from engine.monitor.ringbuffer import RingBuffer
from engine.monitor.sampler import DEFAULT_INTERVAL_S, MIN_INTERVAL_S, Sampler, SnapshotSource, capacity_for
from engine.monitor.samples import Snapshot
from engine.results.types import Estimate

from .alert_list import MAX_ALERTS, AlertList, labelled
from .cards import LEVEL_COLOURS, GpuCard
from .history import HistoryPlots
from .processes import ProcessTable
from .thresholds import ThresholdsDialog

WINDOWS = (("1 min", 60), ("5 min", 300), ("15 min", 900), ("1 h", 3600))
SPEEDS = (("1×", 1.0), ("10×", 10.0), ("60×", 60.0))
CARD_COLUMNS = 3
LIVE, REPLAY = "live", "replay"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def no_gpu_text(reason: str) -> str:
    """The monitor's one message when there is nothing to sample: why, and what still works."""
    return (f"No NVIDIA GPU to monitor: {str(reason).rstrip('.')}.\n"
            "Estimates work without one; “Open recording…” replays a session recorded on a GPU machine.")


class MonitorPanel(QWidget):
    """Embeddable monitor. `source`: None → the local GPUs through NVML; any object with `sample()` → that;
    a ReplaySource → opens straight into replay of its snapshots. Call `shutdown()` before discarding it."""

    alertRaised = Signal(object)  # an engine.monitor.alerts.Alert, on the GUI thread
    modeChanged = Signal(str)  # "live" | "replay"
    plots: HistoryPlots  # made in __init__ after the controls whose signals drive it

    def __init__(self, parent: QWidget | None = None, source: SnapshotSource[Snapshot] | None = None, *,
                 interval: float = DEFAULT_INTERVAL_S, autostart: bool = True, refresh_ms: int = 250,
                 repaint_ms: int = 500):
        super().__init__(parent)
        replay = source if isinstance(source, ReplaySource) else None
        self._owns_source = source is None
        self._source: SnapshotSource[Snapshot] | None = None if replay is not None else source
        self._interval = interval
        self._lock = threading.Lock()  # guards the alert monitor and the pending queue (sampler thread vs GUI)
        self._alerts = AlertMonitor()
        self._pending: deque[Alert] = deque()
        self._alert_log: list[Alert] = []
        self._recorder: Recorder | None = None
        self._overlay: tuple[str, int] | None = None
        self._mode = LIVE
        self._shown: Snapshot | None = None
        self._replay: list[Snapshot] = []
        self._replay_active: list[list[Alert]] = []
        self._replay_marks: list[Alert] = []
        self._replay_name = ""
        self._replay_alerts_shown = -1  # how many of the recording's alerts the list shows (those up to the position)
        self._pos = 0
        self._tray: QSystemTrayIcon | None = None
        self._closed = False
        self._last_error: str | None = None
        self._status_hold_until = 0.0
        self.buffer: RingBuffer[Snapshot] = RingBuffer(capacity_for(interval))
        self._replay_buffer: RingBuffer[Snapshot] = RingBuffer(1)
        self.sampler: Sampler[Snapshot] | None = None
        self.cards: dict[int, GpuCard] = {}
        self._build(repaint_ms)

        self._ui_timer = QTimer(self)
        self._ui_timer.setInterval(refresh_ms)
        self._ui_timer.timeout.connect(self.refresh)
        self._ui_timer.start()
        self._play_timer = QTimer(self)
        self._play_timer.setSingleShot(True)
        self._play_timer.timeout.connect(self._play_step)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)  # a safety net; the main window should call it first

        if replay is not None:
            self._enter_replay(replay.snapshots, "recorded session")
        elif autostart:
            self.start()

    # -- building ------------------------------------------------------------------------------------------
    def _build(self, repaint_ms: int) -> None:
        root = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.status_label = QLabel("Starting…")
        bar.addWidget(self.status_label, 1)
        bar.addWidget(QLabel("every"))
        self.interval_spin = QDoubleSpinBox()
        self.interval_spin.setRange(MIN_INTERVAL_S, 60.0)
        self.interval_spin.setSingleStep(0.1)
        self.interval_spin.setDecimals(1)
        self.interval_spin.setSuffix(" s")
        self.interval_spin.setValue(self._interval)
        self.interval_spin.valueChanged.connect(self.set_interval)
        bar.addWidget(self.interval_spin)
        self.window_combo = QComboBox()
        for label, secs in WINDOWS:
            self.window_combo.addItem(label, secs)
        self.window_combo.setCurrentIndex(1)
        self.window_combo.currentIndexChanged.connect(lambda _: self.plots.set_window(self.window_combo.currentData()))
        bar.addWidget(self.window_combo)
        self.gpu_combo = QComboBox()
        self.gpu_combo.addItem("all GPUs", None)
        self.gpu_combo.currentIndexChanged.connect(lambda _: self.plots.set_gpu_filter(self.gpu_combo.currentData()))
        bar.addWidget(self.gpu_combo)
        self.thresholds_button = QPushButton("Thresholds…")
        self.thresholds_button.clicked.connect(self._edit_thresholds)
        self.record_button = QPushButton("Record…")
        self.record_button.setCheckable(True)
        self.record_button.clicked.connect(self._record_clicked)
        self.open_button = QPushButton("Open recording…")
        self.open_button.clicked.connect(self._open_clicked)
        self.live_button = QPushButton("Back to live")
        self.live_button.clicked.connect(self.back_to_live)
        self.live_button.hide()
        self.notify_check = QCheckBox("Desktop notifications")
        for button in (self.thresholds_button, self.record_button, self.open_button, self.live_button,
                       self.notify_check):
            bar.addWidget(button)
        root.addLayout(bar)

        self.replay_bar = QWidget()
        rb = QHBoxLayout(self.replay_bar)
        rb.setContentsMargins(0, 0, 0, 0)
        self.play_button = QPushButton("Play")
        self.play_button.setCheckable(True)
        self.play_button.toggled.connect(self._play_toggled)
        self.speed_combo = QComboBox()
        for label, speed in SPEEDS:
            self.speed_combo.addItem(label, speed)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.valueChanged.connect(self.show_position)
        self.position_label = QLabel()
        rb.addWidget(self.play_button)
        rb.addWidget(self.speed_combo)
        rb.addWidget(self.slider, 1)
        rb.addWidget(self.position_label)
        self.replay_bar.hide()
        root.addWidget(self.replay_bar)

        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.message.setStyleSheet("font-size: 15px; padding: 24px; color: #444")
        self.message.hide()
        root.addWidget(self.message)

        split = QSplitter(Qt.Orientation.Vertical)
        cards_host = QWidget()
        self._cards_grid = QGridLayout(cards_host)
        self._cards_grid.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(cards_host)
        self._cards_scroll = scroll
        self.plots = HistoryPlots(self.buffer, repaint_ms=repaint_ms)
        self.plots.set_window(self.window_combo.currentData())
        bottom = QSplitter(Qt.Orientation.Horizontal)
        self.process_table = ProcessTable()
        self.alert_list = AlertList()
        alerts_box = labelled(self.alert_list)
        bottom.addWidget(self.process_table)
        bottom.addWidget(alerts_box)
        bottom.setStretchFactor(0, 3)
        bottom.setStretchFactor(1, 1)
        for part in (scroll, self.plots, bottom):
            split.addWidget(part)
        split.setStretchFactor(1, 2)
        self._main_area = split
        root.addWidget(split, 1)

    # -- live sampling -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or resume) sampling the live source."""
        if self._closed:
            return
        self._ensure_sampler().start()

    def _ensure_sampler(self) -> Sampler[Snapshot]:
        if self.sampler is None:
            if self._source is None:
                self._source = NvmlSource()
                self._owns_source = True
            self.sampler = Sampler(self._source, callback=self._on_sample, interval=self._interval,
                                   buffer=self.buffer, on_error=self._on_sampler_error)
        return self.sampler

    def _on_sample(self, snap: Snapshot) -> None:
        # sampler thread: no Qt calls here, only engine objects guarded by locks
        with self._lock:
            self._pending.extend(self._alerts.update(snap))
            rec = self._recorder
        if rec is not None:
            rec.write(snap)

    def _on_sampler_error(self, err: BaseException) -> None:
        msg = f"monitor error: {type(err).__name__}: {err}"
        with self._lock:
            if msg != self._last_error:  # the same failure every tick is one alert, not a flood
                self._last_error = msg
                self._pending.append(Alert("error", -1, time.time(), msg))

    def report_snapshot(self) -> dict[str, Any] | None:
        """The GPUs as last seen live, for a memory report; None when there is no GPU (or only a replay)."""
        if self._mode != LIVE:
            return None
        snap = self.buffer.last()
        return snap.report_summary() if snap is not None and snap.gpus else None

    def sample_now(self) -> Snapshot | None:
        """Take one live sample on the calling thread and show it (for tests and a manual refresh)."""
        snap = self._ensure_sampler().sample_now()
        self.refresh()
        return snap

    def set_interval(self, seconds: float) -> None:
        self._interval = float(seconds)
        if self.sampler is not None:
            try:
                self.sampler.set_interval(seconds)
            except UserError as e:
                self._set_status(str(e), error=True)
        if abs(self.interval_spin.value() - seconds) > 1e-9:
            self.interval_spin.setValue(seconds)

    def set_window(self, seconds: int) -> None:
        k = self.window_combo.findData(seconds)
        if k < 0:
            raise ValueError(f"window must be one of {[s for _, s in WINDOWS]} seconds")
        self.window_combo.setCurrentIndex(k)

    # -- showing -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """GUI timer: show the newest sample (live) and any alerts the sampler raised."""
        if self._closed:
            return
        with self._lock:
            new = list(self._pending)
            self._pending.clear()
            active = list(self._alerts.active.values())
        for a in new:
            self._log_alert(a)
        if self._mode == LIVE:
            snap = self.buffer.last()
            if snap is not None and (snap is not self._shown or new):
                self._show(snap, active)
                self.plots.set_alert_marks(self._alert_log)
                self._set_live_status(snap)

    def _show(self, snap: Snapshot, active: list[Alert]) -> None:
        self._shown = snap
        no_gpu_reason = snap.error if snap.error and not snap.gpus else None
        no_gpu = no_gpu_reason is not None
        # Nothing to record without a GPU (a recording in progress can still be stopped).
        self.record_button.setEnabled(not no_gpu or self._recorder is not None)
        self.record_button.setToolTip("No NVIDIA GPU here: there is nothing to record." if no_gpu else
                                      "Record the live samples to a .csv or .jsonl file")
        if no_gpu_reason is not None:
            self.message.setText(no_gpu_text(no_gpu_reason))
            self.message.show()
            self._main_area.hide()
            self._sync_cards([])
            self.process_table.set_processes(())
            return
        self.message.hide()
        self._main_area.show()
        self._sync_cards([g.index for g in snap.gpus])
        th = self._alerts.thresholds
        for g in snap.gpus:
            mine = [a for a in active if a.gpu_index == g.index]
            self.cards[g.index].show_gpu(g, th, mine, self._overlay)
        self.process_table.set_processes(snap.processes)

    def _sync_cards(self, indices: list[int]) -> None:
        if sorted(self.cards) == sorted(indices):
            return
        for card in self.cards.values():
            self._cards_grid.removeWidget(card)
            card.deleteLater()
        self.cards = {}
        for k, i in enumerate(indices):
            card = GpuCard(i)
            self.cards[i] = card
            self._cards_grid.addWidget(card, k // CARD_COLUMNS, k % CARD_COLUMNS, Qt.AlignmentFlag.AlignTop)
        current = self.gpu_combo.currentData()
        self.gpu_combo.blockSignals(True)
        self.gpu_combo.clear()
        self.gpu_combo.addItem("all GPUs", None)
        for i in indices:
            self.gpu_combo.addItem(f"GPU {i}", i)
        if self.cards:
            # show a full row of cards (two when there are more), the plots take the rest
            rows = min(2, (len(indices) + CARD_COLUMNS - 1) // CARD_COLUMNS)
            h = max(c.sizeHint().height() for c in self.cards.values())
            self._cards_scroll.setMinimumHeight(rows * (h + self._cards_grid.spacing()) + 4)
        k = self.gpu_combo.findData(current)
        self.gpu_combo.setCurrentIndex(max(0, k))
        self.gpu_combo.blockSignals(False)
        self.plots.set_gpu_filter(self.gpu_combo.currentData())

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet(f"color: {LEVEL_COLOURS['alert']}" if error else "")
        # an error (bad file, bad interval) stays readable for a while instead of being replaced next sample
        self._status_hold_until = time.monotonic() + 10.0 if error else 0.0

    def _set_live_status(self, snap: Snapshot) -> None:
        if time.monotonic() < self._status_hold_until:
            return
        if snap.error and not snap.gpus:
            self._set_status("Nothing to sample here")
            return
        parts = ["Live"]
        if snap.driver_version:
            parts.append(f"driver {snap.driver_version}")
        parts.append(f"sampled {_clock(snap.time)} every {self._interval:g} s")
        if self._recorder is not None:
            parts.append(f"recording to {self._recorder.path.name} ({self._recorder.count} samples)")
        self._set_status(" · ".join(parts))

    def _log_alert(self, a: Alert) -> None:
        self._alert_log.append(a)
        del self._alert_log[:-MAX_ALERTS]  # a week-long session must not grow without bound
        if self._mode == LIVE:
            self.alert_list.prepend(a)
        self.alertRaised.emit(a)
        if self.notify_check.isChecked():
            self._notify(a)

    def _notify(self, a: Alert) -> None:
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return
        if self._tray is None:
            self._tray = QSystemTrayIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning), self)
            self._tray.show()
        self._tray.showMessage("VRAMScope GPU alert", a.message, QSystemTrayIcon.MessageIcon.Warning, 8000)

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def alerts(self) -> list[Alert]:
        """Every alert raised so far in this view (live), or found in the recording (replay)."""
        return list(self._replay_marks if self._mode == REPLAY else self._alert_log)

    def message_text(self) -> str:
        """The plain message shown instead of the cards (no driver), or '' when GPUs are shown."""
        return self.message.text() if not self.message.isHidden() else ""

    # -- thresholds ----------------------------------------------------------------------------------------
    @property
    def thresholds(self) -> Thresholds:
        return self._alerts.thresholds

    def set_thresholds(self, th: Thresholds) -> None:
        with self._lock:
            self._alerts.set_thresholds(th)
        if self._mode == REPLAY:
            self._analyse_replay()
            self.show_position(self._pos)
        elif self._shown is not None:
            with self._lock:
                active = list(self._alerts.active.values())
            self._show(self._shown, active)

    def _edit_thresholds(self) -> None:
        dlg = ThresholdsDialog(self.thresholds, self)
        if dlg.exec():
            self.set_thresholds(dlg.thresholds())

    # -- estimate overlay ----------------------------------------------------------------------------------
    def set_estimate_overlay(self, name: str, bytes: int | None) -> None:  # noqa: A002 (the agreed signature)
        """Show an estimate's predicted peak: a line on the memory plot, "needs X, has Y free" on each card.
        `bytes=None` removes it."""
        self._overlay = None if bytes is None else (str(name), int(bytes))
        self.plots.set_overlay(self._overlay)
        if self._shown is not None:
            active = self._replay_active[self._pos] if self._mode == REPLAY and self._replay_active else \
                list(self._alerts.active.values())
            self._show(self._shown, active)

    def set_estimate(self, estimate: Estimate | None) -> None:
        """Overlay an engine.results.types.Estimate (None clears): its predicted nvidia-smi figure when it has GPU
        figures (what the monitor's "used" compares with), else its peak of live tensor bytes."""
        if estimate is None:
            self.set_estimate_overlay("", None)
            return
        gpu = estimate.gpu
        need = gpu.nvidia_smi_bytes if gpu is not None else estimate.peak_bytes
        self.set_estimate_overlay(estimate.model_name, need)

    # -- recording -----------------------------------------------------------------------------------------
    def start_recording(self, path: str | Path) -> bool:
        """Record live samples to .csv or .jsonl from now on. False (and a message) if the file cannot be made."""
        self.stop_recording()
        try:
            rec = Recorder(path)
        except UserError as e:
            self._set_status(str(e), error=True)
            self.record_button.setChecked(False)
            return False
        with self._lock:
            self._recorder = rec
        self.record_button.setChecked(True)
        self.record_button.setText("Stop recording")
        if self.sampler is None or not self.sampler.running:
            self.start()
        return True

    @property
    def recorded_samples(self) -> int | None:
        """Samples written so far by the recording in progress; None when not recording."""
        rec = self._recorder
        return None if rec is None else rec.count

    def stop_recording(self) -> Path | None:
        with self._lock:
            rec, self._recorder = self._recorder, None
        self.record_button.setChecked(False)
        self.record_button.setText("Record…")
        if rec is None:
            return None
        path = rec.close()
        self._set_status(f"recorded {rec.count} samples to {path}")
        return path

    def _record_clicked(self, checked: bool) -> None:
        if not checked:
            self.stop_recording()
            return
        path, _ = QFileDialog.getSaveFileName(self, "Record GPU session", str(Path.home() / "gpu-session.csv"),
                                              "CSV (*.csv);;JSON Lines (*.jsonl)")
        if not path:
            self.record_button.setChecked(False)
            return
        self.start_recording(path)

    # -- replay --------------------------------------------------------------------------------------------
    def open_recording(self, path: str | Path) -> bool:
        """Replay a recorded session in this panel. False (and the reason shown) when the file is unusable."""
        try:
            snaps = load_recording(path)
        except UserError as e:
            self._set_status(str(e), error=True)
            return False
        self._enter_replay(snaps, Path(path).name)
        return True

    def _open_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open recorded GPU session", str(Path.home()),
                                              "Recordings (*.csv *.jsonl *.json *.ndjson)")
        if path:
            self.open_recording(path)

    def _enter_replay(self, snaps: list[Snapshot], name: str) -> None:
        self._play_timer.stop()
        self.play_button.setChecked(False)
        self._replay = list(snaps)
        self._replay_name = name
        self._mode = REPLAY
        self._replay_buffer = RingBuffer(max(1, len(self._replay)), self._replay)
        self.plots.set_buffer(self._replay_buffer)
        self._analyse_replay()
        self.replay_bar.show()
        self.live_button.show()
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(self._replay) - 1))
        self.slider.blockSignals(False)
        self.modeChanged.emit(REPLAY)
        self.show_position(len(self._replay) - 1)

    def _analyse_replay(self) -> None:
        """Run the alert logic over the whole recording: marks for the plot, active alerts per position."""
        am = AlertMonitor(self.thresholds)
        self._replay_marks, self._replay_active = [], []
        for s in self._replay:
            self._replay_marks += am.update(s)
            self._replay_active.append(list(am.active.values()))
        self._replay_alerts_shown = -1  # show_position lists those raised by then

    def show_position(self, k: int) -> None:
        """Replay: show the k-th recorded sample (cards, table) and the history up to it."""
        if self._mode != REPLAY or not self._replay:
            return
        k = max(0, min(int(k), len(self._replay) - 1))
        self._pos = k
        if self.slider.value() != k:
            self.slider.blockSignals(True)
            self.slider.setValue(k)
            self.slider.blockSignals(False)
        snap = self._replay[k]
        self._show(snap, self._replay_active[k])
        self._show_replay_alerts(snap.time)
        self.plots.set_end_time(snap.time)
        self.position_label.setText(f"{k + 1} / {len(self._replay)} · {_clock(snap.time)}")
        self._set_status(f"Replay of {self._replay_name}: {len(self._replay)} samples, "
                         f"{self._replay[-1].time - self._replay[0].time:.0f} s")

    def _show_replay_alerts(self, t: float) -> None:
        """The alerts the recording had raised by time `t`, in the list and on the plot (not its end's, from the
        first sample on)."""
        n = bisect.bisect_right([a.time for a in self._replay_marks], t)
        if n != self._replay_alerts_shown:
            self._replay_alerts_shown = n
            self.plots.set_alert_marks(self._replay_marks[:n])
            self.alert_list.fill(self._replay_marks[:n])

    @property
    def replay_position(self) -> int:
        return self._pos

    def _play_toggled(self, on: bool) -> None:
        self.play_button.setText("Pause" if on else "Play")
        if on:
            if self._pos >= len(self._replay) - 1:
                self.show_position(0)
            self._schedule_next()
        else:
            self._play_timer.stop()

    def _schedule_next(self) -> None:
        if self._pos >= len(self._replay) - 1:
            self.play_button.setChecked(False)
            return
        dt = self._replay[self._pos + 1].time - self._replay[self._pos].time
        speed = self.speed_combo.currentData() or 1.0
        self._play_timer.start(int(1000 * min(2.0, max(0.02, dt / speed))))

    def _play_step(self) -> None:
        if self._mode != REPLAY:
            return
        self.show_position(self._pos + 1)
        if self.play_button.isChecked():
            self._schedule_next()

    def back_to_live(self) -> None:
        self._play_timer.stop()
        self.play_button.setChecked(False)
        self._mode = LIVE
        self._replay, self._replay_active, self._replay_marks = [], [], []
        self.replay_bar.hide()
        self.live_button.hide()
        self.plots.set_buffer(self.buffer)
        self.plots.set_end_time(None)
        self.plots.set_alert_marks(self._alert_log)
        self.alert_list.fill(self._alert_log)
        self._shown = None
        self.modeChanged.emit(LIVE)
        if self.sampler is None or not self.sampler.running:
            self.start()
        self._set_status("Live · waiting for the first sample")
        self.refresh()

    # -- life cycle ----------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop sampling, close a recording in progress, release NVML. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._ui_timer.stop()
        self._play_timer.stop()
        self.plots.timer.stop()
        if self.sampler is not None:
            self.sampler.stop()
        self.stop_recording()
        hung = self.sampler is not None and self.sampler.running  # a driver call that never returned
        if self._owns_source and not hung and self._source is not None:
            self._source.close()
        if self._tray is not None:
            self._tray.hide()

    stop = shutdown  # the name the main window calls

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(event)
