"""The per-layer table: each module's own memory, sortable by any column; selecting a row names the module."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from PySide6.QtCore import (
    QAbstractTableModel,
    QItemSelection,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLineEdit, QTableView, QVBoxLayout, QWidget

from engine.results.types import ModuleRow

from .formatting import format_bytes, format_count, format_share

_DIGITS = re.compile(r"\d+")
MODULE_MIN_PX = 200  # the Module column's width when the figures need the rest (a long name loses its middle)
RESIZE_ROWS = 100
SORT_ROLE = Qt.ItemDataRole.UserRole + 1  # raw number (or lower-cased text) used for sorting
_Index = QModelIndex | QPersistentModelIndex


class LayerTableModel(QAbstractTableModel):
    """Rows are engine.results.types.ModuleRow; display text is formatted, the sort role carries raw values."""

    # (header, field, accessor): the field names the column's kind for formatting, the accessor reads its value
    COLUMNS: tuple[tuple[str, str, Callable[[ModuleRow], str | int | float]], ...] = (
        ("Module", "name", lambda r: r.name),
        ("Type", "type", lambda r: r.type),
        ("Parameters", "parameters", lambda r: r.parameters),
        ("Activations", "activation_bytes", lambda r: r.activation_bytes),
        ("At peak", "bytes_at_peak", lambda r: r.bytes_at_peak),
        ("Share of peak", "share_of_peak", lambda r: r.share_of_peak),
    )

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._rows: list[ModuleRow] = []
        # Each row's display texts and sort keys, made once per estimate: the proxy's sort and the view ask for
        # them tens of thousands of times on a 1,000-module model (formatting each time stalled the GUI thread).
        self._text: list[tuple[str, ...]] = []
        self._keys: list[tuple[str | int | float, ...]] = []

        self._sorted_by: tuple[int, Qt.SortOrder] | None = None

    def set_rows(self, rows: Sequence[ModuleRow] | None) -> None:
        self.beginResetModel()
        self._rows = list(rows or ())
        self._text = [tuple(self._display(attr, accessor(r)) for _h, attr, accessor in self.COLUMNS)
                      for r in self._rows]
        self._keys = [tuple(self._sort_key(accessor(r)) for _h, _attr, accessor in self.COLUMNS) for r in self._rows]
        if self._sorted_by is not None:
            self._reorder(self._order(*self._sorted_by))
        self.endResetModel()

    def _order(self, column: int, order: Qt.SortOrder) -> list[int]:
        # Stable both ways, as Qt's own sort: equal rows keep the engine's order.
        return sorted(range(len(self._rows)), key=lambda i: self._keys[i][column],
                      reverse=order == Qt.SortOrder.DescendingOrder)

    def _reorder(self, perm: list[int]) -> None:
        self._rows = [self._rows[i] for i in perm]
        self._text = [self._text[i] for i in perm]
        self._keys = [self._keys[i] for i in perm]

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        """Sorted here, in Python on keys made once (the proxy's own sort asked Qt to compare through `data`:
        tens of milliseconds of the GUI thread on every estimate of a large model). Selected rows stay selected."""
        if not 0 <= column < len(self.COLUMNS):
            return
        self._sorted_by = (column, order)
        self.layoutAboutToBeChanged.emit()
        perm = self._order(column, order)
        where = {old: new for new, old in enumerate(perm)}
        before = self.persistentIndexList()
        after = [self.index(where[i.row()], i.column()) if i.isValid() else QModelIndex() for i in before]
        self._reorder(perm)
        self.changePersistentIndexList(before, after)
        self.layoutChanged.emit()

    @staticmethod
    def _display(attr: str, value: str | int | float) -> str:
        if isinstance(value, str):  # the name and type columns
            return (value or "(model)") if attr == "name" else value
        if attr == "parameters":
            return format_count(int(value))
        if attr.endswith("bytes") or attr.startswith("bytes_"):
            return format_bytes(int(value or 0))
        if attr == "share_of_peak":
            return format_share(float(value))
        return str(value)

    @staticmethod
    def _sort_key(value: str | int | float) -> str | int | float:
        if isinstance(value, str):  # numbers inside names by value: layers.2 before layers.10
            return _DIGITS.sub(lambda m: m.group().zfill(12), value.lower())
        return value or 0

    def row_at(self, r: int) -> ModuleRow:
        return self._rows[r]

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> object:  # noqa: N802
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section][0]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text[index.row()][index.column()]
        if role == SORT_ROLE:
            return self._keys[index.row()][index.column()]
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() > 1:  # the figures (not name, type)
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            row = self._rows[index.row()]
            return (
                f"{row.name or '(model)'} ({row.type})\n"
                f"parameters {format_count(row.parameters)} = {format_bytes(row.parameter_bytes)}\n"
                f"gradients {format_bytes(row.gradient_bytes)}, optimizer state {format_bytes(row.optimizer_bytes)}\n"
                f"activations alive at the peak {format_bytes(row.activation_bytes)}\n"
                f"{format_share(row.share_of_peak)} of the peak"
            )
        return None


class _SortedBySource(QSortFilterProxyModel):
    """Filters the rows; sorting them is the source model's own (LayerTableModel.sort)."""

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        source = self.sourceModel()
        if isinstance(source, LayerTableModel):
            source.sort(column, order)


