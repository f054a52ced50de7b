"""Shared painting helpers for the charts: device-independent sizes, fonts and binary-unit axis ticks.

Sizes are given in CSS pixels (1/96 inch) and scaled to the painter's device, so the same code draws a widget,
a 300-dpi PDF page or an SVG identically.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter

_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


def unit_scale(painter: QPainter) -> float:
    """Device pixels per CSS pixel for this painter's device (1.0 on a normal widget)."""
    dev = painter.device()
    dpi = dev.logicalDpiY() if dev is not None else 96
    return max(dpi, 1) / 96.0


def begin_chart(painter: QPainter, rect: QRectF, fill: QColor | None) -> float:
    """Save the painter, antialias, clip to `rect` and fill it with `fill` (None: leave it transparent); returns
    unit_scale(painter). Every chart starts so; the caller's `painter.restore()` ends it."""
    u = unit_scale(painter)
    painter.save()
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    painter.setClipRect(rect)
    if fill is not None:
        painter.fillRect(rect, fill)
    return u


def no_ligatures(font: QFont) -> QFont:
    """Ligatures ("fi" → "ﬁ") make PDF text unsearchable for the plain word; charts and reports turn them off."""
    if hasattr(font, "setFeature") and hasattr(QFont, "Tag"):  # Qt ≥ 6.7
        font.setFeature(QFont.Tag("liga"), 0)
    return font


def chart_font(painter: QPainter, point_size: float, bold: bool = False) -> tuple[QFont, QFontMetricsF]:
    font = no_ligatures(QFont(painter.font()))
    font.setPointSizeF(point_size)
    font.setBold(bold)
    return font, QFontMetricsF(font, painter.device())


def byte_ticks(vmax: float, target: int = 5) -> tuple[list[float], list[str], float]:
    """Evenly spaced ticks from 0 covering vmax in one binary unit; returns (values, labels, axis top)."""
    vmax = max(float(vmax), 1.0)
    name, size = next((n, s) for n, s in _UNITS if vmax >= s)
    span = vmax / size
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if name == "B":
        step = max(1.0, math.ceil(step))
    count = int(math.ceil(span / step - 1e-9))
    values = [i * step * size for i in range(count + 1)]
    labels = [_tick_label(i * step, name) for i in range(count + 1)]
    return values, labels, values[-1]


def _tick_label(v: float, unit: str) -> str:
    if v == 0:
        return "0"
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "–"

