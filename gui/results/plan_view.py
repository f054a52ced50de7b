"""The planner's answers: the largest batch that fits the target, and ranked recommendations with savings."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.planning.planner import MaxBatchResult, MaxContextResult, Recommendation

from ..config_panel import in_panel_terms
from .formatting import format_bytes

MISFIT = QColor("#B3261E")  # a change that still does not fit the target


def new_peak_text(r: Recommendation) -> str:
    """The peak after the change, marked when the target GPU is named and the change still does not fit it."""
    return format_bytes(r.new_peak_bytes) + ("\ndoes not fit" if r.fits is False else "")


class PlanView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.max_batch = QLabel("Largest batch that fits: —")
        self.max_batch.setObjectName("MaxBatch")
        self.max_batch.setWordWrap(True)
        # Generation: the longest prompt that fits with the configured new tokens (hidden in the other modes)
        self.max_context = QLabel("")
        self.max_context.setObjectName("MaxContext")
        self.max_context.setWordWrap(True)
        self.max_context.setVisible(False)
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
        # After an out-of-memory snapshot: what would have fit in the memory that run had (hidden otherwise)
        self.real_run = QLabel("")
        self.real_run.setObjectName("RealRunFit")
        self.real_run.setWordWrap(True)
        self.real_run.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.real_run.setVisible(False)
        # Where the answers will appear, how far the planner is (its re-traces take minutes on a large model).
        self.progress = QProgressBar()
        self.progress.setObjectName("PlanProgress")
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(True)
        self.progress.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.real_run)
        lay.addWidget(self.max_batch)
        lay.addWidget(self.max_context)
        lay.addWidget(self.progress)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.note)

    def set_max_batch(self, result: MaxBatchResult | None, budget_bytes: int | None = None) -> None:
        """The planner's largest batch that fits; None → unknown."""
        if result is None:
            self.max_batch.setText("Largest batch that fits: —")
            return
        n, peak, figure = result.batch_size, result.peak_bytes, result.figure
        capped = result.peak_next is None  # the search stopped at its largest batch, not at a misfit
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

    def set_max_context(self, result: MaxContextResult | None, text: str = "") -> None:
        """The longest prompt that fits (max-context's answer), or `text` (searching, or why none fits); neither:
        hidden."""
        if result is not None:
            what = {"nvidia_smi": "nvidia-smi", "reserved": "reserved"}.get(result.figure, "peak")
            more = "" if result.peak_next is not None else " (the model's positions stop there)"
            text = (f"Longest prompt that fits in {format_bytes(result.budget_bytes)}: <b>{result.length:,}</b> "
                    f"tokens + {result.new_tokens:,} new ({what} {format_bytes(result.peak_bytes)}){more}")
        self.max_context.setText(text)
        self.max_context.setVisible(bool(text))

    def set_max_batch_text(self, text: str) -> None:
        self.max_batch.setText(text)

    def set_max_batch_progress(self, fraction: float, message: str) -> None:
        """The largest-batch search's progress, on its own line: the progress bar is the recommendations' (shown
        until they come), and the search may end before or after them (on thread lanes it runs beside them)."""
        done = f", {round(100 * fraction)} %" if fraction >= 0 else ""
        self.max_batch.setText(f"Largest batch that fits: searching… ({message}{done})")

    def set_max_batch_error(self, message: str) -> None:
        """The search's own answer when it has no batch to give ('even batch size 1 does not fit: …')."""
        self.max_batch.setText(f"Largest batch that fits: <b>none</b> — {message}")

    def set_recommendations(self, recs: list[Recommendation] | None) -> None:
        self.table.setRowCount(0)
        for r in recs or ():
            items = self._add_row([r.title, format_bytes(r.saves_bytes), new_peak_text(r), r.cost])
            if r.fits is False:
                items[2].setForeground(QBrush(MISFIT))
                if r.new_nvidia_smi_bytes is not None:
                    items[2].setToolTip(f"nvidia-smi would show {format_bytes(r.new_nvidia_smi_bytes)}: more than "
                                        "the target GPU lets a process use")
            if r.detail and r.detail != r.title:
                items[0].setToolTip(in_panel_terms(r.detail))  # the panel's field names, not the CLI's options
            if r.cost:
                items[3].setToolTip(in_panel_terms(r.cost))
        self.note.setText("" if recs else "No recommendations: the planner had nothing to offer for this setup.")

    def set_partial_recommendations(self, recs: list[Recommendation]) -> None:
        """The quick answers, shown while the traced ones are worked out."""
        self.set_recommendations(recs)
        self.note.setText("More answers are on their way: the planner re-traces the step with each change "
                          "(mixed precision, checkpointing, accumulation, …).")

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
        return [tuple(self._cell(r, c) for c in range(4)) for r in range(self.table.rowCount())]

    def _cell(self, row: int, column: int) -> str:
        item = self.table.item(row, column)
        return item.text() if item is not None else ""

    def set_note(self, text: str) -> None:
        self.note.setText(text)

    def set_real_run(self, text: str) -> None:
        """What would have fit in the failed run's memory (engine.planning.snapshot_fit.render_fit); '' hides it."""
        self.real_run.setText(text)
        self.real_run.setVisible(bool(text))

    def set_progress(self, fraction: float | None, text: str = "") -> None:
        """The planner's progress (None: not running). Negative: waiting for its turn (an indeterminate bar)."""
        if fraction is None:
            self.progress.hide()
            return
        self.progress.show()
        if fraction < 0:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 100)
            self.progress.setValue(int(round(100 * fraction)))
        self.progress.setFormat(text or "%p %")
