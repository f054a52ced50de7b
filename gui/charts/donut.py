"""The app's breakdown donut widget: render.donut's painter plus hover."""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Signal
from PySide6.QtGui import QMouseEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from engine.core.units import format_bytes
from render.colors import ChartTheme, category_label, theme_for_palette
from render.donut import OTHER, donut_slices, paint_donut
from render.painting import percent


class DonutChart(QWidget):
    """The app's breakdown donut; hovering a slice names it with its bytes and share."""

    sliceHovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setMinimumSize(220, 140)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self._breakdown: dict[str, int] = {}
        self._total: int | None = None
        self._caption = "at the peak"
        self._peft = False
        self._hover: str | None = None
        self._ring = QRectF()
        self._angles: list[tuple[str, float, float]] = []

    def set_breakdown(self, breakdown: dict[str, int] | None, total: int | None = None,
                      caption: str = "at the peak", peft: bool = False) -> None:
        """`peft`: a LoRA/QLoRA step, whose parameters are the frozen base (render.colors.category_label)."""
        self._peft = peft
        self._breakdown = dict(breakdown or {})
        self._total = total
        self._caption = caption
        self._hover = None
        self.update()

    def breakdown(self) -> dict[str, int]:
        return dict(self._breakdown)

    def render_to(self, painter: QPainter, rect: QRectF, theme: ChartTheme | None = None) -> None:
        paint_donut(painter, QRectF(rect), self._breakdown, self._total, theme=theme or self.theme(),
                    caption=self._caption, peft=self._peft)

    def theme(self) -> ChartTheme:
        return theme_for_palette(self.palette())

    def sizeHint(self) -> QSize:
        return QSize(380, 220)

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        self._ring, self._angles = paint_donut(
            p, QRectF(self.rect()), self._breakdown, self._total, theme=self.theme(), highlight=self._hover,
            caption=self._caption, peft=self._peft,
        )
        p.end()

    def slice_at(self, pos: QPointF) -> str | None:
        if self._ring.isEmpty():
            return None
        c = self._ring.center()
        dx, dy = pos.x() - c.x(), c.y() - pos.y()
        r = math.hypot(dx, dy)
        if not (self._ring.width() / 2 * 0.56 <= r <= self._ring.width() / 2):
            return None
        ang = math.degrees(math.atan2(dy, dx))
        for name, start, span in self._angles:  # spans are negative (clockwise)
            rel = (start - ang) % 360.0
            if rel <= -span:
                return name
        return None

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        name = self.slice_at(event.position())
        if name != self._hover:
            self._hover = name
            text = ""
            if name is not None:
                slices, whole = donut_slices(self._breakdown, self._total)
                v = dict(slices)[name]
                label = category_label(name, self._peft) if name != OTHER else "Other"
                text = f"{label}: {format_bytes(v)} ({percent(v, whole)})"
            self.setToolTip(text)
            self.sliceHovered.emit(text)
            self.update()
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        if self._hover is not None:
            self._hover = None
            self.sliceHovered.emit("")
            self.update()
        super().leaveEvent(event)
