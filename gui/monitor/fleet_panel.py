"""The fleet panel: every GPU one Prometheus server knows, as a hosts × GPUs grid and a sortable, filterable
table, with alerts (memory, XID errors, GPUs that stop being reported) and each GPU's history on a click.

The engine's Sampler asks Prometheus on its own thread (one instant query per tick for the whole fleet); the panel
reads the newest answer on a GUI timer, so an unreachable or slow server shows as a state and never freezes the
window. `refresh()` is the only GUI-thread work per tick, and is what the scale benchmark measures.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from PySide6.QtCore import QModelIndex, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QStyle,
    QSystemTrayIcon,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from engine.monitor.alerts import Alert, AlertMonitor, Thresholds
from engine.monitor.promapi import PromClient
from engine.monitor.prometheus import OK, FleetSnapshot, PrometheusSource
from engine.monitor.ringbuffer import RingBuffer
from engine.monitor.sampler import MIN_INTERVAL_S, Sampler

from .alert_list import MAX_ALERTS, AlertList, labelled
from .cards import LEVEL_COLOURS
from .fleet import GPU_ROLE, MEMORY_PCT_COLUMN, FleetGrid, FleetModel, FleetRows
from .fleet_history import FleetHistoryDialog
from .prometheus_dialog import PrometheusDialog
from .thresholds import ThresholdsDialog

DEFAULT_FLEET_INTERVAL_S = 5.0


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class FleetPanel(QWidget):
    """Call `shutdown()` before discarding it. `closeRequested` asks the owner to remove it."""

    alertRaised = Signal(object)
    closeRequested = Signal()

    def __init__(self, source: PrometheusSource, parent: QWidget | None = None, *,
                 interval: float = DEFAULT_FLEET_INTERVAL_S, autostart: bool = True, refresh_ms: int = 250):
        super().__init__(parent)
        self.source = source
        self._interval = interval
        self._lock = threading.Lock()
        self._alerts = AlertMonitor()
        self._pending: deque[Alert] = deque()
        self._rows: dict[int, FleetRows] = {}  # id(snapshot) → its table rows, built on the sampler thread
        self.alert_log: list[Alert] = []
        self.buffer: RingBuffer[FleetSnapshot] = RingBuffer(2)
        self._shown: FleetSnapshot | None = None
        self._asked_at = time.time()
        self._closed = False
        self.history_dialog: FleetHistoryDialog | None = None
        self._tray: QSystemTrayIcon | None = None
        self.refresh_seconds: list[float] = []  # GUI-thread time of each refresh that drew (for the benchmark)
        self.sampler = Sampler(source, callback=self._on_sample, interval=interval, buffer=self.buffer,
                               on_error=self._on_error)
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(refresh_ms)
        self._timer.timeout.connect(self.refresh)
        self._timer.start()
        if autostart:
            self.start()

    def _build(self) -> None:
        root = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.server_label = QLabel(f"<b>{self.source.server}</b>")
        bar.addWidget(self.server_label)
        self.status_label = QLabel("Asking Prometheus…")
        self.status_label.setWordWrap(True)
        bar.addWidget(self.status_label, 1)
        bar.addWidget(QLabel("every"))
        self.interval_spin = QDoubleSpinBox()
        self.interval_spin.setRange(max(1.0, MIN_INTERVAL_S), 300.0)
        self.interval_spin.setSuffix(" s")
        self.interval_spin.setDecimals(0)
        self.interval_spin.setValue(self._interval)
        self.interval_spin.valueChanged.connect(self.set_interval)
        bar.addWidget(self.interval_spin)
        self.thresholds_button = QPushButton("Thresholds…")
        self.thresholds_button.clicked.connect(self._edit_thresholds)
        self.close_button = QPushButton("Close")
        self.close_button.setToolTip("Stop reading this server and close its tab")
        self.close_button.clicked.connect(self.closeRequested.emit)
        self.notify_check = QCheckBox("Desktop notifications")
        bar.addWidget(self.thresholds_button)
        bar.addWidget(self.notify_check)
        bar.addWidget(self.close_button)
        root.addLayout(bar)

        filters = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter: host, model, pod or job (Ctrl+F)")
        self.filter_edit.setClearButtonEnabled(True)
        filters.addWidget(self.filter_edit, 1)
        filters.addWidget(QLabel("memory at least"))
        self.min_memory_spin = QSpinBox()
        self.min_memory_spin.setRange(0, 100)
        self.min_memory_spin.setSuffix(" %")
        filters.addWidget(self.min_memory_spin)
        self.count_label = QLabel()
        filters.addWidget(self.count_label)
        root.addLayout(filters)

        self.model = FleetModel(self)
        self.filter_edit.textChanged.connect(self._filter_changed)
        self.min_memory_spin.valueChanged.connect(self._filter_changed)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(MEMORY_PCT_COLUMN, Qt.SortOrder.DescendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        for col, w in enumerate((150, 40, 170, 170, 75, 55, 65, 65, 220)):
            self.table.setColumnWidth(col, w)
        self.table.setToolTip("Click a GPU for its history")
        self.table.clicked.connect(self._row_clicked)
        self.table.activated.connect(self._row_clicked)

        self.grid = FleetGrid()
        self.grid.gpuClicked.connect(self.open_history)
        grid_scroll = QScrollArea()
        grid_scroll.setWidget(self.grid)
        grid_scroll.setWidgetResizable(False)
        grid_scroll.setMinimumWidth(260)

        self.alert_list = AlertList()
        alerts_box = labelled(self.alert_list)

        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(grid_scroll)
        top.addWidget(self.table)
        top.setStretchFactor(1, 3)
        self._top = top
        self._grid_sized = False
        main = QSplitter(Qt.Orientation.Vertical)
        main.addWidget(top)
        main.addWidget(alerts_box)
        main.setStretchFactor(0, 4)
        main.setStretchFactor(1, 1)
        root.addWidget(main, 1)
        self._main = main

    # -- sampling ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if not self._closed:
            self._asked_at = time.time()
            self.sampler.start()

    def set_interval(self, seconds: float) -> None:
        self._interval = float(seconds)
        self.sampler.set_interval(seconds)
        if abs(self.interval_spin.value() - seconds) > 1e-9:
            self.interval_spin.setValue(seconds)

    def _on_sample(self, snap: FleetSnapshot) -> None:  # sampler thread: no Qt objects, only plain data
        if snap.state != OK:
            return
        with self._lock:
            self._pending.extend(self._alerts.update(snap))
            active = list(self._alerts.active.values())
            th = self._alerts.thresholds
        rows = FleetRows.build(snap.gpus, active, th)  # the table's text and keys, off the GUI thread
        with self._lock:
            self._rows[id(snap)] = rows
            while len(self._rows) > 4:
                self._rows.pop(next(iter(self._rows)))

    def _on_error(self, err: BaseException) -> None:
        with self._lock:
            self._pending.append(Alert("error", -1, time.time(), f"fleet monitor error: {type(err).__name__}: {err}"))

    def sample_now(self) -> FleetSnapshot | None:
        """One query on the calling thread, shown at once (tests, and a manual refresh)."""
        snap = self.sampler.sample_now()
        self.refresh()
        return snap

    # -- showing -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        if self._closed:
            return
        t0 = time.perf_counter()
        with self._lock:
            new = list(self._pending)
            self._pending.clear()
            active = list(self._alerts.active.values())
        for a in new:
            self._log_alert(a)
        snap = self.buffer.last()
        if snap is None or (snap is self._shown and not new):
            self._show_waiting(snap)
            return
        self._shown = snap
        self._show(snap, active)
        self.refresh_seconds.append(time.perf_counter() - t0)
        del self.refresh_seconds[:-1000]

    def _show(self, snap: FleetSnapshot, active: list[Alert]) -> None:
        th = self._alerts.thresholds
        if snap.state != OK:
            self._set_status(f"{snap.message} (at {_clock(snap.time)}); asking again every {self._interval:g} s",
                             error=True)
            self._mark_stale(True)
            return
        self._mark_stale(False)
        with self._lock:
            rows = self._rows.get(id(snap))
        if rows is None or rows.gpus is not snap.gpus:  # thresholds changed, or a sample taken on this thread
            rows = FleetRows.build(snap.gpus, active, th)
        self.model.set_rows(rows)
        self.grid.set_gpus(snap.gpus, th)
        if not self._grid_sized and self.grid.columns:
            self._grid_sized = True  # the whole grid in view at first (the user may drag the splitter later)
            want = self.grid.sizeHint().width() + 24
            self._top.setSizes([want, max(200, self._top.width() - want)])
        lost = sum(1 for g in snap.gpus if not g.ok)
        parts = [f"{len(snap.gpus)} GPUs on {len(snap.hosts)} hosts", ", ".join(snap.families),
                 f"updated {_clock(snap.time)} ({snap.query_s * 1000:.0f} ms)"]
        if lost:
            parts.append(f"{lost} not reported any more")
        if snap.targets_down:
            parts.append(f"targets down: {', '.join(snap.targets_down[:3])}"
                         + (f" and {len(snap.targets_down) - 3} more" if len(snap.targets_down) > 3 else ""))
        self._set_status(" · ".join(p for p in parts if p), error=bool(lost or snap.targets_down))
        self._update_count()

    def _show_waiting(self, snap: FleetSnapshot | None) -> None:
        """A slow server: say so once the answer is overdue, keeping the last picture (marked stale)."""
        since = snap.time if snap is not None else self._asked_at
        overdue = time.time() - since > self._interval + self.source.client.timeout + 1.0
        if overdue and self.sampler.running:
            what = "no answer yet" if snap is None else f"last answer at {_clock(snap.time)}"
            self._set_status(f"Prometheus is slow to answer ({what}); still waiting", error=True)
            self._mark_stale(True)

    def _mark_stale(self, stale: bool) -> None:
        self.table.setEnabled(not stale or self.model.total == 0)
        self.grid.setEnabled(not stale)

    def _set_status(self, text: str, error: bool = False) -> None:
        if self.status_label.text() != text:
            self.status_label.setText(text)
        self.status_label.setStyleSheet(f"color: {LEVEL_COLOURS['alert']}" if error else "")

    @property
    def status_text(self) -> str:
        return self.status_label.text()

    def _filter_changed(self) -> None:
        self.model.min_pct = float(self.min_memory_spin.value())
        self.model.set_text(self.filter_edit.text())
        self._update_count()

    def _update_count(self) -> None:
        shown, total = self.model.rowCount(), self.model.total
        self.count_label.setText(f"{shown} of {total} GPUs" if shown != total else f"{total} GPUs")

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802
        if e.key() == Qt.Key.Key_F and e.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.filter_edit.setFocus()
            self.filter_edit.selectAll()
            return
        super().keyPressEvent(e)

    # -- alerts --------------------------------------------------------------------------------------------
    def _log_alert(self, a: Alert) -> None:
        self.alert_log.append(a)
        del self.alert_log[:-MAX_ALERTS]
        self.alert_list.prepend(a)
        self.alertRaised.emit(a)
        if self.notify_check.isChecked() and QSystemTrayIcon.isSystemTrayAvailable():
            if self._tray is None:
                icon = self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
                self._tray = QSystemTrayIcon(icon, self)
                self._tray.show()
            self._tray.showMessage(f"VRAMScope fleet alert · {self.source.server}", a.message,
                                   QSystemTrayIcon.MessageIcon.Warning, 8000)

    @property
    def thresholds(self) -> Thresholds:
        return self._alerts.thresholds

    def set_thresholds(self, th: Thresholds) -> None:
        with self._lock:
            self._alerts.set_thresholds(th)
            self._rows.clear()  # their tints followed the old thresholds
        self._shown = None
        self.refresh()

    def _edit_thresholds(self) -> None:
        dlg = ThresholdsDialog(self.thresholds, self)
        if dlg.exec():
            self.set_thresholds(dlg.thresholds())

    # -- history -------------------------------------------------------------------------------------------
    def _row_clicked(self, index: QModelIndex) -> None:
        gpu = index.data(GPU_ROLE)
        if gpu is not None:
            self.open_history(int(gpu))

    def open_history(self, gpu_index: int) -> FleetHistoryDialog | None:
        snap = self._shown
        g = next((x for x in snap.gpus if x.index == gpu_index), None) if snap is not None else None
        if g is None:
            return None
        if self.history_dialog is not None:
            self.history_dialog.close()
        self.history_dialog = FleetHistoryDialog(self.source, g, self)
        self.history_dialog.show()
        return self.history_dialog

    # -- life cycle ----------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer.stop()
        self.sampler.stop(timeout=0.5)  # a query in flight ends by its own timeout; the thread is a daemon
        if self.history_dialog is not None:
            self.history_dialog.close()
        if self._tray is not None:
            self._tray.hide()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(event)


def ask_for_server(settings: QSettings | None, parent: QWidget | None = None) -> FleetPanel | None:
    """Monitor ▸ Add Prometheus server…: the dialog, then a panel reading that server (None if cancelled)."""
    dlg = PrometheusDialog(settings, parent)
    if not dlg.exec() or dlg.client is None:
        return None
    return FleetPanel(PrometheusSource(dlg.client))


def panel_for(url: str, *, interval: float = DEFAULT_FLEET_INTERVAL_S, autostart: bool = True,
              refresh_ms: int = 250) -> FleetPanel:
    """A panel on `url` with credentials from the environment (tests, scripts)."""
    return FleetPanel(PrometheusSource(PromClient(url)), interval=interval, autostart=autostart,
                      refresh_ms=refresh_ms)
