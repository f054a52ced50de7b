"""One layer on the canvas: its type, key fields, output shape, parameters and memory, its ports, and the
red error state with the reason when its shapes do not fit. Draws what it is told; computes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (
    QApplication,
    QGraphicsItem,
    QGraphicsObject,
    QGraphicsScene,
    QGraphicsSceneHoverEvent,
    QGraphicsSceneMouseEvent,
    QStyle,
    QStyleOptionGraphicsItem,
    QWidget,
)

from engine.core.units import format_bytes, format_count
from engine.sketch.layer_types import Fields, LayerType, Shape
from render.colors import is_dark_palette

from .layout import NODE_W

HEADER_H = 26.0
LINE_H = 19.0
PAD = 8.0
PORT_R = 6.0
MAX_ERROR_LINES = 4

GROUP_COLOURS = {
    "Input/Output": "#5f7a8a",
    "Linear": "#3a78b8",
    "Convolution": "#2f8a5a",
    "Normalization": "#8663b8",
    "Activation": "#c67f24",
    "Pooling": "#21918c",
    "Shape": "#6f7b84",
    "Recurrent": "#ae5a3c",
    "Attention": "#b83c76",
    "Merge": "#4f5fb3",
}
ERROR_RED = QColor("#d32f2f")


class NodeResult(TypedDict, total=False):
    """The engine's figures for one node, as its card shows them (every key optional)."""

    memory: int | None
    shape: Shape | None
    error: str | None
    params: int | None


class WireScene(QGraphicsScene):
    """The scene a port drags connections in: a port hands it the press, the moves and the release."""

    def begin_wire(self, port: PortItem, pos: QPointF) -> bool:
        raise NotImplementedError

    def move_wire(self, pos: QPointF) -> None:
        raise NotImplementedError

    def end_wire(self, pos: QPointF) -> None:
        raise NotImplementedError

# Short names so the key fields fit on one line; others show under their own name.
_SHORT = {
    "out_features": "out", "in_features": "in", "out_channels": "out", "in_channels": "in",
    "kernel_size": "k", "stride": "s", "padding": "p", "dilation": "d", "output_padding": "op",
    "num_heads": "heads", "nhead": "heads", "dim_feedforward": "ff", "hidden_size": "hidden",
    "num_layers": "layers", "embedding_dim": "dim", "num_embeddings": "vocab", "output_size": "size",
    "num_groups": "groups", "num_features": "C", "normalized_shape": "n", "negative_slope": "slope",
    "embed_dim": "dim", "d_model": "d", "start_dim": "from", "end_dim": "to",
}
# Fields worth a place on the node only when they differ from their default.
_QUIET = {"dilation", "groups", "output_padding", "eps", "momentum", "bias", "affine", "elementwise_affine",
          "end_dim", "start_dim", "approximate", "dropout", "norm_first", "activation", "padding", "stride"}


def secondary_text(text: QColor) -> QColor:
    """The colour of a node's second-rank lines (fields, parameters): the text colour, a little lighter, yet
    dark enough to read at the canvas's usual zoom (it was a faint grey)."""
    muted = QColor(text)
    muted.setAlpha(215)
    return muted


def format_shape(shape: Sequence[int] | None) -> str:
    """A per-sample shape (the engine's convention) shown with its batch dimension: (B, 64, 56, 56)."""
    if shape is None:
        return "—"
    return "(" + ", ".join(["B"] + [str(int(d)) for d in shape]) + ")"


_SIZES = {"shape", "kernel_size", "stride", "padding", "dilation", "output_padding", "output_size"}


