"""The builder canvas: a QGraphicsScene mirroring the sketch (node cards and connection curves) and the view
that edits it — drops from the palette, wiring ports, moving, rubber-band selection, zoom and pan, delete,
copy/paste/duplicate and auto-layout. Every edit goes to the document as an undoable command.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

from PySide6.QtCore import QMimeData, QPointF, QRect, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QContextMenuEvent,
    QDragEnterEvent,
    QDragLeaveEvent,
    QDragMoveEvent,
    QDropEvent,
    QKeyEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPainterPath,
    QPalette,
    QPen,
    QWheelEvent,
)
from PySide6.QtWidgets import QApplication, QGraphicsItem, QGraphicsPathItem, QGraphicsView, QLabel, QWidget

from engine.sketch.catalogue import CATALOGUE
from engine.sketch.document import ShapeResult, Sketch
from render.colors import is_dark_palette

from . import commands as C
from .commands import EdgeKey
from .document import SketchDocument
from .edge_item import EdgeItem, Run
from .layout import NODE_W, layered_layout
from .node_item import PORT_R, NodeItem, NodeResult, PortItem, WireScene

LAYER_MIME = "application/x-vramscope-layer"
NODES_MIME = "application/x-vramscope-nodes"
DEFAULT_NODE_H = 24.0 + 3 * 17.0 + 8.0
APPEND_GAP = 40.0
PASTE_STEP = 36.0
_drag_ids = itertools.count(1)
Shapes = dict[str, ShapeResult]  # the engine's infer_shapes: node id → its output shape (or why not)
NodeResults = dict[str, NodeResult]  # node id → the engine's figures for its card
RouteSig = tuple[tuple[tuple[str, float, float, float], ...], tuple[EdgeKey, ...]]


class _Wire(TypedDict, total=False):
    """A connection being dragged: from an output ("out": src), to an input ("in": dst), or an existing one
    picked up by its end ("detach": src and its key)."""

    mode: str
    src: str
    dst: str
    key: EdgeKey


def layer_mime(type_name: str) -> QMimeData:
    """The drag payload the palette sends (and tests can build)."""
    md = QMimeData()
    md.setData(LAYER_MIME, type_name.encode("utf-8"))
    md.setText(type_name)
    return md


def mime_layer_type(md: QMimeData) -> str | None:
    if md is None or not md.hasFormat(LAYER_MIME):
        return None
    name = bytes(md.data(LAYER_MIME).data()).decode("utf-8", "replace").strip()
    return name if name in CATALOGUE else None


class BuilderScene(WireScene):
    """Items for each node and edge of the sketch, kept in step by `sync`."""

    def __init__(self, canvas: BuilderCanvas):
        super().__init__(canvas)
        self.canvas = canvas
        self.nodes: dict[str, NodeItem] = {}
        self.edges: dict[EdgeKey, EdgeItem] = {}
        self.read_only = False
        self._wire: _Wire | None = None
        self._runs: dict[EdgeKey, Run] = {}  # vertical detour of each routed connection
        self._route_sig: RouteSig | None = None
        self._wire_item: QGraphicsPathItem | None = None
        self._syncing = False

    # ---- mirror the sketch ---------------------------------------------------------------------------
    def sync(self, sketch: Sketch, shapes: Shapes | None, results: NodeResults | None, stale: bool) -> None:
        self._syncing = True
        try:
            nodes = C.sketch_nodes(sketch)
            for nid in [n for n in self.nodes if n not in nodes]:
                self.removeItem(self.nodes.pop(nid))
            for nid, node in nodes.items():
                item = self.nodes.get(nid)
                if item is None or item.type_name != node.type:
                    if item is not None:
                        self.removeItem(item)
                    item = NodeItem(nid, node.type, CATALOGUE.get(node.type), self.node_geometry_changed)
                    self.addItem(item)
                    self.nodes[nid] = item
                item.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIsMovable, not self.read_only)
                if item.pos() != QPointF(node.x, node.y):
                    item.setPos(node.x, node.y)
                sr = (shapes or {}).get(nid)
                item.set_data(node.fields,
                              shape=sr.shape if sr is not None else None,
                              params=sr.params if sr is not None else None,
                              error=sr.error if sr is not None else None)
                res = (results or {}).get(nid)
                if res is not None and not stale:
                    item.set_result(res)
                else:
                    item.set_memory(res.get("memory") if res else None, stale=res is not None)
            keys = {C.edge_key(e) for e in C.sketch_edges(sketch)}
            for k in [k for k in self.edges if k not in keys]:
                self.removeItem(self.edges.pop(k))
            for k in keys:
                if k not in self.edges:
                    e = EdgeItem(k)
                    self.addItem(e)
                    self.edges[k] = e
                self.edges[k].setVisible(True)
            # Curves depend only on where the cards are, how tall, and which connections exist.
            sig = (tuple((n, it.pos().x(), it.pos().y(), it.height()) for n, it in self.nodes.items()),
                   tuple(sorted(self.edges, key=str)))
            if sig != self._route_sig:
                self.reroute()
                self._route_sig = sig
        finally:
            self._syncing = False

    def reroute(self, only: set[str] | None = None) -> None:
        """Recompute connection curves (all, or those touching `only`). Shorter spans go first so nested
        skip connections take lanes from the inside out."""
        rects = {nid: it.sceneBoundingRect().adjusted(3, 3, -3, -3) for nid, it in self.nodes.items()}
        incoming: dict[str, list[EdgeKey]] = {}
        for k in self.edges:
            incoming.setdefault(k[1], []).append(k)
        jobs = []
        for _dst, ks in incoming.items():
            ks.sort(key=lambda k: (k[2] if len(k) > 2 and k[2] is not None else 0))
            for i, k in enumerate(ks):
                src_item, dst_item = self.nodes.get(k[0]), self.nodes.get(k[1])
                if src_item is None or dst_item is None:
                    continue
                p0 = src_item.out_point() + QPointF(0, PORT_R)
                p1 = dst_item.in_point(i, len(ks)) - QPointF(0, PORT_R)
                jobs.append((abs(p1.y() - p0.y()), k, p0, p1))
        if only is None:
            self._runs = {}
        todo = [j for j in jobs if only is None or j[1][0] in only or j[1][1] in only]
        for k in [j[1] for j in todo]:
            self._runs.pop(k, None)
        for _, k, p0, p1 in sorted(todo, key=lambda j: j[0]):
            obstacles = [r for nid, r in rects.items() if nid not in (k[0], k[1])]
            run = self.edges[k].set_ends(p0, p1, obstacles, list(self._runs.values()))
            if run is not None:
                self._runs[k] = run

    def node_geometry_changed(self, item: NodeItem) -> None:
        if not self._syncing and item.node_id in self.nodes:
            self._route_sig = None
            self.reroute({item.node_id})

    # ---- hit tests -----------------------------------------------------------------------------------
    def node_at(self, pos: QPointF) -> NodeItem | None:
        for it in self.items(pos):
            while it is not None and not isinstance(it, NodeItem):
                it = it.parentItem()
            if isinstance(it, NodeItem):
                return it
        return None

    def edge_at(self, pos: QPointF, tolerance: float = 6.0) -> EdgeItem | None:
        area = QRectF(pos.x() - tolerance, pos.y() - tolerance, 2 * tolerance, 2 * tolerance)
        for it in self.items(area, Qt.ItemSelectionMode.IntersectsItemShape):
            if isinstance(it, EdgeItem) and it.isVisible():
                return it
        return None

    def port_at(self, pos: QPointF) -> PortItem | None:
        for it in self.items(QRectF(pos.x() - 4, pos.y() - 4, 8, 8)):
            if isinstance(it, PortItem):
                return it
        return None

    # ---- wiring by dragging ports --------------------------------------------------------------------
    def begin_wire(self, port: PortItem, pos: QPointF) -> bool:
        if self.read_only:
            return False
        nid = port.node.node_id
        if not port.is_input:
            self._wire = {"mode": "out", "src": nid}
        else:
            ks = [k for k in self.edges if k[1] == nid]
            if ks:
                # Pick up the connection whose end is nearest the press and carry it.
                def dist(k: EdgeKey) -> float:
                    p = self.edges[k].path().pointAtPercent(1.0)
                    return (p - pos).manhattanLength()

                k = min(ks, key=dist)
                self.edges[k].setVisible(False)
                self._wire = {"mode": "detach", "src": k[0], "key": k}
            else:
                self._wire = {"mode": "in", "dst": nid}
        self._wire_item = QGraphicsPathItem()
        pen = QPen(self.palette().color(QPalette.ColorRole.Highlight), 2.0, Qt.PenStyle.DashLine)
        self._wire_item.setPen(pen)
        self._wire_item.setZValue(5)
        self.addItem(self._wire_item)
        self.move_wire(pos)
        return True

    def move_wire(self, pos: QPointF) -> None:
        if self._wire is None or self._wire_item is None:
            return
        if self._wire["mode"] == "in":
            p0, p1 = pos, self.nodes[self._wire["dst"]].in_point()
        else:
            p0, p1 = self.nodes[self._wire["src"]].out_point(), pos
        path = QPainterPath(p0)
        k = max(abs(p1.y() - p0.y()) * 0.45, 30.0)
        path.cubicTo(p0 + QPointF(0, k), p1 - QPointF(0, k), p1)
        self._wire_item.setPath(path)

    def end_wire(self, pos: QPointF) -> None:
        wire, self._wire = self._wire, None
        if self._wire_item is not None:
            self.removeItem(self._wire_item)
            self._wire_item = None
        if wire is None:
            return
        port = self.port_at(pos)
        target = port.node if port is not None else self.node_at(pos)
        doc = self.canvas.document()
        if wire["mode"] == "out":
            if target is not None and target.node_id != wire["src"]:
                doc.push(C.ConnectCommand(doc, wire["src"], target.node_id))
        elif wire["mode"] == "in":
            if target is not None and target.node_id != wire["dst"]:
                doc.push(C.ConnectCommand(doc, target.node_id, wire["dst"]))
        else:
            key = wire["key"]
            if target is None:
                doc.push(C.DisconnectCommand(doc, key))
            elif target.node_id != key[1]:
                doc.push(C.ReconnectCommand(doc, key, target.node_id))
        # Whatever happened (refused, no-op), show the sketch as it is.
        for e in self.edges.values():
            e.setVisible(True)

    def wiring(self) -> bool:
        return self._wire is not None


class BuilderCanvas(QGraphicsView):
    """The view of the sketch. Signals: nodeSelected(str) — the one selected node's id or "";
    message(str) — a refusal or hint to show the user (also shown briefly on the canvas)."""

    nodeSelected = Signal(str)
    message = Signal(str)

    def __init__(self, document: SketchDocument, parent: QWidget | None = None):
        super().__init__(parent)
        self._doc = document
        self._scene = BuilderScene(self)
        self.setScene(self._scene)
        self._shapes: Shapes = {}
        self._results: NodeResults = {}
        self._results_stale = False
        self._paste_count = 0
        self._last_payload: str | None = None
        self._pan_from: QPointF | None = None
        self._space = False
        self._press_positions: dict[str, QPointF] = {}
        self.setAcceptDrops(True)
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.RubberBandDrag)
        self.setRubberBandSelectionMode(Qt.ItemSelectionMode.IntersectsItemShape)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self._scene.selectionChanged.connect(self._on_selection)
        self._toast = QLabel(self)
        self._toast.setWordWrap(True)
        self._toast.setStyleSheet("QLabel { background: rgba(40,40,40,220); color: white; padding: 6px 10px;"
                                  " border-radius: 6px; }")
        self._toast.hide()
        self._toast_timer = QTimer(self)
        self._toast_timer.setSingleShot(True)
        self._toast_timer.timeout.connect(self._toast.hide)
        document.refused.connect(self.show_message)

    # ---- wiring to the document ----------------------------------------------------------------------
    def document(self) -> SketchDocument:
        return self._doc

    def scene_(self) -> BuilderScene:
        return self._scene

    def set_read_only(self, ro: bool) -> None:
        self._scene.read_only = ro
        self.setAcceptDrops(not ro)

    def refresh(self, shapes: Shapes | None, stale_results: bool = True) -> None:
        """Mirror the document's sketch; `shapes` from the engine's infer_shapes."""
        self._shapes = shapes or {}
        if stale_results:
            self._results_stale = True
        self._scene.sync(self._doc.sketch, self._shapes, self._results, self._results_stale)
        self._grow_scene_rect()

    def set_node_results(self, results: NodeResults) -> None:
        self._results = dict(results or {})
        self._results_stale = False
        # A full pass: the cards go back to the sketch's own shapes first, then take the new figures.
        self._scene.sync(self._doc.sketch, self._shapes, self._results, False)

    def show_message(self, text: str) -> None:
        self.message.emit(text)
        self._toast.setText(text)
        room = max(200, self.viewport().width() - 40)
        self._toast.setFixedWidth(min(room, self._toast.fontMetrics().horizontalAdvance(text) + 28))
        self._toast.adjustSize()
        self._toast.move(16, self.viewport().height() - self._toast.height() - 16)
        self._toast.show()
        self._toast.raise_()
        self._toast_timer.start(4500)

    def _grow_scene_rect(self) -> None:
        r = self._scene.itemsBoundingRect()
        if r.isNull():
            r = QRectF(-400, -300, 800, 600)
        # Room around the sketch so it can be panned and dropped beside.
        self.setSceneRect(r.adjusted(-1500, -1000, 1500, 1000))

    # ---- selection -----------------------------------------------------------------------------------
    def selected_node_ids(self) -> list[str]:
        return [it.node_id for it in self._scene.selectedItems() if isinstance(it, NodeItem)]

    def selected_edge_keys(self) -> list[EdgeKey]:
        return [it.key for it in self._scene.selectedItems() if isinstance(it, EdgeItem)]

    def select_node(self, node_id: str) -> None:
        """Select one node (or none for "") and bring it into view; one selection signal, none if unchanged."""
        item = self._scene.nodes.get(node_id)
        if self.selected_node_ids() != ([node_id] if item is not None else []) or self.selected_edge_keys():
            self.select_nodes([node_id] if item is not None else [])
        if item is not None:
            self.ensureVisible(item, 60, 60)

    def select_nodes(self, ids: Iterable[str]) -> None:
        self._scene.blockSignals(True)
        self._scene.clearSelection()
        for nid in ids:
            if nid in self._scene.nodes:
                self._scene.nodes[nid].setSelected(True)
        self._scene.blockSignals(False)
        self._on_selection()

    def _on_selection(self) -> None:
        ids = self.selected_node_ids()
        self.nodeSelected.emit(ids[0] if len(ids) == 1 else "")

    # ---- edits ---------------------------------------------------------------------------------------
    def _node_height(self, nid: str) -> float:
        it = self._scene.nodes.get(nid)
        return it.height() if it is not None else DEFAULT_NODE_H

    def last_node_id(self) -> str | None:
        """The lowest card on the canvas (what "drop below the last layer" appends to)."""
        nodes = C.sketch_nodes(self._doc.sketch)
        if not nodes:
            return None
        return max(nodes, key=lambda n: (nodes[n].y + self._node_height(n), nodes[n].x))

    def handle_drop(self, type_name: str, scene_pos: QPointF) -> str | None:
        """A layer dropped at `scene_pos`: on a connection → inserted there; below the last layer → appended
        and connected; elsewhere → added alone. Returns the new node's id, or None when refused."""
        doc = self._doc
        if doc.read_only:
            self.show_message("This model is read-only; open a template or a sketch to edit it.")
            return None
        lt = CATALOGUE.get(type_name)
        if lt is None:
            self.show_message(f"Unknown layer type '{type_name}'.")
            return None
        x, y = scene_pos.x() - NODE_W / 2, scene_pos.y() - DEFAULT_NODE_H / 2
        edge = self._scene.edge_at(scene_pos) if self._scene.node_at(scene_pos) is None else None
        # Only a layer with an input and an output can sit on a connection (not Input, not Output).
        insertable = lt.min_inputs > 0 and lt.max_inputs != 0 and type_name != "Output"
        if edge is not None and insertable:
            return self._insert_on(edge.key, type_name, x)
        last = self.last_node_id()
        if last is not None:
            nodes = C.sketch_nodes(doc.sketch)
            ln = nodes[last]
            bottom = ln.y + self._node_height(last)
            centre_x = ln.x + NODE_W / 2
            if scene_pos.y() > bottom and abs(scene_pos.x() - centre_x) <= NODE_W and lt.min_inputs > 0:
                if ln.type == "Output":
                    ins = [e for e in C.sketch_edges(doc.sketch) if e.dst == last]
                    if ins and insertable:
                        return self._insert_on(C.edge_key(ins[0]), type_name, ln.x)
                else:
                    append = C.AddAndConnectCommand(doc, type_name, ln.x, max(y, bottom + APPEND_GAP), last)
                    return append.node_id if doc.push(append) else None
        add = C.AddNodeCommand(doc, type_name, x, y)
        return add.node_id if doc.push(add) else None

    def _insert_on(self, key: EdgeKey, type_name: str, x: float) -> str | None:
        doc = self._doc
        cmd = _InsertAndMakeRoom(doc, key, type_name, x, self._node_height)
        if doc.push(cmd):
            return cmd.node_id
        return None

    def delete_selected(self) -> bool:
        ids, keys = self.selected_node_ids(), self.selected_edge_keys()
        if not ids and not keys:
            return False
        return self._doc.push(C.RemoveCommand(self._doc, ids, keys))

    def copy_payload(self, ids: list[str] | None = None) -> dict[str, Any] | None:
        ids = self.selected_node_ids() if ids is None else ids
        if not ids:
            return None
        payload = C.sketch_payload(self._doc.sketch, ids)
        return payload

    def copy(self) -> bool:
        payload = self.copy_payload()
        if payload is None:
            return False
        text = json.dumps(payload)
        md = QMimeData()
        md.setData(NODES_MIME, text.encode("utf-8"))
        md.setText(text)
        QApplication.clipboard().setMimeData(md)
        self._paste_count = 0
        self._last_payload = text
        return True

    def paste(self) -> list[str]:
        md = QApplication.clipboard().mimeData()
        text = None
        if md is not None and md.hasFormat(NODES_MIME):
            text = bytes(md.data(NODES_MIME).data()).decode("utf-8", "replace")
        elif self._last_payload is not None:
            text = self._last_payload  # some platforms drop custom formats; ours is still in hand
        if not text:
            return []
        try:
            payload = json.loads(text, parse_constant=lambda name: None)
        except (ValueError, RecursionError):  # not JSON, a number of thousands of digits, nesting too deep
            self._doc.refused.emit("the clipboard holds no VRAMScope layers")
            return []
        if text != self._last_payload:
            self._last_payload, self._paste_count = text, 0
        self._paste_count += 1
        return self._paste(payload, self._paste_count * PASTE_STEP, "Paste")

    def duplicate(self) -> list[str]:
        payload = self.copy_payload()
        if payload is None:
            return []
        return self._paste(payload, PASTE_STEP, "Duplicate")

    def _paste(self, payload: dict[str, Any], offset: float, text: str) -> list[str]:
        cmd = C.PasteCommand(self._doc, payload, offset, offset, text)
        if not self._doc.push(cmd):
            return []
        self.select_nodes(cmd.new_ids)
        return cmd.new_ids

    def auto_layout(self) -> bool:
        sk = self._doc.sketch
        nodes = C.sketch_nodes(sk)
        if not nodes:
            return False
        try:
            order = sk.topo_order()
        except Exception:
            order = list(nodes)
        heights = {n: self._node_height(n) for n in nodes}
        pos = layered_layout(order, [(e.src, e.dst) for e in C.sketch_edges(sk)], heights=heights)
        moves = {n: ((nodes[n].x, nodes[n].y), p) for n, p in pos.items() if (nodes[n].x, nodes[n].y) != p}
        if not moves:
            return False
        ok = self._doc.push(C.AutoLayoutCommand(self._doc, moves))
        if ok:
            self.zoom_to_fit()
        return ok

    def nudge(self, dx: float, dy: float) -> None:
        ids = self.selected_node_ids()
        if not ids or self._doc.read_only:
            return
        nodes = C.sketch_nodes(self._doc.sketch)
        moves = {n: ((nodes[n].x, nodes[n].y), (nodes[n].x + dx, nodes[n].y + dy)) for n in ids}
        self._doc.push(C.MoveNodesCommand(self._doc, moves, drag_id=("nudge", tuple(sorted(ids)))))

    def _commit_moves(self) -> None:
        """After a mouse drag: one undoable move for every card that changed place."""
        nodes = C.sketch_nodes(self._doc.sketch)
        moves = {}
        for nid, item in self._scene.nodes.items():
            n = nodes.get(nid)
            if n is None:
                continue
            p = (round(item.pos().x(), 1), round(item.pos().y(), 1))
            # A click is not a move: only a real change of place counts.
            if abs(n.x - p[0]) > 0.5 or abs(n.y - p[1]) > 0.5:
                moves[nid] = ((n.x, n.y), p)
        if moves:
            self._doc.push(C.MoveNodesCommand(self._doc, moves, drag_id=next(_drag_ids)))

    # ---- zoom ----------------------------------------------------------------------------------------
    def zoom(self) -> float:
        return self.transform().m11()

    def zoom_by(self, factor: float) -> None:
        z = self.zoom()
        factor = max(0.1 / z, min(3.0 / z, factor))
        self.scale(factor, factor)

    def zoom_to_fit(self) -> None:
        r = self._scene.itemsBoundingRect()
        if r.isNull():
            return
        self.fitInView(r.adjusted(-40, -40, 40, 40), Qt.AspectRatioMode.KeepAspectRatio)
        # A tiny sketch should not be blown up past natural size.
        if self.zoom() > 1.0:
            self.zoom_by(1.0 / self.zoom())
            self.centerOn(r.center())

    def fit_readable(self, min_zoom: float = 0.75) -> None:
        """Fit the sketch, but never below `min_zoom`: a long model then opens at its top, still legible."""
        r = self._scene.itemsBoundingRect()
        if r.isNull():
            return
        self.zoom_to_fit()
        if self.zoom() < min_zoom:
            self.zoom_by(min_zoom / self.zoom())
            vp = self.viewport().rect()
            h = vp.height() / self.zoom()
            self.centerOn(QPointF(r.center().x(), r.top() - 30 + h / 2))

    # ---- events --------------------------------------------------------------------------------------
    def drawBackground(self, painter: QPainter, rect: QRectF | QRect) -> None:  # noqa: N802
        pal = self.palette()
        dark = is_dark_palette(pal)
        painter.fillRect(rect, QColor("#1e2126") if dark else QColor("#f4f5f7"))
        if self.zoom() < 0.35:
            return
        step = 24
        dot = QColor("#343941") if dark else QColor("#d5d9df")
        painter.setPen(QPen(dot, 1.6))
        left = int(rect.left()) - int(rect.left()) % step
        top = int(rect.top()) - int(rect.top()) % step
        pts = [QPointF(x, y) for x in range(left, int(rect.right()) + 1, step)
               for y in range(top, int(rect.bottom()) + 1, step)]
        if len(pts) < 40000:
            painter.drawPoints(pts)

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802
        dy = event.angleDelta().y()
        if dy == 0:
            return super().wheelEvent(event)
        self.zoom_by(1.0015 ** dy)
        event.accept()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if mime_layer_type(event.mimeData()) and not self._doc.read_only:
            # Always a copy: a "move" would make the palette remove its item after the drop.
            event.setDropAction(Qt.DropAction.CopyAction)
            event.accept()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:  # noqa: N802
        if not mime_layer_type(event.mimeData()) or self._doc.read_only:
            event.ignore()
            return
        pos = self.mapToScene(event.position().toPoint())
        hit = self._scene.edge_at(pos) if self._scene.node_at(pos) is None else None
        for e in self._scene.edges.values():
            e.set_drop_target(e is hit)
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()

    def dragLeaveEvent(self, event: QDragLeaveEvent) -> None:  # noqa: N802
        for e in self._scene.edges.values():
            e.set_drop_target(False)

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        type_name = mime_layer_type(event.mimeData())
        for e in self._scene.edges.values():
            e.set_drop_target(False)
        if type_name is None:
            event.ignore()
            return
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()
        new_id = self.handle_drop(type_name, self.mapToScene(event.position().toPoint()))
        if new_id:
            self.select_node(new_id)
            self.setFocus()

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.MiddleButton or (
                self._space and event.button() == Qt.MouseButton.LeftButton):
            self._pan_from = event.position()
            self.viewport().setCursor(Qt.CursorShape.ClosedHandCursor)
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if self._pan_from is not None:
            d = event.position() - self._pan_from
            self._pan_from = event.position()
            self.horizontalScrollBar().setValue(self.horizontalScrollBar().value() - int(d.x()))
            self.verticalScrollBar().setValue(self.verticalScrollBar().value() - int(d.y()))
            event.accept()
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if self._pan_from is not None:
            self._pan_from = None
            self.viewport().setCursor(Qt.CursorShape.OpenHandCursor if self._space else Qt.CursorShape.ArrowCursor)
            event.accept()
            return
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and not self._doc.read_only:
            self._commit_moves()

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:  # noqa: N802
        from PySide6.QtWidgets import QMenu

        pos = self.mapToScene(event.pos())
        hit = self._scene.node_at(pos) or self._scene.edge_at(pos)
        if hit is not None and not hit.isSelected():
            self._scene.clearSelection()
            hit.setSelected(True)
        ro = self._doc.read_only
        has_sel = bool(self.selected_node_ids() or self.selected_edge_keys())
        menu = QMenu(self)
        for text, fn, enabled in (("Delete", self.delete_selected, has_sel and not ro),
                                  ("Copy", self.copy, bool(self.selected_node_ids())),
                                  ("Paste", self.paste, not ro),
                                  ("Duplicate", self.duplicate, bool(self.selected_node_ids()) and not ro),
                                  (None, None, False),
                                  ("Auto layout", self.auto_layout, not ro),
                                  ("Zoom to fit", self.zoom_to_fit, True)):
            if text is None:
                menu.addSeparator()
                continue
            act = menu.addAction(text)
            act.setEnabled(enabled)
            act.triggered.connect(lambda _c=False, f=fn: f())
        menu.exec(event.globalPos())

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_Space and not event.isAutoRepeat():
            self._space = True
            self.viewport().setCursor(Qt.CursorShape.OpenHandCursor)
            event.accept()
            return
        if event.key() in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace):
            self.delete_selected()
            event.accept()
            return
        if event.matches(QKeySequence.StandardKey.Copy):
            self.copy()
            return
        if event.matches(QKeySequence.StandardKey.Paste):
            self.paste()
            return
        step = 24 if event.modifiers() & Qt.KeyboardModifier.ShiftModifier else 4
        arrows: dict[int, tuple[int, int]] = {Qt.Key.Key_Left: (-step, 0), Qt.Key.Key_Right: (step, 0),
                                              Qt.Key.Key_Up: (0, -step), Qt.Key.Key_Down: (0, step)}
        if event.key() in arrows and self.selected_node_ids():
            self.nudge(*arrows[event.key()])
            event.accept()
            return
        super().keyPressEvent(event)

    def keyReleaseEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_Space and not event.isAutoRepeat():
            self._space = False
            self.viewport().setCursor(Qt.CursorShape.ArrowCursor)
            event.accept()
            return
        super().keyReleaseEvent(event)


