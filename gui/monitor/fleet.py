"""The fleet view's two faces of one FleetSnapshot: a table (one row per GPU, sortable by any column, filtered by
text and by memory use) and a hosts × GPUs grid coloured by memory use, for a whole cluster at a glance.

Both only copy what the snapshot says: the model keeps the rows and signals one `dataChanged` when the same GPUs
come back (the usual tick), a reset only when GPUs come or go; the grid paints itself in one pass.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QRectF, QSize, QSortFilterProxyModel, Qt, Signal
from PySide6.QtGui import QColor, QFont, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QWidget

from engine.monitor.alerts import ALERT, NA, OK, WARN, Alert, Thresholds, memory_level, temperature_level
from engine.monitor.prometheus import job_text
from engine.monitor.snapshot import GpuSnapshot
from engine.units import format_bytes

from .cards import LEVEL_COLOURS

COLUMNS = ("Host", "GPU", "Model", "Memory used", "Memory %", "Util", "Temp", "Power", "Job / pod", "Status")
MEMORY_PCT_COLUMN = COLUMNS.index("Memory %")
SORT_ROLE = Qt.ItemDataRole.UserRole
GPU_ROLE = Qt.ItemDataRole.UserRole + 1  # the row's fleet GPU index
_TINTS = {OK: QColor("#dff3e4"), WARN: QColor("#fdecc8"), ALERT: QColor("#f8d4d4"), NA: QColor("#eeeeee")}
_Index = QModelIndex | QPersistentModelIndex
_NEW_FILTER_API = hasattr(QSortFilterProxyModel, "beginFilterChange")


def _pct(g: GpuSnapshot) -> float | None:
    f = g.memory_fraction
    return None if f is None or not g.ok else f * 100.0


class FleetModel(QAbstractTableModel):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.rows: list[GpuSnapshot] = []
        self._keys: list[int] = []
        self._alerts: dict[int, list[Alert]] = {}
        self.thresholds = Thresholds()

    def set_gpus(self, gpus: tuple[GpuSnapshot, ...], alerts: list[Alert], th: Thresholds) -> None:
        self.thresholds = th
        self._alerts = {}
        for a in alerts:
            self._alerts.setdefault(a.gpu_index, []).append(a)
        keys = [g.index for g in gpus]
        if keys == self._keys and self.rows:
            self.rows = list(gpus)
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, len(COLUMNS) - 1))
            return
        self.beginResetModel()
        self.rows, self._keys = list(gpus), keys
        self.endResetModel()

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        g = self.rows[index.row()]
        c = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(g, c)
        if role == SORT_ROLE:
            return self._sort_value(g, c)
        if role == GPU_ROLE:
            return g.index
        if role == Qt.ItemDataRole.BackgroundRole:
            if c in (3, MEMORY_PCT_COLUMN):
                return _TINTS[memory_level(g, self.thresholds)] if g.ok else _TINTS[NA]
            if c == 6 and g.ok:
                lvl = temperature_level(g, self.thresholds)
                return _TINTS[lvl] if lvl in (WARN, ALERT) else None
            if c == 9 and (not g.ok or self._alerts.get(g.index)):
                return _TINTS[ALERT]
            return None
        if role == Qt.ItemDataRole.ToolTipRole:
            if c == 9:
                return "\n".join(a.message for a in self._alerts.get(g.index, ())) or None
            if c == 8:
                return "\n".join(f"{k}={v}" for k, v in g.labels) or None
            if c == 2:
                return g.uuid
        if role == Qt.ItemDataRole.TextAlignmentRole and c in (1, 3, 4, 5, 6, 7):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def _text(self, g: GpuSnapshot, c: int) -> str:
        if c == 0:
            return g.host or "?"
        if c == 1:
            return "?" if g.host_gpu is None else str(g.host_gpu)
        if c == 2:
            return g.name or "?"
        if c == 8:
            return job_text(g)
        if c == 9:
            if not g.ok:
                return g.error or g.status
            alerts = self._alerts.get(g.index, ())
            return "; ".join(a.kind for a in alerts) if alerts else ""
        if not g.ok:
            return "—"
        if c == 3:
            if g.memory_used is None or not g.memory_total:
                return "n/a"
            return f"{format_bytes(g.memory_used)} / {format_bytes(g.memory_total)}"
        if c == 4:
            p = _pct(g)
            return "n/a" if p is None else f"{p:.0f}%"
        if c == 5:
            return "n/a" if g.util_gpu is None else f"{g.util_gpu}%"
        if c == 6:
            return "n/a" if g.temperature_c is None else f"{g.temperature_c} °C"
        if c == 7:
            return "n/a" if g.power_mw is None else f"{g.power_mw / 1000:.0f} W"
        return ""

    def _sort_value(self, g: GpuSnapshot, c: int) -> object:
        if c == 0:
            return g.host or ""
        if c == 1:
            return g.host_gpu if g.host_gpu is not None else -1
        if c == 3:
            return g.memory_used if g.ok and g.memory_used is not None else -1
        if c == 4:
            p = _pct(g)
            return -1.0 if p is None else p
        if c == 5:
            return g.util_gpu if g.ok and g.util_gpu is not None else -1
        if c == 6:
            return g.temperature_c if g.ok and g.temperature_c is not None else -1
        if c == 7:
            return g.power_mw if g.ok and g.power_mw is not None else -1
        return self._text(g, c)


class FleetFilter(QSortFilterProxyModel):
    """Rows whose host, model, job/pod or status contain the text, with memory use at least `min_pct`."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.text = ""
        self.min_pct = 0.0
        self.setSortRole(SORT_ROLE)
        self.setDynamicSortFilter(True)

    def set_text(self, text: str) -> None:
        self._change(lambda: setattr(self, "text", text.strip().lower()))

    def set_min_pct(self, pct: float) -> None:
        self._change(lambda: setattr(self, "min_pct", float(pct)))

    def _change(self, apply) -> None:
        if _NEW_FILTER_API:  # Qt 6.9+: invalidateFilter() is deprecated
            self.beginFilterChange()
            apply()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            apply()
            self.invalidateFilter()

    def filterAcceptsRow(self, row: int, parent: _Index) -> bool:  # noqa: N802
        model = self.sourceModel()
        assert isinstance(model, FleetModel)
        g = model.rows[row]
        if self.min_pct > 0:
            p = _pct(g)
            if p is None or p < self.min_pct:
                return False
        if self.text:
            hay = " ".join((g.host or "", g.name or "", job_text(g), g.uuid or "", g.error or "",
                            f"gpu {g.host_gpu}")).lower()
            return all(word in hay for word in self.text.split())
        return True