def _fmt_value(v: object, name: str = "") -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (tuple, list)):
        vals = [str(x) for x in v]
        if name not in _SIZES:
            return ",".join(vals)  # an index list (e.g. Permute's dims), not a size
        return vals[0] if len(set(vals)) == 1 else "×".join(vals)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def key_fields_text(layer_type: LayerType | None, fields: Mapping[str, Any]) -> str:
    """'out 128' or 'out 64 · k3 · s2' — what distinguishes this layer from another of its type."""
    if layer_type is None:
        return ""
    parts = []
    for spec in layer_type.fields:
        v = fields.get(spec.name, spec.default)
        # Auto fields (0 = from the input) say nothing until the user sets them.
        if spec.kind == "int" and v == 0 and spec.min == 0 and "input" in (spec.help or ""):
            continue
        if spec.name in _QUIET and _same(v, spec.default):
            continue
        if spec.kind == "bool":
            if not _same(v, spec.default):
                parts.append(("" if v else "no ") + spec.name.replace("_", " "))
            continue
        short = _SHORT.get(spec.name, spec.name)
        sep = "" if len(short) <= 2 and spec.kind == "ints" else " "
        parts.append(f"{short}{sep}{_fmt_value(v, spec.name)}")
    return " · ".join(parts)


def _same(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    return a == b


class PortItem(QGraphicsItem):
    """An input (top) or output (bottom) connection point. Dragging from it is handled by the scene."""

    def __init__(self, node: NodeItem, is_input: bool):
        super().__init__(node)
        self.node = node
        self.is_input = is_input
        self._hover = False
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.CursorShape.CrossCursor)
        self.setZValue(2)
        self.setToolTip("Drag to an input port to connect" if not is_input else
                        "Drop a connection here; drag a connection's end away to disconnect it")

    def multi(self) -> bool:
        lt = self.node.layer_type
        return self.is_input and lt is not None and (lt.max_inputs is None or lt.max_inputs > 1)

    def half_width(self) -> float:
        return 26.0 if self.multi() else PORT_R

    def boundingRect(self) -> QRectF:  # noqa: N802 - Qt override
        hw = self.half_width() + 4
        return QRectF(-hw, -PORT_R - 4, 2 * hw, 2 * PORT_R + 8)

    def shape(self) -> QPainterPath:
        p = QPainterPath()
        p.addRect(self.boundingRect())
        return p

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.node.palette()
        fill = pal.color(QPalette.ColorRole.Highlight) if self._hover else pal.color(QPalette.ColorRole.Base)
        painter.setBrush(fill)
        painter.setPen(QPen(self.node.accent(), 1.8))
        hw = self.half_width()
        painter.drawRoundedRect(QRectF(-hw, -PORT_R, 2 * hw, 2 * PORT_R), PORT_R, PORT_R)

    def hoverEnterEvent(self, event: QGraphicsSceneHoverEvent) -> None:  # noqa: N802
        self._hover = True
        self.update()

    def hoverLeaveEvent(self, event: QGraphicsSceneHoverEvent) -> None:  # noqa: N802
        self._hover = False
        self.update()

    def mousePressEvent(self, event: QGraphicsSceneMouseEvent) -> None:  # noqa: N802
        scene = self.scene()
        if (event.button() == Qt.MouseButton.LeftButton and isinstance(scene, WireScene)
                and scene.begin_wire(self, event.scenePos())):
            event.accept()
            return
        event.ignore()

    def mouseMoveEvent(self, event: QGraphicsSceneMouseEvent) -> None:  # noqa: N802
        # Only a press the wire scene took brings moves and the release here (else the press was ignored).
        scene = self.scene()
        assert isinstance(scene, WireScene), "a port gets mouse moves only after its scene began a wire"
        scene.move_wire(event.scenePos())

    def mouseReleaseEvent(self, event: QGraphicsSceneMouseEvent) -> None:  # noqa: N802
        scene = self.scene()
        assert isinstance(scene, WireScene), "a port gets the release only after its scene began a wire"
        scene.end_wire(event.scenePos())


