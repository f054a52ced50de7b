"""The app's timeline widget: render.timeline's painter into a cached pixmap, plus hover, zoom and pan
(wheel or +/- to zoom where the mouse is, drag to pan, double-click or 0 for the whole step)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QKeyEvent,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QPixmap,
    QResizeEvent,
    QWheelEvent,
)
from PySide6.QtWidgets import QSizePolicy, QWidget

from engine.results.types import Estimate
from render.colors import ChartTheme, theme_for_palette
from render.timeline import TimelineData, TimelineGeometry, clamp_range, hover_text, paint_timeline

HINT = "Wheel or +/− to zoom, drag to pan, double-click or 0 for the whole step"
ZOOM_STEP = 0.8  # each wheel notch or key press shows 80 % (or 125 %) of the events shown before


class TimelineChart(QWidget):
    """The app's timeline: `paint_timeline` into a cached pixmap, plus hover (op and module under the mouse)."""

    pointHovered = Signal(str)
    viewChanged = Signal(object)  # (first, last) event shown, or None for the whole step

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # + - 0 once clicked
        self.setToolTip(HINT)
        self._view: tuple[float, float] | None = None
        self._drag: tuple[float, tuple[float, float]] | None = None  # press x, view at the press
        self.setMinimumSize(240, 180)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self._est: Estimate | None = None
        self._measured: Estimate | None = None
        self._data: TimelineData | None = None
        self._mdata: TimelineData | None = None
        self._reserved = True
        self._hover: int | None = None
        self._cache: QPixmap | None = None
        self._geometry: TimelineGeometry | None = None

    # -- public API ---------------------------------------------------------------------------------------------
    def set_estimate(self, est: Estimate | None) -> None:
        if est is None or self._est is None or len(est.timeline) != len(self._est.timeline):
            self._view = None  # another step: the whole of it
        self._est = est
        self._data = TimelineData(est) if est is not None and est.timeline else None
        self._hover = None
        self._invalidate()

    def set_measured(self, est: Estimate | None) -> None:
        self._measured = est
        self._mdata = TimelineData(est) if est is not None and est.timeline else None
        self._invalidate()

    def set_reserved(self, visible: bool) -> None:
        self._reserved = bool(visible)
        self._invalidate()

    def estimate(self) -> Estimate | None:
        return self._est

    def view(self) -> tuple[float, float] | None:
        """The events shown (first, last), or None when the whole step is."""
        return self._view

    def set_view(self, view: tuple[float, float] | None) -> None:
        g = self._geometry
        if view is not None and g is not None and g.data is not None:
            view = clamp_range(view, g.full)
            if view[1] - view[0] >= g.full[1] - g.full[0]:
                view = None
        if view != self._view:
            self._view = view
            self._invalidate()
            self.viewChanged.emit(view)

    def zoom(self, factor: float, at_px: float | None = None) -> None:
        """Show `factor` × the events shown now (< 1 zooms in), keeping the event under `at_px` in place."""
        g = self._geometry
        if g is None or g.data is None:
            return
        x0, x1 = self._view or g.full
        frac = 0.5 if at_px is None else min(max((at_px - g.plot.left()) / max(g.plot.width(), 1.0), 0.0), 1.0)
        anchor = x0 + frac * (x1 - x0)
        span = (x1 - x0) * factor
        self.set_view((anchor - frac * span, anchor - frac * span + span))

    def render_to(self, painter: QPainter, rect: QRectF, theme: ChartTheme | None = None) -> None:
        """Draw the chart as the user sees it (without hover) onto any painter; vector on PDF/SVG devices."""
        paint_timeline(
            painter,
            QRectF(rect),
            self._est,
            measured=self._measured,
            show_reserved=self._reserved,
            theme=theme or self.theme(),
            data=self._data,
            measured_data=self._mdata,
            x_range=self._view,
        )

    def theme(self) -> ChartTheme:
        return theme_for_palette(self.palette())

    # -- Qt -----------------------------------------------------------------------------------------------------
    def sizeHint(self) -> QSize:
        return QSize(640, 300)

    def _invalidate(self) -> None:
        self._cache = None
        self.update()

    def changeEvent(self, event: QEvent) -> None:  # palette switch (light/dark) redraws with the other theme
        self._cache = None
        super().changeEvent(event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._cache = None
        super().resizeEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:
        ratio = self.devicePixelRatioF()
        if self._cache is None or self._cache.size() != self.size() * ratio:
            pix = QPixmap(self.size() * ratio)
            pix.setDevicePixelRatio(ratio)
            p = QPainter(pix)
            self._geometry = paint_timeline(
                p,
                QRectF(self.rect()),
                self._est,
                measured=self._measured,
                show_reserved=self._reserved,
                theme=self.theme(),
                data=self._data,
                measured_data=self._mdata,
                x_range=self._view,
            )
            p.end()
            self._cache = pix
        p = QPainter(self)
        p.drawPixmap(0, 0, self._cache)
        if self._hover is not None and self._geometry is not None and self._data is not None:
            g = self._geometry
            x = g.plot.left() + (self._data.x[self._hover] + 0.5 - g.x0) / (g.x1 - g.x0) * g.plot.width()
            p.setPen(QPen(self.theme().color("foreground"), 1))
            p.drawLine(QPointF(x, g.plot.top()), QPointF(x, g.plot.bottom()))
        p.end()

    def wheelEvent(self, event: QWheelEvent) -> None:
        notches = event.angleDelta().y() / 120
        if notches:
            self.zoom(ZOOM_STEP ** notches, event.position().x())
            event.accept()
        else:
            super().wheelEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Plus, Qt.Key.Key_Equal):
            self.zoom(ZOOM_STEP)
        elif key == Qt.Key.Key_Minus:
            self.zoom(1 / ZOOM_STEP)
        elif key == Qt.Key.Key_0:
            self.set_view(None)
        elif key in (Qt.Key.Key_Left, Qt.Key.Key_Right) and self._view is not None:
            v0, v1 = self._view
            shift = (v1 - v0) * 0.1 * (1 if key == Qt.Key.Key_Right else -1)
            self.set_view((v0 + shift, v1 + shift))
        else:
            super().keyPressEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton and self._geometry is not None:
            self._drag = (event.position().x(), self._view or self._geometry.full)
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        self._drag = None
        super().mouseReleaseEvent(event)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        self.set_view(None)
        super().mouseDoubleClickEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        g = self._geometry
        if self._drag is not None and g is not None and self._view is not None:
            press_x, (v0, v1) = self._drag
            shift = (press_x - event.position().x()) / max(g.plot.width(), 1.0) * (v1 - v0)
            self.set_view((v0 + shift, v1 + shift))
        i = self._geometry.index_at(event.position().x()) if self._geometry is not None else None
        if i != self._hover:
            self._hover = i
            self.update()
            if i is not None and self._est is not None:
                text = hover_text(self._est, i)
                self.setToolTip(text)
                self.pointHovered.emit(text)
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        if self._hover is not None:
            self._hover = None
            self.setToolTip(HINT)
            self.pointHovered.emit("")
            self.update()
        super().leaveEvent(event)