class _InsertAndMakeRoom(C.InsertOnEdgeCommand):
    """Insert on a connection, then push the downstream cards down when there is no room for the new one."""

    def __init__(self, doc: SketchDocument, key: EdgeKey, type_name: str, x: float,
                 height_of: Callable[[str], float]):
        nodes = C.sketch_nodes(doc.sketch)
        src, dst = nodes[key[0]], nodes[key[1]]
        # In a straight column the new card joins the column; otherwise it lands where it was dropped.
        if abs(src.x - dst.x) < 1:
            x = src.x
        super().__init__(doc, key, type_name, x, src.y + height_of(key[0]) + APPEND_GAP)
        self._height_of = height_of

    def edit(self, sketch: Sketch) -> None:
        super().edit(sketch)
        nodes = C.sketch_nodes(sketch)
        dst = nodes[self.key[1]]
        need = self.y + DEFAULT_NODE_H + APPEND_GAP - dst.y
        if need <= 0:
            return
        # Everything from the destination's row down moves by the same amount, keeping its shape.
        for n, node in list(nodes.items()):
            if n != self.node_id and node.y >= dst.y - 1:
                sketch.move_node(n, node.x, node.y + need)


def _append_point(canvas: BuilderCanvas) -> QPointF:
    """Where a double-clicked palette layer lands: under the last card (so it is appended and connected)."""
    last = canvas.last_node_id()
    if last is None:
        return QPointF(NODE_W / 2, DEFAULT_NODE_H / 2)
    n = C.sketch_nodes(canvas.document().sketch)[last]
    return QPointF(n.x + NODE_W / 2, n.y + canvas._node_height(last) + APPEND_GAP + DEFAULT_NODE_H / 2)


def append_layer(canvas: BuilderCanvas, type_name: str) -> str | None:
    new_id = canvas.handle_drop(type_name, _append_point(canvas))
    if new_id:
        canvas.select_node(new_id)
    return new_id
