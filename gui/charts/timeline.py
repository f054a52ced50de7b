"""The app's timeline widget: render.timeline's painter into a cached pixmap, plus hover."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Signal
from PySide6.QtGui import QMouseEvent, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QSizePolicy, QWidget

from engine.results import Estimate
from render.colors import ChartTheme, theme_for_palette
from render.timeline import TimelineData, TimelineGeometry, hover_text, paint_timeline


class TimelineChart(QWidget):
    """The app's timeline: `paint_timeline` into a cached pixmap, plus hover (op and module under the mouse)."""

    pointHovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setMinimumSize(320, 180)
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
        )

    def theme(self) -> ChartTheme:
        return theme_for_palette(self.palette())

    # -- Qt -----------------------------------------------------------------------------------------------------
    def sizeHint(self) -> QSize:
        return QSize(640, 300)

    def _invalidate(self) -> None:
        self._cache = None
        self.update()

    def changeEvent(self, event) -> None:  # palette switch (light/dark) redraws with the other theme
        self._cache = None
        super().changeEvent(event)

    def resizeEvent(self, event) -> None:
        self._cache = None
        super().resizeEvent(event)

    def paintEvent(self, event) -> None:
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

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        i = self._geometry.index_at(event.position().x()) if self._geometry is not None else None
        if i != self._hover:
            self._hover = i
            self.update()
            if i is not None and self._est is not None:
                text = hover_text(self._est, i)
                self.setToolTip(text)
                self.pointHovered.emit(text)
        super().mouseMoveEvent(event)

    def leaveEvent(self, event) -> None:
        if self._hover is not None:
            self._hover = None
            self.setToolTip("")
            self.pointHovered.emit("")
            self.update()
        super().leaveEvent(event)
