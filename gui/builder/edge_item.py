"""One connection on the canvas: a curve from an output port to an input port that steps around the cards
in its way, selectable (Delete disconnects it) and highlighted while a layer is dragged over it.
"""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPainterPathStroker, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsPathItem,
    QGraphicsSceneHoverEvent,
    QStyle,
    QStyleOptionGraphicsItem,
    QWidget,
)

from render.colors import is_dark_palette

from .commands import EdgeKey

SIDE_GAP = 26.0
ARROW = 7.0
Run = tuple[float, float, float]  # a detour's vertical run: (x, y0, y1)


def _bezier_points(p0: QPointF, c1: QPointF, c2: QPointF, p1: QPointF, n: int = 20) -> Iterator[QPointF]:
    for i in range(1, n):
        t = i / n
        a = (1 - t) ** 3
        b = 3 * (1 - t) ** 2 * t
        c = 3 * (1 - t) * t * t
        d = t ** 3
        yield QPointF(a * p0.x() + b * c1.x() + c * c2.x() + d * p1.x(),
                      a * p0.y() + b * c1.y() + c * c2.y() + d * p1.y())


LANE_GAP = 14.0


def route(p0: QPointF, p1: QPointF, obstacles: list[QRectF],
          runs: list[Run] | None = None) -> tuple[QPainterPath, Run | None]:
    """A downward curve p0 -> p1; when a card sits in its way, it detours beside the cards instead, in a lane
    clear of the vertical `runs` (x, y0, y1) other detours already use. Returns the path and its own run."""
    path = QPainterPath(p0)
    dy = p1.y() - p0.y()
    if dy < 24:
        # Goes back up (the user moved a card above its source): a loop that stays readable.
        bend = max(60.0, -dy / 2 + 60)
        path.cubicTo(p0 + QPointF(0, bend), p1 - QPointF(0, bend), p1)
        return path, None
    k = max(dy * 0.45, 24.0)
    c1, c2 = p0 + QPointF(0, k), p1 - QPointF(0, k)
    # A Bézier stays inside the box of its control points: only cards meeting that box can be in the way.
    span = QRectF(p0, p1).normalized().adjusted(-2, -2, 2, 2)
    grown = [g for g in (r.adjusted(-8, -4, 8, 4) for r in obstacles) if g.intersects(span)]
    if not any(r.contains(pt) for pt in _bezier_points(p0, c1, c2, p1) for r in grown):
        path.cubicTo(c1, c2, p1)
        return path, None
    lo, hi = p0.y() + 8, p1.y() - 8
    in_band = [g for g in (r.adjusted(-8, -4, 8, 4) for r in obstacles) if g.bottom() > lo and g.top() < hi]
    blockers = [g for g in grown if g.bottom() > lo and g.top() < hi] or grown

    def clear_x(x: float, step_right: bool) -> float:
        # Step out past every card the vertical run at x would cross, in one direction.
        for _ in range(len(in_band) + 1):
            hit = [g for g in in_band if g.left() <= x <= g.right()]
            if not hit:
                return x
            x = (max(g.right() for g in hit) + SIDE_GAP) if step_right else (min(g.left() for g in hit) - SIDE_GAP)
        return x

    right = clear_x(max(g.right() for g in blockers) + SIDE_GAP, True)
    left = clear_x(min(g.left() for g in blockers) - SIDE_GAP, False)
    mid = (p0.x() + p1.x()) / 2
    go_right = abs(right - mid) <= abs(mid - left)
    xs = right if go_right else left
    # Parallel detours (nested skips) take the next lane out instead of drawing over each other.
    for _ in range(len(runs or ()) + 1):
        if not any(abs(x - xs) < LANE_GAP - 1 and y0 < hi and y1 > lo for x, y0, y1 in runs or ()):
            break
        xs += LANE_GAP if go_right else -LANE_GAP
        xs = clear_x(xs, go_right)
    ya = p0.y() + min(40.0, dy / 3)
    yb = p1.y() - min(40.0, dy / 3)
    r_in = 18.0
    path.cubicTo(QPointF(p0.x(), ya), QPointF(xs, p0.y() + r_in), QPointF(xs, ya + r_in))
    path.lineTo(QPointF(xs, yb - r_in))
    path.cubicTo(QPointF(xs, p1.y() - r_in), QPointF(p1.x(), yb), p1)
    return path, (xs, lo, hi)


class EdgeItem(QGraphicsPathItem):
    """A connection src -> dst (input `port`); `key` is what the engine's Edge is found by."""

    def __init__(self, key: EdgeKey):
        super().__init__()
        self.key = key
        self.src, self.dst, self.port = key
        self._hover = False
        self._drop_target = False
        self._end = QPointF()
        self.setFlags(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable)
        self.setAcceptHoverEvents(True)
        self.setZValue(0)

    def set_ends(self, p0: QPointF, p1: QPointF, obstacles: list[QRectF], runs: list[Run] | None = None) -> Run | None:
        """Route the curve; returns its vertical detour run (x, y0, y1) or None."""
        self._end = QPointF(p1)
        path, run = route(p0, p1, obstacles, runs)
        self.setPath(path)
        return run

    def set_drop_target(self, on: bool) -> None:
        if on != self._drop_target:
            self._drop_target = on
            self.update()

    def shape(self) -> QPainterPath:
        s = QPainterPathStroker()
        s.setWidth(12)
        return s.createStroke(self.path())

    def boundingRect(self) -> QRectF:  # noqa: N802
        return self.path().boundingRect().adjusted(-ARROW - 4, -ARROW - 4, ARROW + 4, ARROW + 4)

    def hoverEnterEvent(self, event: QGraphicsSceneHoverEvent) -> None:  # noqa: N802
        self._hover = True
        self.update()

    def hoverLeaveEvent(self, event: QGraphicsSceneHoverEvent) -> None:  # noqa: N802
        self._hover = False
        self.update()

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        scene = self.scene()
        pal = scene.palette() if scene is not None else QPalette()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        if selected or self._drop_target:
            colour = pal.color(QPalette.ColorRole.Highlight)
            width = 3.0
        else:
            colour = QColor("#8b929c" if is_dark_palette(pal) else "#7d8590")
            width = 2.2 if self._hover else 1.6
        painter.setPen(QPen(colour, width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(self.path())
        # Arrowhead pointing into the input port.
        e = self._end
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(colour)
        painter.drawPolygon(QPolygonF([e, e + QPointF(-ARROW * 0.6, -ARROW), e + QPointF(ARROW * 0.6, -ARROW)]))
