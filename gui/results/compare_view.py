"""Estimate against measurement: the profile run's controls and each figure's error beside the estimate."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.planning.snapshot_fit import Comparison
from engine.results.types import ALL_CATEGORIES, Estimate

from .formatting import category_label, format_bytes


def relative_error(estimated: int | None, measured: int | None) -> float | None:
    """(estimate − measured) / measured, None when either is missing or measured is 0."""
    if estimated is None or not measured:
        return None
    return (estimated - measured) / measured


Row = tuple[str, int | None, int | None, float | None]  # figure, estimated, measured, relative error
_FIGURES = {"max_memory_allocated": "Peak allocated (max_memory_allocated)", "max_memory_reserved": "Peak reserved",
            "peak": "Peak of live tensors"}


def comparison_rows(comparison: Comparison, peft: bool, failed: bool) -> list[Row]:
    """The engine's snapshot comparison (engine.planning.snapshot_fit.compare) in the panel's terms; `failed`: the run
    ran out of memory, so its categories are those live when it failed."""
    at = " when it failed" if failed else " at peak"
    return [(_FIGURES.get(key) or f"  {category_label(key, peft)}{at}", e, m, None if err is None else err / 100)
            for key, (_name, e, m, err) in zip(comparison.keys, comparison.rows, strict=True)]


class CompareView(QWidget):
    """Profile / Stop buttons with progress, and a table: figure, estimated, measured, error."""

    profileRequested = Signal()
    stopRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.estimate: Estimate | None = None
        self.measured: Estimate | None = None
        self.against: Estimate | None = None
        self.comparison: list[Row] | None = None  # a snapshot's rows, from the engine (else computed below)
        self.profile_button = QPushButton("Profile on this machine")
        self.profile_button.setToolTip("Run the configured step for real here (GPU if present, else CPU)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        self.progress.setMaximumHeight(14)
        self.profile_button.clicked.connect(self.profileRequested)
        self.stop_button.clicked.connect(self.stopRequested)
        self.message = QLabel("No measurement yet. A profile run takes real memory on this machine.")
        self.message.setWordWrap(True)
        self.message.setObjectName("Dim")

        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Figure", "Estimated", "Measured", "Error"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2, 3):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)

        top = QHBoxLayout()
        top.addWidget(self.profile_button)
        top.addWidget(self.stop_button)
        top.addWidget(self.progress, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addLayout(top)
        lay.addWidget(self.message)
        lay.addWidget(self.table, 1)

    def set_running(self, running: bool, fraction: float = -1.0, message: str = "") -> None:
        self.profile_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.progress.setVisible(running)
        if running:
            if fraction < 0:
                self.progress.setRange(0, 0)
            else:
                self.progress.setRange(0, 100)
                self.progress.setValue(int(round(100 * fraction)))
        if message:
            self.message.setText(message)

    def set_message(self, text: str) -> None:
        self.message.setText(text)

    def set_estimate(self, est: Estimate | None) -> None:
        self.estimate = est
        self._fill()

    def set_measured(self, est: Estimate | None, against: Estimate | None = None) -> None:
        """`against`: the estimate to compare with when the run was not on the target device (else the target's)."""
        self.measured, self.against, self.comparison = est, against, None
        if est is not None:
            oom = est.oom.message if est.oom is not None else None
            where = f"{est.peak_phase}/{est.peak_module}" if est.peak_module else est.peak_phase
            if est.source == "snapshot":
                name = Path((est.snapshot.path if est.snapshot is not None else None) or est.model_name).name
                text = f"Real run ({name}): " + (f"out of memory: {oom}." if oom else f"peak at {where}.")
                if self.estimate is None:
                    text += " Open the model that ran to see its estimate beside it."
            else:
                run = est.source.replace("profiler-", "")
                text = f"Out of memory: {oom}" if oom else f"Measured on {run}: peak at {where}."
            if against is not None and not oom:
                device = against.config.device.upper()
                text += (f" No GPU here, so it is compared with the estimate for the {device} (the same step with "
                         f"the {device}'s kernels), not the target's.")
            self.message.setText(text)
        self._fill()

    def set_comparison(self, rows: list[Row] | None) -> None:
        """A snapshot's figures beside the estimate of its step (comparison_rows), until set_measured."""
        self.comparison = rows
        self._fill()

    def rows(self) -> list[Row]:
        e, m = self.against or self.estimate, self.measured
        if m is None:
            return []
        if self.comparison is not None:
            return self.comparison
        out: list[tuple[str, int | None, int | None]] = [("Peak allocated", e.peak_bytes if e else None, m.peak_bytes)]
        eg, mg = (e.gpu if e else None), m.gpu
        if mg is not None:
            out.append(("Peak reserved", eg.reserved_bytes if eg else None, mg.reserved_bytes))
            if mg.nvidia_smi_bytes:
                out.append(("nvidia-smi used", eg.nvidia_smi_bytes if eg else None, mg.nvidia_smi_bytes))
        peft = m.config.peft is not None  # LoRA/QLoRA: base weights, the adapters' gradients and state
        for cat in ALL_CATEGORIES:
            ev = (e.breakdown_at_peak.get(cat) if e else None)
            mv = m.breakdown_at_peak.get(cat)
            if ev or mv:
                out.append((f"  {category_label(cat, peft)} at peak", ev, mv))
        return [(name, ev, mv, relative_error(ev, mv)) for name, ev, mv in out]

    def _fill(self) -> None:
        rows = self.rows()
        self.table.setRowCount(len(rows))
        for r, (name, ev, mv, err) in enumerate(rows):
            cells = [name, format_bytes(ev) if ev is not None else "—", format_bytes(mv) if mv is not None else "—",
                     f"{round(100 * err, 1) + 0.0:+.1f} %" if err is not None else "—"]  # + 0.0: no "-0.0 %"
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
