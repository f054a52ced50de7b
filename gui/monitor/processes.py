"""The process table: every process holding GPU memory, sortable by any column, filterable to the user's own."""

from __future__ import annotations

import getpass
import os

from PySide6.QtCore import QModelIndex, QObject, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QCheckBox, QHeaderView, QTableView, QVBoxLayout, QWidget

from engine.core.units import format_bytes
from engine.monitor.samples import ProcessInfo

COLUMNS = ("GPU", "PID", "User", "Type", "GPU memory", "Command")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1


def current_user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers: fall back to the uid's name, if any
        try:
            import pwd

            return pwd.getpwuid(os.getuid()).pw_name
        except Exception:
            return None


class _OwnFilter(QSortFilterProxyModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.only_user: str | None = None

    def filterAcceptsRow(self, row: int, parent: QModelIndex | QPersistentModelIndex) -> bool:
        if self.only_user is None:
            return True
        user: object = self.sourceModel().index(row, 2, parent).data()
        return user == self.only_user


class ProcessTable(QWidget):
    def __init__(self, parent: QWidget | None = None, user: str | None = None):
        super().__init__(parent)
        self.user = user if user is not None else current_user()
        self.model = QStandardItemModel(0, len(COLUMNS), self)
        self.model.setHorizontalHeaderLabels(list(COLUMNS))
        self.proxy = _OwnFilter(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(4, Qt.SortOrder.DescendingOrder)  # the biggest users first
        self.view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QTableView.EditTrigger.NoEditTriggers)
        self.view.verticalHeader().hide()
        self.view.horizontalHeader().setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.own_only = QCheckBox(f"Only my processes ({self.user or 'unknown user'})")
        self.own_only.setEnabled(self.user is not None)
        self.own_only.toggled.connect(self.set_own_only)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.own_only)
        lay.addWidget(self.view)
        self._shown: tuple[ProcessInfo, ...] = ()

    def set_own_only(self, on: bool) -> None:
        if self.own_only.isChecked() != on:
            self.own_only.setChecked(on)  # re-enters through toggled
            return
        self.proxy.only_user = self.user if on else None
        self.proxy.invalidate()

    def set_processes(self, procs: tuple[ProcessInfo, ...]) -> None:
        if procs == self._shown:
            return  # unchanged: keep the selection and scroll position
        self._shown = procs
        self.model.setRowCount(0)
        for p in procs:
            mem = "n/a" if p.used_bytes is None else format_bytes(p.used_bytes)
            cells = [
                (str(p.gpu_index) + (f" (MIG GI {p.gpu_instance_id})" if p.gpu_instance_id is not None else ""),
                 p.gpu_index),
                (str(p.pid), p.pid),
                (p.user or "?", p.user or ""),
                (p.kind, p.kind),
                (mem, -1 if p.used_bytes is None else p.used_bytes),
                (p.command or ("(access denied)" if p.denied else "n/a"), p.command or ""),
            ]
            row = []
            for text, key in cells:
                it = QStandardItem(text)
                it.setData(key, SORT_ROLE)
                if p.denied:
                    it.setToolTip("the system did not let VRAMScope read this process's details")
                row.append(it)
            self.model.appendRow(row)

    def visible_rows(self) -> list[list[str]]:
        """The rows as the user sees them: filtered and sorted."""
        return [[self.proxy.index(r, c).data() for c in range(len(COLUMNS))] for r in range(self.proxy.rowCount())]