class FleetGrid(QWidget):
    """Hosts as rows, their GPUs as columns; each cell coloured by memory use (the thresholds' levels), with the
    percentage in it. Clicking a cell emits `gpuClicked(fleet index)`."""

    gpuClicked = Signal(int)
    CELL_W, CELL_H, LABEL_W = 42, 20, 120

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.hosts: list[str] = []
        self.cells: dict[tuple[int, int], GpuSnapshot] = {}  # (row, column) → GPU
        self.columns = 0
        self.thresholds = Thresholds()
        self.setMouseTracking(True)

    def set_gpus(self, gpus: tuple[GpuSnapshot, ...], th: Thresholds) -> None:
        self.thresholds = th
        hosts = sorted({g.host or "?" for g in gpus})
        row = {h: k for k, h in enumerate(hosts)}
        per_host: dict[str, int] = {}
        cells: dict[tuple[int, int], GpuSnapshot] = {}
        for g in gpus:
            h = g.host or "?"
            col = g.host_gpu if g.host_gpu is not None else per_host.get(h, 0)
            per_host[h] = max(per_host.get(h, 0), col + 1)
            cells[(row[h], col)] = g
        changed = hosts != self.hosts or max(per_host.values(), default=0) != self.columns
        self.hosts, self.cells, self.columns = hosts, cells, max(per_host.values(), default=0)
        if changed:
            self.updateGeometry()
            self.setMinimumSize(self.sizeHint())
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(self.LABEL_W + self.CELL_W * max(1, self.columns) + 4, self.CELL_H * (len(self.hosts) + 1) + 4)

    def cell_at(self, x: float, y: float) -> GpuSnapshot | None:
        if x < self.LABEL_W or y < self.CELL_H:
            return None
        return self.cells.get((int((y - self.CELL_H) // self.CELL_H), int((x - self.LABEL_W) // self.CELL_W)))

    def cell_rect(self, index: int) -> QRectF | None:
        for (r, c), g in self.cells.items():
            if g.index == index:
                return QRectF(self.LABEL_W + c * self.CELL_W, self.CELL_H * (r + 1), self.CELL_W, self.CELL_H)
        return None

    def mousePressEvent(self, e: QMouseEvent) -> None:  # noqa: N802
        g = self.cell_at(e.position().x(), e.position().y())
        if g is not None and e.button() == Qt.MouseButton.LeftButton:
            self.gpuClicked.emit(g.index)
        super().mousePressEvent(e)

    def mouseMoveEvent(self, e: QMouseEvent) -> None:  # noqa: N802
        g = self.cell_at(e.position().x(), e.position().y())
        if g is None:
            self.setToolTip("")
        elif not g.ok:
            self.setToolTip(f"{g.label}: {g.error or g.status}")
        else:
            mem = (f"{format_bytes(g.memory_used)} / {format_bytes(g.memory_total)}"
                   if g.memory_used is not None and g.memory_total else "memory n/a")
            job = job_text(g)
            self.setToolTip(f"{g.label} · {g.name or '?'}\n{mem}" + (f"\n{job}" if job else ""))
        super().mouseMoveEvent(e)

    def paintEvent(self, _e: QPaintEvent) -> None:  # noqa: N802
        p = QPainter(self)
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
        p.setFont(small)
        p.setPen(QColor("#555"))
        for c in range(self.columns):
            p.drawText(QRectF(self.LABEL_W + c * self.CELL_W, 0, self.CELL_W, self.CELL_H),
                       Qt.AlignmentFlag.AlignCenter, f"GPU {c}")
        for r, h in enumerate(self.hosts):
            p.setPen(QColor("#222"))
            p.drawText(QRectF(2, self.CELL_H * (r + 1), self.LABEL_W - 6, self.CELL_H),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                       p.fontMetrics().elidedText(h, Qt.TextElideMode.ElideMiddle, self.LABEL_W - 6))
        grid = QPen(QColor("#ffffff"), 2)
        for (r, c), g in self.cells.items():
            rect = QRectF(self.LABEL_W + c * self.CELL_W, self.CELL_H * (r + 1), self.CELL_W, self.CELL_H)
            if not g.ok:
                p.fillRect(rect, QColor("#555555"))
                p.setPen(QColor("#ffffff"))
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "lost")
            else:
                lvl = memory_level(g, self.thresholds)
                p.fillRect(rect, QColor(LEVEL_COLOURS[lvl]) if lvl != OK else _TINTS[OK].darker(115))
                pct = _pct(g)
                p.setPen(QColor("#ffffff") if lvl in (WARN, ALERT) else QColor("#1b1b1b"))
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "n/a" if pct is None else f"{pct:.0f}%")
                if g.xid_error:
                    p.setPen(QPen(QColor(LEVEL_COLOURS[ALERT]), 2))
                    p.drawRect(rect.adjusted(2, 2, -2, -2))
            p.setPen(grid)
            p.drawRect(rect)
        p.end()
