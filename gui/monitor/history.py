"""History plots (memory, utilization, temperature, power), one curve per GPU, redrawn on their own QTimer.

They read the ring buffer when the timer fires and only if it changed, so a slow repaint never delays a sample
and a burst of samples costs one redraw.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QGridLayout, QWidget

from engine.core.units import GIB
from engine.monitor.alerts import Alert
from engine.monitor.ringbuffer import RingBuffer
from engine.monitor.samples import GpuSnapshot, Snapshot

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

# (key, title, unit, value from a GpuSnapshot)
METRICS: tuple[tuple[str, str, str, Callable[[GpuSnapshot], float | None]], ...] = (
    ("memory", "Memory used", "GiB", lambda g: None if g.memory_used is None else g.memory_used / GIB),
    ("util", "GPU utilization", "%", lambda g: g.util_gpu),
    ("temp", "Temperature", "°C", lambda g: g.temperature_c),
    ("power", "Power", "W", lambda g: None if g.power_mw is None else g.power_mw / 1000),
)


def series(snaps: list[Snapshot], end: float, window: float, gpu: int,
           value: Callable[[GpuSnapshot], float | None]) -> tuple[np.ndarray, np.ndarray]:
    """x = seconds before `end`, y = the metric (NaN where not available or the GPU was lost)."""
    xs, ys = [], []
    for s in snaps:
        if s.time < end - window or s.time > end:
            continue
        g = s.gpu(gpu)
        v = value(g) if g is not None and g.ok else None
        xs.append(s.time - end)
        ys.append(np.nan if v is None else float(v))
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


MIN_PLOT_HEIGHT = 150


class HistoryPlots(QWidget):
    def __init__(self, buffer: RingBuffer[Snapshot], parent: QWidget | None = None, repaint_ms: int = 500):
        super().__init__(parent)
        self.buffer = buffer
        self.window_s = 300.0
        self.gpu_filter: int | None = None  # None: all GPUs
        self.end_time: float | None = None  # replay position; None = the newest sample
        self.overlay: tuple[str, int] | None = None
        self.alert_marks: list[Alert] = []
        self.names: dict[int, str] = {}  # legend names by GPU index (a fleet's "node-3 GPU 5"); else "GPU i"
        self._drawn_key: tuple[int, int] | None = None  # (the buffer's id, its version) last drawn
        self.paints = 0
        self.plots: dict[str, pg.PlotWidget] = {}
        self.curves: dict[tuple[str, int], pg.PlotDataItem] = {}
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        for k, (key, title, unit, _) in enumerate(METRICS):
            pw = pg.PlotWidget(title=title)
            pw.setBackground("w")
            pw.showGrid(x=True, y=True, alpha=0.3)
            pw.setLabel("left", unit)
            pw.setLabel("bottom", "seconds ago")
            if key == "memory":
                pw.addLegend(offset=(5, 5))
            pw.setMouseEnabled(x=False, y=False)
            pw.setMinimumHeight(MIN_PLOT_HEIGHT)  # room for a title, a curve and values on both axes
            self.plots[key] = pw
            grid.addWidget(pw, k // 2, k % 2)
        self._overlay_line: pg.InfiniteLine | None = None
        self._alert_lines: list[pg.InfiniteLine] = []
        self.timer = QTimer(self)
        self.timer.setInterval(repaint_ms)
        self.timer.timeout.connect(self.repaint_from_buffer)
        self.timer.start()

    # -- settings from the panel ---------------------------------------------------------------------------
    def set_buffer(self, buffer: RingBuffer[Snapshot]) -> None:
        self.buffer = buffer
        self._drawn_key = None

    def set_window(self, seconds: float) -> None:
        self.window_s = float(seconds)
        self._drawn_key = None

    def set_gpu_filter(self, gpu: int | None) -> None:
        self.gpu_filter = gpu
        self._drawn_key = None

    def set_end_time(self, t: float | None) -> None:
        self.end_time = t
        self._drawn_key = None

    def set_overlay(self, overlay: tuple[str, int] | None) -> None:
        self.overlay = overlay
        pw = self.plots["memory"]
        if self._overlay_line is not None:
            pw.removeItem(self._overlay_line)
            self._overlay_line = None
        if overlay is not None:
            name, nbytes = overlay
            line = pg.InfiniteLine(pos=nbytes / GIB, angle=0, movable=False,
                                   pen=pg.mkPen("#1f4fd1", width=2, style=pg.QtCore.Qt.PenStyle.DashLine),
                                   label=f"{name}: predicted peak {nbytes / GIB:.2f} GiB",
                                   # Right-aligned at the right (the legend is top left), below the line when
                                   # it is in the upper half of the plot, above it in the lower: always inside.
                                   labelOpts={"position": 0.98, "color": "#1f4fd1", "anchors": [(1, 0), (1, 1)]})
            pw.addItem(line)
            self._overlay_line = line
        self._drawn_key = None

    def set_alert_marks(self, alerts: list[Alert]) -> None:
        self.alert_marks = list(alerts)[-50:]  # enough to see a pattern, few enough to stay fast
        self._drawn_key = None

    # -- drawing -------------------------------------------------------------------------------------------
    def repaint_from_buffer(self, force: bool = False) -> bool:
        """Redraw if the buffer or a setting changed since the last draw. Returns whether it drew."""
        key = (id(self.buffer), self.buffer.version)
        if not force and key == self._drawn_key:
            return False
        self._drawn_key = key
        snaps = self.buffer.items()
        if not snaps:
            for c in self.curves.values():
                c.setData([], [])
            return True
        end = self.end_time if self.end_time is not None else snaps[-1].time
        indices = sorted({g.index for s in snaps for g in s.gpus})
        shown = [i for i in indices if self.gpu_filter is None or i == self.gpu_filter]
        for key_, _title, _unit, value in METRICS:
            pw = self.plots[key_]
            for i in indices:
                curve = self.curves.get((key_, i))
                if curve is None:
                    pen = pg.mkPen(COLOURS[i % len(COLOURS)], width=2)
                    curve = pw.plot([], [], pen=pen, name=self.names.get(i, f"GPU {i}"), connect="finite")
                    self.curves[(key_, i)] = curve
                if i in shown:
                    x, y = series(snaps, end, self.window_s, i, value)
                    curve.setData(x, y, connect="finite")
                    curve.show()
                else:
                    curve.hide()
            pw.setXRange(-self.window_s, 0, padding=0.01)
        self._draw_alert_marks(end)
        self.paints += 1
        return True

    def _draw_alert_marks(self, end: float) -> None:
        pw = self.plots["memory"]
        for line in self._alert_lines:
            pw.removeItem(line)
        self._alert_lines = []
        for a in self.alert_marks:
            x = a.time - end
            if -self.window_s <= x <= 0 and (self.gpu_filter is None or a.gpu_index == self.gpu_filter):
                line = pg.InfiniteLine(pos=x, angle=90, movable=False, pen=pg.mkPen("#d43c3c", width=1))
                line.setToolTip(a.message)
                pw.addItem(line)
                self._alert_lines.append(line)

    def curve_data(self, metric: str, gpu: int) -> tuple[np.ndarray, np.ndarray]:
        """What is drawn now (for tests and the report)."""
        c = self.curves.get((metric, gpu))
        if c is None:
            return np.array([]), np.array([])
        x, y = c.getData()
        return (np.array([]) if x is None else x), (np.array([]) if y is None else y)
