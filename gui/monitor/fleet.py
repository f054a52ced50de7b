"""The fleet view's two faces of one FleetSnapshot: a table (one row per GPU, sortable by any column, filtered by
text and by memory use) and a hosts × GPUs grid coloured by memory use, for a whole cluster at a glance.

The table's text, sort keys and tints are computed once per snapshot off the GUI thread (`FleetRows.build`);
the model signals one `dataChanged` when the order stays, a layout change (selection kept) when it moves.
The grid paints only the cells in view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QModelRoleData,
    QModelRoleDataSpan,
    QPersistentModelIndex,
    QRectF,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QColor, QFont, QMouseEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QWidget

from engine.core.units import format_bytes
from engine.monitor.alerts import ALERT, NA, OK, WARN, Alert, Thresholds, memory_level, temperature_level
from engine.monitor.prometheus import job_text
from engine.monitor.samples import GpuSnapshot

from .cards import LEVEL_COLOURS

COLUMNS = ("Host", "GPU", "Model", "Memory used", "Memory %", "Util", "Temp", "Power", "Job / pod", "Status")
MEMORY_PCT_COLUMN = COLUMNS.index("Memory %")
SORT_ROLE = Qt.ItemDataRole.UserRole
GPU_ROLE = Qt.ItemDataRole.UserRole + 1  # the row's fleet GPU index
_TINTS = {OK: QColor("#dff3e4"), WARN: QColor("#fdecc8"), ALERT: QColor("#f8d4d4"), NA: QColor("#eeeeee")}
_Index = QModelIndex | QPersistentModelIndex
_RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
_DISPLAY, _BACKGROUND, _ALIGN, _TOOLTIP = (int(r) for r in (
    Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.BackgroundRole, Qt.ItemDataRole.TextAlignmentRole,
    Qt.ItemDataRole.ToolTipRole))
_SORT, _GPU = int(SORT_ROLE), int(GPU_ROLE)
_RIGHT_COLUMNS = frozenset((1, 3, 4, 5, 6, 7))
_ROLES = frozenset((_DISPLAY, _BACKGROUND, _ALIGN, _TOOLTIP, _SORT, _GPU))


def _pct(g: GpuSnapshot) -> float | None:
    f = g.memory_fraction
    return None if f is None or not g.ok else f * 100.0


def _text(g: GpuSnapshot, c: int, alerts: list[Alert]) -> str:
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
        return "; ".join(a.kind for a in alerts)
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


def _num(v: float | int | None, ok: bool) -> float:
    return float(v) if ok and v is not None else -1.0


@dataclass(frozen=True)
class FleetRows:
    """Everything the table shows of one snapshot, computed once (on the sampler thread, no Qt objects): per
    GPU its cells' text, sort keys, tints and the words a filter looks for. The GUI thread only indexes it."""

    gpus: tuple[GpuSnapshot, ...]
    cells: tuple[tuple[str, ...], ...]
    keys: tuple[tuple[Any, ...], ...]  # per GPU, one sort key per column
    tints: tuple[tuple[str | None, ...], ...]  # per GPU, one level (or None) per column
    haystacks: tuple[str, ...]
    pcts: tuple[float | None, ...]
    alerts: dict[int, tuple[Alert, ...]]

    @classmethod
    def build(cls, gpus: tuple[GpuSnapshot, ...], alerts: list[Alert], th: Thresholds) -> FleetRows:
        by_gpu: dict[int, list[Alert]] = {}
        for a in alerts:
            by_gpu.setdefault(a.gpu_index, []).append(a)
        cells, keys, tints, hay, pcts = [], [], [], [], []
        for g in gpus:
            mine = by_gpu.get(g.index, [])
            row = tuple(_text(g, c, mine) for c in range(len(COLUMNS)))
            cells.append(row)
            pct = _pct(g)
            pcts.append(pct)
            keys.append((row[0], float(g.host_gpu if g.host_gpu is not None else -1), row[2],
                         _num(g.memory_used, g.ok), -1.0 if pct is None else pct, _num(g.util_gpu, g.ok),
                         _num(g.temperature_c, g.ok), _num(g.power_mw, g.ok), row[8], row[9]))
            mem = memory_level(g, th) if g.ok else NA
            temp = temperature_level(g, th) if g.ok else NA
            tints.append((None, None, None, mem, mem, None, temp if temp in (WARN, ALERT) else None, None, None,
                          ALERT if (not g.ok or mine) else None))
            hay.append(" ".join((row[0], row[2], row[8], g.uuid or "", g.error or "", f"gpu {row[1]}")).lower())
        return cls(gpus, tuple(cells), tuple(keys), tuple(tints), tuple(hay), tuple(pcts),
                   {k: tuple(v) for k, v in by_gpu.items()})