class LayerTable(QWidget):
    """A filterable, sortable table of ModuleRows. `moduleSelected(name)` when the user selects a row."""

    moduleSelected = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = LayerTableModel(self)
        self.proxy = _SortedBySource(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterKeyColumn(-1)  # match name or type
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)

        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter modules…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self.proxy.setFilterFixedString)

        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setAlternatingRowColors(True)
        self.view.verticalHeader().setVisible(False)
        self.view.verticalHeader().setDefaultSectionSize(22)
        # Every column as wide as what it holds and widened or narrowed by dragging its edge; the table scrolls
        # sideways when they do not fit (a stretched Module column was squeezed to "…" beside the figures). A name
        # still too long for its column loses its middle, not the end that tells the modules apart.
        hh = self.view.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(False)
        # Widths from the rows on screen and RESIZE_ROWS around them, not every row: measuring each of a 1,000-module
        # model's rows stalled the GUI thread for 150 ms on every estimate (the Module column is clamped anyway).
        hh.setResizeContentsPrecision(RESIZE_ROWS)
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.view.sortByColumn(4, Qt.SortOrder.DescendingOrder)  # largest holders first
        self.view.selectionModel().selectionChanged.connect(self._selection_changed)
        self._quiet = False

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addWidget(self.filter)
        lay.addWidget(self.view)

    def set_rows(self, rows: Sequence[ModuleRow] | None) -> None:
        self.model.set_rows(rows)
        self.view.resizeColumnsToContents()
        # The figures stay in view when the names would push them out, as long as the names keep MODULE_MIN_PX.
        hh = self.view.horizontalHeader()
        room = self.view.viewport().width() - sum(hh.sectionSize(c) for c in range(1, self.model.columnCount()))
        hh.resizeSection(0, min(hh.sectionSize(0), max(room, MODULE_MIN_PX)))

    def selected_module(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        if not rows:
            return None
        return self.model.row_at(self.proxy.mapToSource(rows[0]).row()).name

    def select_module(self, name: str) -> None:
        """Select the row of `name` (from the canvas) without echoing moduleSelected back."""
        self._quiet = True
        try:
            self.view.clearSelection()
            for r in range(self.model.rowCount()):
                if self.model.row_at(r).name == name:
                    idx = self.proxy.mapFromSource(self.model.index(r, 0))
                    if idx.isValid():
                        self.view.selectRow(idx.row())
                        self.view.scrollTo(idx)
                    break
        finally:
            self._quiet = False

    def _selection_changed(self, _selected: QItemSelection, _deselected: QItemSelection) -> None:
        if self._quiet:
            return
        name = self.selected_module()
        if name is not None:
            self.moduleSelected.emit(name)
