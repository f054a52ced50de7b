"""The workspace's figures on screen: the results docks (summary, timeline, layers, plan), the canvas's per-node
figures, a read-only model's module tree and block graph, the status bar's peak and an error until it is fixed.
It draws what gui.workspace announces and computes nothing itself; a module clicked in the results selects its
node or tree row, a node clicked selects its row in the layers table."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QHeaderView, QLabel, QStatusBar, QTreeWidget, QTreeWidgetItem, QWidget

from engine.core.units import format_bytes
from engine.planning.planner import MaxBatchResult, Recommendation
from engine.results.module_groups import blocks
from engine.results.types import Estimate
from engine.sketch.analytic import AnalyticResult, NodeFigures

from .block_graph import BlockGraph
from .builder import BuilderWidget
from .builder.canvas import NodeResults
from .config_panel import in_panel_terms
from .results import ResultsPanel
from .results.formatting import format_count
from .snapshot_link import SnapshotLink
from .workspace import TreeRows, Workspace

EMPTY_SKETCH_HINT = ("An empty sketch: drag an Input from the palette on the left onto the canvas, then layers "
                     "(each joins the one above it), then an Output. The figures come as soon as it builds.")


class ModuleTree(QTreeWidget):
    """A read-only model's module tree: name, type, own parameters and parameters below."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setHeaderLabels(["Module", "Type", "Parameters (own)", "Parameters (total)"])
        self.setAlternatingRowColors(True)
        self.setUniformRowHeights(True)
        hh = self.header()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2, 3):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self._items: dict[str, QTreeWidgetItem] = {}

    def set_rows(self, title: str, rows: TreeRows) -> None:
        """rows: (dotted name, type, own parameters, total parameters), parents before children."""
        self.clear()
        self._items = {}
        for name, typ, own, total in rows:
            parent_name = name.rpartition(".")[0] if name else None
            parent = self._items.get(parent_name) if parent_name is not None else None
            label = name.rpartition(".")[2] if name else title
            cells = [label, typ, format_count(own) if own else "", format_count(total)]
            item = QTreeWidgetItem(parent, cells) if parent is not None else QTreeWidgetItem(self, cells)
            item.setData(0, Qt.ItemDataRole.UserRole, name)
            for c in (2, 3):
                item.setTextAlignment(c, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(0, name or title)
            self._items[name] = item
        root = self._items.get("")
        if root is not None:
            root.setExpanded(True)

    def select_module(self, name: str) -> None:
        item = self._items.get(name)
        if item is not None:
            self.setCurrentItem(item)
            self.scrollToItem(item)


class EstimateView(QObject):
    """Draws the workspace's answers. `status_label` holds the peak (a permanent widget of `status_bar`)."""

    def __init__(self, ws: Workspace, results: ResultsPanel, builder: BuilderWidget, module_tree: ModuleTree,
                 block_graph: BlockGraph, snapshots: SnapshotLink, status_bar: QStatusBar, status_label: QLabel,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.ws, self.results, self.builder, self.snapshots = ws, results, builder, snapshots
        self.module_tree, self.block_graph = module_tree, block_graph
        self.status_bar, self.status_label = status_bar, status_label
        self._last_error = ""
        plan = results.plan
        for sig, slot in ((ws.opened, self._opened), (ws.estimating, self._estimating),
                          (ws.analyticReady, self._analytic), (ws.nodeFigures, self._node_figures),
                          (ws.traced, self._traced),
                          (ws.modelFailed, self.show_model_error), (ws.planStarted, self._plan_started),
                          (ws.quickPlan, self._quick_plan), (ws.planReady, self._plan),
                          (ws.planFailed, self._plan_failed), (ws.maxBatchFound, self._max_batch),
                          (ws.maxBatchFailed, plan.set_max_batch_error),
                          (ws.maxBatchProgress, plan.set_max_batch_progress),
                          (ws.maxContextFound, plan.set_max_context),
                          (ws.planProgress, lambda f, m: plan.set_progress(f, f"Re-tracing: {m} (%p %)")),
                          (ws.treeReady, self._tree), (ws.treeFailed, self._tree_failed),
                          (ws.session.busyChanged, self._busy), (results.moduleSelected, self._module_selected),
                          (builder.selectionChanged, self._node_selected)):
            sig.connect(slot)

    # ---- the model and its edits
    def _opened(self) -> None:
        # Nothing of the previous model stays on screen: every view empty until this one's figures come.
        self.results.compare.set_measured(None)
        self.results.clear(f"Estimating {self.ws.display_name()}…")
        self.status_label.setText("")
        self.clear_error_message()

    def _estimating(self, empty: bool) -> None:
        alone = self.snapshots.estimating()  # shown alone, or closed when the model it was beside is gone
        if empty:
            # A new (or emptied) sketch is where a newcomer starts: say what to do, not "does not build" in red.
            self.clear_error_message()
            if not alone:  # a snapshot opened alone stays on screen
                self.results.clear(EMPTY_SKETCH_HINT)
            self.status_label.setText("")
            return
        est = self.ws.estimate
        if est is not None and self.results.freshness != "empty":
            self.results.set_stale("These figures are from before the last edit: estimating the edited model…")
            self.status_label.setText(f"peak {format_bytes(est.peak_bytes)} (previous version)")

    def _busy(self, busy: bool) -> None:
        estimating = self.ws.session.is_busy("estimate")
        self.results.set_busy(estimating, "estimating…" if estimating else "")

    # ---- figures
    def _analytic(self, res: AnalyticResult) -> None:
        """engine.sketch.analytic's AnalyticResult: per-node figures on the canvas, totals in the summary."""
        self.builder.set_node_results(node_figures(res.nodes))
        if res.errors:
            # A sketch that does not fit together has no whole-model figures: say why and keep the last good ones
            # (the traced estimate fails the same way), rather than totals of the part that still connects.
            self.show_model_error(res.error_message)
        else:
            self.results.set_analytic(res, target_bytes=self.ws.target_bytes())

    def _node_figures(self, res: AnalyticResult) -> None:
        """An edit's per-node figures alone (its trace already failed): the canvas, not the summary."""
        self.builder.set_node_results(node_figures(res.nodes))

    def _traced(self, est: Estimate) -> None:
        ws = self.ws
        if ws.model_kind != "sketch" and ws.tree_rows:
            self._show_blocks()
        self.clear_error_message()
        self.results.set_error("")
        self.results.set_estimate(est, target_bytes=ws.target_bytes())
        self.results.set_current()
        if ws.measured is not None:
            self.results.set_measured(ws.measured, against=ws.measured_against)
        self._node_results_from_estimate(est)
        self.status_label.setText(f"peak {format_bytes(est.peak_bytes)}")

    def show_model_error(self, message: str) -> None:
        message = in_panel_terms(message)
        self._last_error = message
        est = self.ws.estimate
        if est is not None:
            # As the banner says, every view shows the last version that built: the summary too, not the edit's
            # analytic figures "refining…" a trace that failed, beside the last good one's timeline.
            self.results.set_estimate(est, target_bytes=self.ws.target_bytes())
            self.results.set_stale("These figures are of the last version that built; the edited model does not "
                                   "(the message below says why).")
            self.status_label.setText(f"peak {format_bytes(est.peak_bytes)} (last version that built)")
        else:
            self.results.clear(f"No figures: {self.ws.display_name()} does not build (the message below says why).")
            self.status_label.setText("")
        self.results.set_error(message)
        self.status_bar.showMessage(message)  # until it is fixed, not for ten seconds

    def clear_error_message(self) -> None:
        """A fixed error leaves the status bar (another message there stays)."""
        if self._last_error and self.status_bar.currentMessage() == self._last_error:
            self.status_bar.clearMessage()
        self._last_error = ""

    # ---- the planner's answers
    def _plan_started(self, budget: int | None, generating: bool) -> None:
        plan = self.results.plan
        plan.set_recommendations([])
        plan.set_note("")
        plan.set_progress(-1, "Looking for savings: the quick answers first…")
        plan.set_max_batch_text(f"Largest batch that fits: {'searching…' if budget else 'choose a target GPU.'}")
        plan.set_max_context(None, "Longest prompt that fits: searching…" if budget and generating else "")

    def _quick_plan(self, value: list[Recommendation], failed: str) -> None:
        self.results.plan.set_partial_recommendations(value)
        if failed:  # the re-traced answers will not come: these are the plan
            self.results.plan.set_note(failed)
        else:
            self.results.plan.set_progress(-1, "Waiting for the re-traced answers…")

    def _plan(self, value: list[Recommendation]) -> None:
        self.results.plan.set_progress(None)  # first: whoever sees the answer sees its wait over
        self.results.plan.set_recommendations(value)

    def _plan_failed(self, message: str) -> None:
        self.results.plan.set_note(message)
        self.results.plan.set_progress(None)

    def _max_batch(self, value: MaxBatchResult) -> None:
        self.results.plan.set_max_batch(value, value.budget_bytes)

    # ---- a read-only model's module tree and blocks
    def _show_blocks(self) -> None:
        """The block graph of a built-in or loaded model, with this estimate's memory when there is one."""
        est = self.ws.estimate
        self.block_graph.set_blocks(blocks(self.ws.tree_rows, est.per_module if est is not None else None))

    def clear_model_views(self) -> None:
        self.module_tree.clear()
        self.block_graph.set_blocks([])

    def _tree(self, rows: TreeRows) -> None:
        self.module_tree.set_rows(self.ws.model_ref, rows)
        self._show_blocks()

    def _tree_failed(self, message: str) -> None:
        self.clear_model_views()
        self.show_model_error(message)

    # ---- canvas links
    def _node_results_from_estimate(self, est: Estimate) -> None:
        """Traced per-module figures onto the canvas nodes (a sketch's modules are named by node id)."""
        sketch = self.ws.current_sketch()
        if self.ws.model_kind != "sketch" or sketch is None:
            return
        ids = set(sketch.nodes)
        memory: dict[str, int] = {}
        params: dict[str, int] = {}
        for row in est.per_module:
            nid = node_for_module(row.name, ids)
            if nid is None:
                continue
            memory[nid] = memory.get(nid, 0) + row.bytes_at_peak
            params[nid] = params.get(nid, 0) + row.parameters
        if memory:
            self.builder.set_node_results({nid: {"memory": memory[nid], "params": params[nid]} for nid in memory})

    def _module_selected(self, name: str) -> None:
        sketch = self.ws.current_sketch()
        if self.ws.model_kind == "sketch" and sketch is not None:
            nid = node_for_module(name, set(sketch.nodes))
            if nid:
                self.builder.select_node(nid)
        else:
            self.module_tree.select_module(name)

    def _node_selected(self, node_id: str) -> None:
        if node_id:
            self.results.layers.select_module(node_id)


def node_for_module(name: str, ids: set[str]) -> str | None:
    """A sketch module path ('layers.conv1', 'conv1.0') → the node id it belongs to, if any."""
    if not name:
        return None
    if name in ids:
        return name
    parts = name.split(".")
    for i in range(len(parts)):
        for j in range(len(parts), i, -1):
            cand = ".".join(parts[i:j])
            if cand in ids:
                return cand
    # nn.ModuleDict keys cannot hold '.', so the engine may have written ids with '_' or '__' instead.
    for p in parts:
        for nid in ids:
            if p == nid.replace(".", "_") or p == nid.replace("-", "_"):
                return nid
    return None


def node_figures(nodes: dict[str, NodeFigures]) -> NodeResults:
    """Analytic per-node figures → the builder's {"memory", "shape", "error", "params"} per node id."""
    return {
        nid: {"memory": fig.total_bytes, "shape": fig.output_shape, "error": fig.error, "params": fig.parameters}
        for nid, fig in nodes.items()
    }
