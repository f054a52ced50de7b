"""The planner's answers: the largest batch that fits the target, and ranked recommendations with savings."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from .formatting import format_bytes


def _get(obj, *names, default=None):
    """First present field among `names`, for dataclasses and dicts alike."""
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if v is not None:
            return v
    return default


class PlanView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.max_batch = QLabel("Largest batch that fits: —")
        self.max_batch.setObjectName("MaxBatch")
        self.max_batch.setWordWrap(True)
        # A table whose rows grow to fit wrapped text: the costs are sentences and must be read whole.
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Recommendation", "Saves", "New peak", "Cost"])
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(True)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.note = QLabel("")
        self.note.setObjectName("Dim")
        self.note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.max_batch)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.note)

    def set_max_batch(self, result, budget_bytes: int | None = None) -> None:
        """`result`: engine.planner.MaxBatchResult (or an int, or a dict with batch_size); None → unknown."""
        if result is None:
            self.max_batch.setText("Largest batch that fits: —")
            return
        n = result if isinstance(result, int) else _get(result, "batch_size", "max_batch")
        peak = None if isinstance(result, int) else _get(result, "peak_bytes")
        figure = "peak" if isinstance(result, int) else _get(result, "figure", default="peak")
        capped = not isinstance(result, int) and _get(result, "peak_next") is None and \
            _get(result, "tried") is not None
        budget = f" in {format_bytes(budget_bytes)}" if budget_bytes else ""
        if not n:
            self.max_batch.setText(f"Not even a batch of 1 fits{budget}.")
            return
        what = {"nvidia_smi": "nvidia-smi", "reserved": "reserved"}.get(figure, "peak")
        extra = f" ({what} {format_bytes(peak)})" if peak else ""
        count = f"at least {n:,}" if capped else f"{n:,}"
        self.max_batch.setText(f"Largest batch that fits{budget}: <b>{count}</b>{extra}")
        self.max_batch.setToolTip("The search stops at this batch size; larger ones may fit too." if capped else
                                  "Its estimate fits; the estimate at one more does not.")

    def set_max_batch_text(self, text: str) -> None:
        self.max_batch.setText(text)

    def set_recommendations(self, recs) -> None:
        self.table.setRowCount(0)
        for r in recs or ():
            if isinstance(r, str):
                self._add_row([r, "", "", ""])
                continue
            title = _get(r, "title", "action", "name", "description", default=str(r))
            saves = _get(r, "saves_bytes", "saved_bytes", "bytes_saved", "saving_bytes")
            new_peak = _get(r, "new_peak_bytes", "peak_bytes")
            cost = _get(r, "cost", "tradeoff", default="")
            items = self._add_row([
                str(title),
                format_bytes(saves) if isinstance(saves, (int, float)) else "",
                format_bytes(new_peak) if isinstance(new_peak, (int, float)) else "",
                str(cost),
            ])
            detail = _get(r, "detail", "description", "explanation")
            if detail and detail != title:
                items[0].setToolTip(str(detail))
            if cost:
                items[3].setToolTip(str(cost))
        self.note.setText("" if recs else "No recommendations: the planner had nothing to offer for this setup.")

    def _add_row(self, texts: list[str]) -> list[QTableWidgetItem]:
        row = self.table.rowCount()
        self.table.insertRow(row)
        items = []
        for c, text in enumerate(texts):
            it = QTableWidgetItem(text)
            align = Qt.AlignmentFlag.AlignRight if c in (1, 2) else Qt.AlignmentFlag.AlignLeft
            it.setTextAlignment(align | Qt.AlignmentFlag.AlignTop)
            self.table.setItem(row, c, it)
            items.append(it)
        return items

    def rows(self) -> list[tuple[str, ...]]:
        """The table as shown, one tuple of cell texts per recommendation."""
        return [tuple(self.table.item(r, c).text() for c in range(4)) for r in range(self.table.rowCount())]

    def set_note(self, text: str) -> None:
        self.note.setText(text)