EMPTY_ROWS = FleetRows((), (), (), (), (), (), {})


class FleetModel(QAbstractTableModel):
    """The table of a FleetRows, sorted and filtered here (plain Python over precomputed keys: a fleet of 512
    GPUs re-sorts in about a millisecond, where a proxy model would call back into Python thousands of times).
    Selections follow their GPU through re-sorts."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.data_rows: FleetRows = EMPTY_ROWS
        self.order: list[int] = []  # shown rows → positions in data_rows
        self.sort_column = MEMORY_PCT_COLUMN
        self.sort_order = Qt.SortOrder.DescendingOrder
        self.text = ""
        self.min_pct = 0.0

    # -- feeding -------------------------------------------------------------------------------------------
    def set_rows(self, rows: FleetRows) -> None:
        self._relayout(rows)

    @property
    def total(self) -> int:
        return len(self.data_rows.gpus)

    def gpu_at(self, row: int) -> GpuSnapshot:
        return self.data_rows.gpus[self.order[row]]

    def set_text(self, text: str) -> None:
        self.text = text.strip().lower()
        self._relayout(self.data_rows)

    def set_min_pct(self, pct: float) -> None:
        self.min_pct = float(pct)
        self._relayout(self.data_rows)

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.sort_column, self.sort_order = column, order
        self._relayout(self.data_rows)

    def _visible(self, rows: FleetRows) -> list[int]:
        words = self.text.split()
        keep = [k for k in range(len(rows.gpus))
                if (self.min_pct <= 0 or ((pct := rows.pcts[k]) is not None and pct >= self.min_pct))
                and all(w in rows.haystacks[k] for w in words)]
        c = self.sort_column
        if 0 <= c < len(COLUMNS):
            keys = rows.keys
            # ties keep the host/GPU order, in either direction
            keep.sort(key=lambda k: (keys[k][0], keys[k][1]))
            keep.sort(key=lambda k: keys[k][c], reverse=self.sort_order == Qt.SortOrder.DescendingOrder)
        return keep

    def _relayout(self, rows: FleetRows) -> None:
        order = self._visible(rows)
        old_ids = [self.data_rows.gpus[k].index for k in self.order]
        new_ids = [rows.gpus[k].index for k in order]
        if old_ids == new_ids:
            self.data_rows, self.order = rows, order
            if order:
                self.dataChanged.emit(self.index(0, 0), self.index(len(order) - 1, len(COLUMNS) - 1))
            return
        self.layoutAboutToBeChanged.emit()
        where = {gid: r for r, gid in enumerate(new_ids)}
        old = self.persistentIndexList()
        new = []
        for ix in old:
            r = where.get(old_ids[ix.row()]) if 0 <= ix.row() < len(old_ids) else None
            new.append(self.index(r, ix.column()) if r is not None else QModelIndex())
        self.data_rows, self.order = rows, order
        self.changePersistentIndexList(old, new)
        self.layoutChanged.emit()

    # -- Qt's model interface ------------------------------------------------------------------------------
    def rowCount(self, parent: _Index | None = None) -> int:  # noqa: N802
        return 0 if parent is not None and parent.isValid() else len(self.order)

    def columnCount(self, parent: _Index | None = None) -> int:  # noqa: N802
        return 0 if parent is not None and parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> object:  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None

    def multiData(self, index: _Index, span: QModelRoleDataSpan | QModelRoleData) -> None:  # noqa: N802
        """What the view asks when it paints a cell: every role in one call (Qt 6), not one Python call each."""
        r, c = index.row(), index.column()
        if not 0 <= r < len(self.order):
            return
        k = self.order[r]
        rows = self.data_rows
        if isinstance(span, QModelRoleData):  # the stub allows one role alone; Qt's views pass a span
            span = QModelRoleDataSpan(span)
        for i in range(span.size()):  # the view reuses the span from cell to cell: every role gets set or cleared
            # PySide6's stub lacks QModelRoleDataSpan.__getitem__, which the class has.
            rd: QModelRoleData = span[i]  # type: ignore[index]
            role = rd.role()
            if role == _DISPLAY:
                rd.setData(rows.cells[k][c])
            elif role == _BACKGROUND:
                lvl = rows.tints[k][c]
                if lvl is None:
                    rd.clearData()
                else:
                    rd.setData(_TINTS[lvl])
            elif role == _ALIGN:
                if c in _RIGHT_COLUMNS:
                    rd.setData(_RIGHT)
                else:
                    rd.clearData()
            elif role in _ROLES:
                v = self.data(index, role)
                if v is None:
                    rd.clearData()
                else:
                    rd.setData(v)
            else:
                rd.clearData()

    def data(self, index: _Index, role: int = _DISPLAY) -> object:
        # called for every visible cell and every role Qt asks about: plain ints, the common "no" answered first
        if role not in _ROLES:
            return None
        r, c = index.row(), index.column()
        if not 0 <= r < len(self.order):
            return None
        k = self.order[r]
        if role == _DISPLAY:
            return self.data_rows.cells[k][c]
        if role == _BACKGROUND:
            lvl = self.data_rows.tints[k][c]
            return None if lvl is None else _TINTS[lvl]
        if role == _ALIGN:
            return _RIGHT if c in _RIGHT_COLUMNS else None
        if role == _GPU:
            return self.data_rows.gpus[k].index
        if role == _SORT:
            return self.data_rows.keys[k][c]
        g = self.data_rows.gpus[k]  # tooltip
        if c == 9:
            return "\n".join(a.message for a in self.data_rows.alerts.get(g.index, ())) or None
        if c == 8:
            return "\n".join(f"{key}={v}" for key, v in g.labels) or None
        if c == 2:
            return g.uuid
        return None


_FILLS = {OK: _TINTS[OK].darker(115), WARN: QColor(LEVEL_COLOURS[WARN]), ALERT: QColor(LEVEL_COLOURS[ALERT]),
          NA: QColor(LEVEL_COLOURS[NA])}
_WHITE, _INK, _LOST = QColor("#ffffff"), QColor("#1b1b1b"), QColor("#555555")


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

    def paintEvent(self, e: QPaintEvent) -> None:  # noqa: N802
        area = QRectF(e.rect())
        first = max(0, int(area.top() // self.CELL_H) - 1)
        last = int(area.bottom() // self.CELL_H) + 1  # rows outside the exposed area are not drawn
        p = QPainter(self)
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, small.pointSizeF() * 0.85))
        p.setFont(small)
        p.setPen(QColor("#555"))
        for c in range(self.columns):
            p.drawText(QRectF(self.LABEL_W + c * self.CELL_W, 0, self.CELL_W, self.CELL_H),
                       Qt.AlignmentFlag.AlignCenter, f"GPU {c}")
        for r, h in enumerate(self.hosts):
            if not first <= r + 1 <= last:
                continue
            p.setPen(QColor("#222"))
            p.drawText(QRectF(2, self.CELL_H * (r + 1), self.LABEL_W - 6, self.CELL_H),
                       Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                       p.fontMetrics().elidedText(h, Qt.TextElideMode.ElideMiddle, self.LABEL_W - 6))
        for (r, c), g in self.cells.items():
            if not first <= r + 1 <= last:
                continue
            rect = QRectF(self.LABEL_W + c * self.CELL_W + 1, self.CELL_H * (r + 1) + 1, self.CELL_W - 2,
                          self.CELL_H - 2)  # the 1 px left around is the grid's white line
            if not g.ok:
                p.fillRect(rect, _LOST)
                p.setPen(_WHITE)
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "lost")
            else:
                lvl = memory_level(g, self.thresholds)
                p.fillRect(rect, _FILLS[lvl])
                pct = _pct(g)
                p.setPen(_WHITE if lvl in (WARN, ALERT) else _INK)
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "n/a" if pct is None else f"{pct:.0f}%")
                if g.xid_error:
                    p.setPen(QPen(QColor(LEVEL_COLOURS[ALERT]), 2))
                    p.drawRect(rect.adjusted(1, 1, -1, -1))
        p.end()