class NodeItem(QGraphicsObject):
    """The card drawn for one sketch node."""

    def __init__(self, node_id: str, type_name: str, layer_type: LayerType | None,
                 on_geometry_changed: Callable[[NodeItem], None] | None = None):
        """`on_geometry_changed(item)`: told when the card, while in a scene, moves or changes size (the canvas
        reroutes its connections)."""
        super().__init__()
        self._on_geometry_changed = on_geometry_changed
        self.node_id = node_id
        self.type_name = type_name
        self.layer_type = layer_type
        self.fields: Fields = {}
        self.shape_: Shape | None = None
        self.params: int | None = None
        self.memory: int | None = None
        self.memory_stale = False
        self.error: str | None = None
        self._height = HEADER_H + 3 * LINE_H + PAD
        self._error_lines: list[str] = []
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable
                      | QGraphicsItem.GraphicsItemFlag.ItemIsMovable
                      | QGraphicsItem.GraphicsItemFlag.ItemSendsGeometryChanges)
        self.setAcceptHoverEvents(True)
        self.setZValue(1)
        self.in_port = PortItem(self, True) if (layer_type is None or layer_type.max_inputs != 0) else None
        # Output is the model's end: nothing may follow it.
        self.out_port = PortItem(self, False) if type_name != "Output" else None
        self._layout_ports()

    # ---- data ----------------------------------------------------------------------------------------
    def set_data(self, fields: Fields, shape: Sequence[int] | None = None, params: int | None = None,
                 error: str | None = None) -> None:
        shape_ = tuple(shape) if shape is not None else None
        error = error or None
        if (self.fields, self.shape_, self.params, self.error) == (fields, shape_, params, error) and \
                self.toolTip():
            return  # nothing new: no relayout (a sync touches every card)
        self.fields = dict(fields)
        self.shape_ = shape_
        self.params = params
        self.error = error
        self._relayout()

    def set_memory(self, memory: int | None, stale: bool = False) -> None:
        if memory != self.memory or stale != self.memory_stale:
            self.memory = memory
            self.memory_stale = stale
            self.setToolTip(self._tooltip())
            self.update()

    def set_result(self, result: NodeResult) -> None:
        """Apply one engine result: its memory; its error when it has one (an engine failure the shapes did not
        show); shape and params only where the card has none — the sketch's own shape inference, run after
        every edit, is never overruled by a result computed for an older version."""
        shape, params, error = result.get("shape"), result.get("params"), result.get("error")
        if shape is not None and self.shape_ is None and not self.error:
            self.shape_ = tuple(shape)
        if params is not None and self.params is None:
            self.params = int(params)
        if error:
            self.error = str(error)
        self.memory = result.get("memory", self.memory)
        self.memory_stale = False
        self._relayout()

    # ---- geometry ------------------------------------------------------------------------------------
    def height(self) -> float:
        return self._height

    def _fonts(self) -> tuple[QFont, QFont, QFont]:
        base = QApplication.font() if QApplication.instance() else QFont()
        title = QFont(base)
        title.setBold(True)
        # Readable at the canvas's usual zoom: 10 pt at least for the figures, a point more for the type.
        title.setPointSizeF(max(base.pointSizeF(), 10.0) + 1.0)
        body = QFont(base)
        body.setPointSizeF(max(base.pointSizeF(), 10.0))
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.TypeWriter)
        mono.setPointSizeF(body.pointSizeF())
        return title, body, mono

    def _relayout(self) -> None:
        self.prepareGeometryChange()
        if self.error:
            _, body, _ = self._fonts()
            self._error_lines = _wrap(self.error, QFontMetricsF(body), NODE_W - 2 * PAD, MAX_ERROR_LINES)
            self._height = HEADER_H + (2 + len(self._error_lines)) * LINE_H + PAD
        else:
            self._error_lines = []
            self._height = HEADER_H + 3 * LINE_H + PAD
        self._layout_ports()
        self.setToolTip(self._tooltip())
        self.update()
        self._geometry_changed()

    def _geometry_changed(self) -> None:
        if self._on_geometry_changed is not None and self.scene() is not None:
            self._on_geometry_changed(self)

    def _layout_ports(self) -> None:
        if self.in_port is not None:
            self.in_port.setPos(NODE_W / 2, 0)
        if self.out_port is not None:
            self.out_port.setPos(NODE_W / 2, self._height)

    def boundingRect(self) -> QRectF:  # noqa: N802
        return QRectF(-3, -3, NODE_W + 6, self._height + 6)

    def shape(self) -> QPainterPath:
        p = QPainterPath()
        p.addRoundedRect(QRectF(0, 0, NODE_W, self._height), 7, 7)
        return p

    def center(self) -> QPointF:
        return self.pos() + QPointF(NODE_W / 2, self._height / 2)

    def in_point(self, index: int = 0, count: int = 1) -> QPointF:
        """Where the `index`-th of `count` incoming connections lands on the input port."""
        dx = 0.0
        if count > 1 and self.in_port is not None:
            span = self.in_port.half_width() * 2 - 8
            dx = -span / 2 + span * index / (count - 1)
        return self.pos() + QPointF(NODE_W / 2 + dx, 0)

    def out_point(self) -> QPointF:
        return self.pos() + QPointF(NODE_W / 2, self._height)

    # ---- look ----------------------------------------------------------------------------------------
    def palette(self) -> QPalette:
        scene = self.scene()
        if scene is not None:
            return scene.palette()
        return QApplication.palette()

    def blocked(self) -> bool:
        """Downstream of a node whose shapes do not fit: not wrong itself, just waiting (grey, not red)."""
        return self.error is not None and self.error.startswith("depends on ")

    def failed(self) -> bool:
        return bool(self.error) and not self.blocked()

    def accent(self) -> QColor:
        if self.failed():
            return ERROR_RED
        if self.blocked():
            return QColor("#9aa0a6")
        group = self.layer_type.group if self.layer_type is not None else ""
        return QColor(GROUP_COLOURS.get(group, "#6f7b84"))

    def _tooltip(self) -> str:
        lines = [f"<b>{self.type_name}</b> &nbsp;<i>{self.node_id}</i>"]
        if self.layer_type is not None and self.layer_type.description:
            lines.append(self.layer_type.description)
        if self.error:
            lines.append(f"<span style='color:#d32f2f'>{_html(self.error)}</span>")
        else:
            lines.append(f"Output {format_shape(self.shape_)} · {format_count(self.params)} parameters")
        if self.memory is not None:
            lines.append(f"Memory {format_bytes(self.memory)} (the engine's figure for this layer)")
        return "<br>".join(lines)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        pal = self.palette()
        dark = is_dark_palette(pal)
        title_f, body_f, mono_f = self._fonts()
        rect = QRectF(0, 0, NODE_W, self._height)
        accent = self.accent()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)

        # Card with a soft shadow.
        shadow = QColor(0, 0, 0, 70 if dark else 35)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(shadow)
        painter.drawRoundedRect(rect.translated(0, 2), 7, 7)
        if self.failed():
            body_bg = QColor("#3d2224") if dark else QColor("#fdecec")
        else:
            body_bg = QColor("#2b2f36") if dark else QColor("#ffffff")
        painter.setBrush(body_bg)
        border = pal.color(QPalette.ColorRole.Highlight) if selected else (accent if self.failed() else
                                                                          QColor("#4a505a" if dark else "#c4c9d0"))
        painter.setPen(QPen(border, 2.6 if selected or self.failed() else 1.0))
        painter.drawRoundedRect(rect, 7, 7)

        # Header band in the group's colour (red when the shapes do not fit).
        top = QPainterPath()
        top.addRoundedRect(QRectF(0, 0, NODE_W, HEADER_H), 7, 7)
        square = QPainterPath()
        square.addRect(QRectF(0, HEADER_H / 2, NODE_W, HEADER_H / 2))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(accent)
        painter.drawPath(top.united(square))
        painter.setPen(QColor("white"))
        painter.setFont(title_f)
        tr = QRectF(PAD, 0, NODE_W - 2 * PAD, HEADER_H)
        if self.failed():
            painter.drawText(tr, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, "⚠")
            tr = tr.adjusted(0, 0, -18, 0)
        tfm = QFontMetricsF(title_f)
        title = tfm.elidedText(self.type_name, Qt.TextElideMode.ElideRight, tr.width())
        painter.drawText(tr, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, title)
        # The node id (what the per-layer table and errors call it), small, where the type leaves room.
        room = tr.width() - tfm.horizontalAdvance(title) - 12
        id_f = QFont(body_f)
        id_f.setPointSizeF(body_f.pointSizeF() - 0.5)
        ifm = QFontMetricsF(id_f)
        if room > 36:
            painter.setFont(id_f)
            painter.setPen(QColor(255, 255, 255, 225))
            painter.drawText(tr, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
                             ifm.elidedText(self.node_id, Qt.TextElideMode.ElideMiddle, room))

        text = pal.color(QPalette.ColorRole.Text)
        muted = secondary_text(text)
        y = HEADER_H + 3
        w = NODE_W - 2 * PAD

        painter.setFont(body_f)
        fm = QFontMetricsF(body_f)
        keys = key_fields_text(self.layer_type, self.fields) or " "
        painter.setPen(muted)
        painter.drawText(QRectF(PAD, y, w, LINE_H), Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(keys, Qt.TextElideMode.ElideRight, w))
        y += LINE_H

        if self.error:
            painter.setPen((QColor("#ff8a80") if dark else ERROR_RED) if self.failed() else muted)
            for line in self._error_lines:
                painter.drawText(QRectF(PAD, y, w, LINE_H), Qt.AlignmentFlag.AlignVCenter, line)
                y += LINE_H
        else:
            painter.setFont(mono_f)
            mfm = QFontMetricsF(mono_f)
            painter.setPen(text)
            shape_txt = "→ " + format_shape(self.shape_)
            painter.drawText(QRectF(PAD, y, w, LINE_H), Qt.AlignmentFlag.AlignVCenter,
                             mfm.elidedText(shape_txt, Qt.TextElideMode.ElideMiddle, w))
            y += LINE_H

        painter.setFont(body_f)
        painter.setPen(muted)
        painter.drawText(QRectF(PAD, y, w, LINE_H), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                         f"{format_count(None if self.error else self.params)} params")
        mem = "—" if self.memory is None else format_bytes(self.memory)
        mem_colour = QColor(text)
        if self.memory_stale:
            mem_colour.setAlpha(110)
        bold = QFont(body_f)
        bold.setBold(not self.memory_stale)
        painter.setFont(bold)
        painter.setPen(mem_colour)
        painter.drawText(QRectF(PAD, y, w, LINE_H), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, mem)

    def itemChange(self, change: QGraphicsItem.GraphicsItemChange, value: object) -> object:  # noqa: N802
        if change == QGraphicsItem.GraphicsItemChange.ItemPositionHasChanged:
            self._geometry_changed()
        return super().itemChange(change, value)


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _wrap(text: str, fm: QFontMetricsF, width: float, max_lines: int) -> list[str]:
    words = text.split()
    lines: list[str] = []
    cur = ""
    for word in words:
        trial = f"{cur} {word}".strip()
        if fm.horizontalAdvance(trial) <= width or not cur:
            cur = trial
        else:
            lines.append(cur)
            cur = word
    if cur:
        lines.append(cur)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = fm.elidedText(lines[-1] + " …", Qt.TextElideMode.ElideRight, width)
    return [fm.elidedText(line, Qt.TextElideMode.ElideRight, width) for line in lines] or [""]
