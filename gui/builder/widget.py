"""BuilderWidget: the palette, the canvas and the inspector around one SketchDocument — the piece of the main
window where the user draws a model. Shapes come from the engine's infer_shapes; memory from the shell.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent, QShowEvent, QUndoStack
from PySide6.QtWidgets import QHBoxLayout, QSplitter, QWidget

from engine.core.errors import UserError
from engine.sketch.document import Sketch

from . import commands as C
from .canvas import BuilderCanvas, NodeResults, Shapes, append_layer
from .document import AUTOSAVE_DELAY_S, SketchDocument
from .inspector import Inspector
from .layout import NODE_W, layered_layout
from .node_item import NodeResult
from .palette import LayerPalette


class BuilderWidget(QWidget):
    """Signals: sketchChanged(sketch) after every edit, undo, redo and set_sketch; selectionChanged(node id
    or ""); message(str) when an edit is refused (the reason) — for a status bar.

    With `side_panels=True` (default) the palette is on the left and the inspector on the right inside this
    widget; with False they are left out so the shell can put `palette()` and `inspector()` in docks.
    """

    sketchChanged = Signal(object)
    selectionChanged = Signal(str)
    message = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, document: SketchDocument | None = None,
                 side_panels: bool = True, autosave_dir: str | Path | None = None,
                 autosave_interval_s: float = AUTOSAVE_DELAY_S):
        super().__init__(parent)
        self._doc = document or SketchDocument(self, autosave_dir=autosave_dir,
                                               autosave_interval_s=autosave_interval_s)
        self._shapes: Shapes = {}
        self._results: NodeResults = {}
        self._selected = ""
        self._fit_pending = True
        self._palette = LayerPalette()
        self._canvas = BuilderCanvas(self._doc)
        self._inspector = Inspector(self._doc)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        if side_panels:
            split = QSplitter(Qt.Orientation.Horizontal, self)
            split.addWidget(self._palette)
            split.addWidget(self._canvas)
            split.addWidget(self._inspector)
            split.setStretchFactor(0, 0)
            split.setStretchFactor(1, 1)
            split.setStretchFactor(2, 0)
            split.setSizes([self._palette.full_width(), 800, 260])
            split.setChildrenCollapsible(False)
            lay.addWidget(split)
        else:
            lay.addWidget(self._canvas)
        self._doc.prepare = tidy_positions
        tidy_positions(self._doc.sketch)  # a document handed over may already hold a template
        self._doc.replaced.connect(self._on_replaced)
        self._doc.changed.connect(self._on_changed)
        self._canvas.nodeSelected.connect(self._on_selected)
        self._canvas.message.connect(self.message)
        self._palette.layerActivated.connect(lambda name: append_layer(self._canvas, name))
        self._on_changed(self._doc.sketch)

    # ---- parts ---------------------------------------------------------------------------------------
    def document(self) -> SketchDocument:
        return self._doc

    def palette(self) -> LayerPalette:  # type: ignore[override]
        """The layer palette widget (this shadows QWidget.palette() on purpose: the agreed API; for the
        colours use QWidget.palette(builder) or `layer_palette()` for this)."""
        return self._palette

    def layer_palette(self) -> LayerPalette:
        return self._palette

    def canvas(self) -> BuilderCanvas:
        return self._canvas

    def inspector(self) -> Inspector:
        return self._inspector

    def undo_stack(self) -> QUndoStack:
        return self._doc.undo_stack()

    # ---- the sketch ----------------------------------------------------------------------------------
    def sketch(self) -> Sketch:
        return self._doc.sketch

    def set_sketch(self, sketch: Sketch, read_only: bool = False) -> None:
        """Show `sketch` (untitled; undo history restarts). Cards that would overlap are laid out first.

        Passing the document's own sketch (after `document().open(path)` or `.new(template)`) keeps its file,
        history and dirty state and only applies `read_only`."""
        if sketch is self._doc.sketch:
            self._doc.set_read_only(read_only)
            self._on_replaced(sketch)
            return
        self._doc.set_sketch(sketch, read_only=read_only)

    def _on_replaced(self, _sketch: Sketch) -> None:
        self._results = {}
        self._canvas.set_node_results({})
        self._fit_pending = True
        QTimer.singleShot(0, self._fit_if_pending)

    def shapes(self) -> Shapes:
        """The engine's ShapeResult for every node, as last inferred."""
        return dict(self._shapes)

    def _on_changed(self, sketch: Sketch) -> None:
        try:
            self._shapes = sketch.infer_shapes()
        except UserError:
            self._shapes = {}
        self._canvas.set_read_only(self._doc.read_only)
        self._palette.setEnabled(not self._doc.read_only)
        self._canvas.refresh(self._shapes)
        if self._selected and self._selected not in C.sketch_nodes(sketch):
            self._selected = ""
            self.selectionChanged.emit("")
        self._inspector.show_node(self._selected)
        self._update_inspector_info()
        self.sketchChanged.emit(sketch)

    def set_node_results(self, results: NodeResults) -> None:
        """Per node {"memory": int, "shape": tuple|None, "error": str|None, "params": int}; shown on the cards."""
        self._results = dict(results or {})
        self._canvas.set_node_results(self._results)
        self._update_inspector_info()

    def _update_inspector_info(self) -> None:
        nid = self._selected
        if not nid:
            self._inspector.set_shape_result(None)
            return
        sr = self._shapes.get(nid)
        info: NodeResult = {"shape": sr.shape if sr else None, "params": sr.params if sr else None,
                            "error": sr.error if sr else None, "memory": None}
        res = self._results.get(nid)
        if res is not None:
            info["memory"] = res.get("memory")
            if res.get("error"):
                info["error"] = res.get("error")
        self._inspector.set_shape_result(info)

    # ---- selection -----------------------------------------------------------------------------------
    def select_node(self, node_id: str) -> None:
        self._canvas.select_node(node_id)

    def selected_node(self) -> str:
        return self._selected

    def _on_selected(self, node_id: str) -> None:
        if node_id == self._selected:
            return
        self._selected = node_id
        self._inspector.show_node(node_id)
        self._update_inspector_info()
        self.selectionChanged.emit(node_id)

    # ---- actions -------------------------------------------------------------------------------------
    def undo(self) -> None:
        self._doc.undo_stack().undo()

    def redo(self) -> None:
        self._doc.undo_stack().redo()

    def zoom_to_fit(self) -> None:
        self._canvas.zoom_to_fit()

    def zoom_to_readable(self, min_zoom: float = 0.75) -> None:
        """Fit the sketch, but not below `min_zoom`: a long model shows its top, legibly (what opening does)."""
        self._canvas.fit_readable(min_zoom)

    def delete_selected(self) -> bool:
        return self._canvas.delete_selected()

    def copy(self) -> bool:
        return self._canvas.copy()

    def paste(self) -> list[str]:
        return self._canvas.paste()

    def duplicate(self) -> list[str]:
        return self._canvas.duplicate()

    def auto_layout(self) -> bool:
        return self._canvas.auto_layout()

    def add_layer(self, type_name: str) -> str | None:
        """Append a layer under the last one (what a palette double-click does)."""
        return append_layer(self._canvas, type_name)

    def _fit_if_pending(self) -> None:
        if self._fit_pending and self._canvas.viewport().width() > 50:
            self._fit_pending = False
            self._canvas.fit_readable()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802
        super().showEvent(event)
        QTimer.singleShot(0, self._fit_if_pending)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self._fit_pending:
            QTimer.singleShot(0, self._fit_if_pending)


def tidy_positions(sketch: Sketch) -> bool:
    """Lay the sketch out when its cards would overlap at their drawn size (templates are spaced for smaller
    cards). Positions are cosmetic, so this is not an undoable edit. True when it moved anything."""
    nodes = C.sketch_nodes(sketch)
    if len(nodes) < 2:
        return False
    from .canvas import DEFAULT_NODE_H

    h = DEFAULT_NODE_H + 16
    boxes = sorted((n.y, n.x) for n in nodes.values())
    overlap = False
    for i, (y, x) in enumerate(boxes):
        for y2, x2 in boxes[i + 1:]:
            if y2 - y >= h:
                break
            if abs(x2 - x) < NODE_W + 16:
                overlap = True
                break
        if overlap:
            break
    if not overlap:
        return False
    try:
        order = sketch.topo_order()
    except UserError:
        order = list(nodes)
    pos = layered_layout(order, [(e.src, e.dst) for e in C.sketch_edges(sketch)])
    for nid, (x, y) in pos.items():
        sketch.move_node(nid, x, y)
    return True
