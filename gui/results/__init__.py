"""The results side of the window: summary and gauge, charts, per-layer table, planner, estimate vs measured."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.results.types import Estimate
from engine.sketch.analytic import AnalyticResult

from ..charts import DonutChart, TimelineChart
from .compare_view import CompareView
from .dim_overlay import DimOverlay
from .layer_table import LayerTable, LayerTableModel
from .plan_view import PlanView
from .summary import FitGauge, SummaryView

__all__ = ["ResultsPanel", "SummaryView", "FitGauge", "LayerTable", "LayerTableModel", "PlanView", "CompareView"]


CURRENT, STALE, EMPTY = "current", "stale", "empty"
_BANNER_STYLE = {
    CURRENT: "",
    STALE: "background: #f6e3b4; color: #4a3800;",
    EMPTY: "background: #e4e6ea; color: #2b2f36;",
}


class ResultsPanel(QWidget):
    """Summary on the left; tabs on the right. `moduleSelected(name)` when a table row is picked."""

    moduleSelected = Signal(str)
    profileRequested = Signal()
    stopRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ResultsPanel")
        self.summary = SummaryView()
        self.summary.setMinimumWidth(240)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)

        self.timeline = TimelineChart()
        self.tabs.addTab(self.timeline, "Timeline")
        self.donut = DonutChart()
        # Which figure the donut splits: the live tensors at the allocated peak, or (GPU targets) nvidia-smi's.
        self.breakdown_view = QComboBox()
        # Short enough to be read whole in the narrowest results dock (a 24-character elision cut them); the
        # tooltip says what each view is.
        self.breakdown_view.addItem("Live tensors at the peak", "peak")
        self.breakdown_view.addItem("On the GPU (nvidia-smi)", "smi")
        self.breakdown_view.setToolTip("Live tensors: the allocated peak (max_memory_allocated). On the GPU: what "
                                       "nvidia-smi shows at the live peak, adding the caching allocator's "
                                       "reserve beyond the tensors, the library workspaces and the CUDA context")
        self.breakdown_view.currentIndexChanged.connect(self._show_breakdown)
        self.breakdown_view.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(4, 4, 4, 0)
        lay.addWidget(self.breakdown_view, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.donut, 1)
        self.tabs.addTab(page, "Breakdown")
        self.layers = LayerTable()
        self.tabs.addTab(self.layers, "Layers")
        self.plan = PlanView()
        self.tabs.addTab(self.plan, "Plan")
        self.compare = CompareView()
        self.tabs.addTab(self.compare, "Measured")
        self.tabs_veil = DimOverlay(self.tabs)

        split = QSplitter(Qt.Orientation.Horizontal)
        # In a scroll area the summary keeps the height its rows need (an error line, a wrapped GPU line) instead
        # of being squeezed until its rows overlap when the dock is short.
        self.summary_scroll = QScrollArea()
        self.summary_scroll.setWidget(self.summary)
        self.summary_scroll.setWidgetResizable(True)
        self.summary_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.summary_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.summary_scroll.setMinimumWidth(260)
        split.addWidget(self.summary_scroll)
        split.addWidget(self.tabs)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([300, 700])
        split.setChildrenCollapsible(False)
        self.splitter = split
        # What the figures below are: the current model's (no banner), an older version's while the new answer is
        # on its way or while the model does not build (dimmed, amber), or nothing yet (grey).
        self.banner = QLabel()
        self.banner.setObjectName("FreshnessBanner")
        self.banner.setWordWrap(True)
        self.banner.setContentsMargins(8, 3, 8, 3)
        # As tall as its lines, never more: the layout gave a one-line banner the dock's spare height (254 px in a
        # tall dock), and the figures under it jumped by that much at every edit.
        self.banner.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.banner.hide()
        self.freshness = CURRENT
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.banner)
        lay.addWidget(split, 1)

        self.layers.moduleSelected.connect(self.moduleSelected)
        self.compare.profileRequested.connect(self.profileRequested)
        self.compare.stopRequested.connect(self.stopRequested)
        self.estimate: Estimate | None = None

    # ---- what the figures are
    def set_current(self) -> None:
        """The figures shown are the current model's."""
        self._set_freshness(CURRENT, "")

    def set_stale(self, note: str) -> None:
        """The figures shown are of an older version of this model (an edit is being estimated, or the edited
        model does not build): dimmed, with `note` saying which. With nothing shown, it stays empty."""
        self._set_freshness(EMPTY if self.freshness == EMPTY else STALE, note)

    def clear(self, note: str) -> None:
        """Nothing of the previous model stays: every view empty, `note` says what comes (or why not)."""
        self.estimate = None
        self.summary.clear()
        self.summary.set_error("")
        self.layers.set_rows([])
        self.compare.set_estimate(None)
        self.timeline.set_estimate(None)
        self.donut.set_breakdown({}, 0)
        self.plan.set_recommendations([])
        self.plan.set_max_batch(None)
        self.plan.set_max_context(None)
        self._set_freshness(EMPTY, note)

    def _set_freshness(self, state: str, note: str) -> None:
        self.freshness = state
        self.banner.setText(note)
        self.banner.setVisible(bool(note))
        self.banner.setStyleSheet(_BANNER_STYLE[state])
        self.summary.set_dimmed(state == STALE)
        self.tabs_veil.set_dimmed(state == STALE)

    def set_estimate(self, est: Estimate, *, target_bytes: int | None = None) -> None:
        self.estimate = est
        self.summary.set_estimate(est, target_bytes=target_bytes)
        self.layers.set_rows(est.per_module)
        self.compare.set_estimate(est)
        self.timeline.set_estimate(est)
        has_gpu = bool(est.gpu is not None and est.gpu.breakdown_at_live_peak)
        self.breakdown_view.setEnabled(has_gpu)
        if not has_gpu:
            self.breakdown_view.setCurrentIndex(0)  # shows it (the signal fires only on a change)
        self._show_breakdown()

    def _show_breakdown(self, *_args: object) -> None:
        est = self.estimate
        if est is None:
            return
        if self.breakdown_view.currentData() == "smi" and est.gpu is not None and est.gpu.breakdown_at_live_peak:
            split = dict(est.gpu.breakdown_at_live_peak)  # at the live peak: adds up to the reserve then + context
            self.donut.set_breakdown(split, sum(split.values()), "in nvidia-smi at the live peak",
                                     peft=est.config.peft is not None)
        else:
            self.donut.set_breakdown(est.breakdown_at_peak, est.peak_bytes, peft=est.config.peft is not None)

    def set_analytic(self, res: AnalyticResult, *, target_bytes: int | None = None) -> None:
        """Analytic figures go to the summary and the donut; the timeline and the table wait for the traced
        estimate."""
        self.summary.set_analytic(res, target_bytes=target_bytes)
        if res.peak_bytes:
            self.donut.set_breakdown(dict(res.breakdown_at_peak), res.peak_bytes)

    def set_measured(self, est: Estimate | None, against: Estimate | None = None) -> None:
        """`against`: the estimate for the device the run was on, when it is not the target's (then the timeline,
        which draws the target's estimate, shows no overlay)."""
        self.compare.set_measured(est, against)
        self.timeline.set_measured(est if against is None else None)

    def set_busy(self, busy: bool, message: str = "") -> None:
        self.summary.set_busy(busy, message)

    def set_error(self, message: str) -> None:
        self.summary.set_error(message)
