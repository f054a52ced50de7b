"""Breakdown donut: what the peak is made of, one slice per category with its share, and a legend with bytes.

`paint_donut` is plain QPainter code shared by the app's `DonutChart` and the PDF report.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen

from engine.core.units import format_bytes

from .colors import LIGHT, ChartTheme, category_label, ordered_categories
from .painting import begin_chart, chart_font, percent

OTHER = "other"


def donut_slices(breakdown: dict[str, int], total: int | None = None) -> tuple[list[tuple[str, int]], int]:
    """Positive slices in stacking order, plus 'other' when `total` exceeds their sum; returns (slices, whole)."""
    slices = [(c, int(breakdown[c])) for c in ordered_categories(breakdown) if breakdown[c] > 0]
    whole = sum(v for _, v in slices)
    if total is not None and total > whole:
        slices.append((OTHER, int(total) - whole))
        whole = int(total)
    return slices, whole


def _chord(radius: float, off: float) -> float:
    """The width of a circle of `radius` at `off` from its centre."""
    return 2 * math.sqrt(max(radius * radius - off * off, 0.0))


def _fitted(painter: QPainter, text: str, size: float, bold: bool, radius: float,
            margin: float) -> tuple[QFont, QFontMetricsF]:
    """The font, from `size` points down to 5, in which `text` on a line touching the centre of a hole of
    `radius` fits inside it."""
    font, fm = chart_font(painter, size, bold=bold)
    while size > 5 and fm.horizontalAdvance(text) > _chord(radius, fm.height()) - 2 * margin:
        size -= 0.5
        font, fm = chart_font(painter, size, bold=bold)
    return font, fm


def paint_donut(
    painter: QPainter,
    rect: QRectF,
    breakdown: dict[str, int] | None,
    total: int | None = None,
    *,
    theme: ChartTheme = LIGHT,
    caption: str = "at the peak",
    background: bool = True,
    highlight: str | None = None,
    peft: bool = False,
) -> tuple[QRectF, list[tuple[str, float, float]]]:
    """Draw donut and legend inside `rect`; returns the ring's bounds and (category, start°, span°) per slice."""
    u = begin_chart(painter, rect, theme.color("background") if background else None)
    font, fm = chart_font(painter, 8)
    slices, whole = donut_slices(breakdown or {}, total)
    if not slices:
        painter.setFont(font)
        painter.setPen(theme.color("muted"))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "No breakdown yet")
        painter.restore()
        return QRectF(), []

    pad = 6 * u
    # Legend on the right when the area is wide, under the ring when it is tall.
    rows = [
        (name, category_label(name, peft) if name != OTHER else "Other", format_bytes(v), percent(v, whole))
        for name, v in slices
    ]
    name_w = max(fm.horizontalAdvance(r[1]) for r in rows)
    bytes_w = max(fm.horizontalAdvance(r[2]) for r in rows)
    pct_w = max(fm.horizontalAdvance(r[3]) for r in rows)
    sw = 10 * u
    legend_w = sw + 6 * u + name_w + 12 * u + bytes_w + 10 * u + pct_w
    row_h = max(fm.height(), sw) + 4 * u
    legend_h = row_h * len(rows)
    inner = rect.adjusted(pad, pad, -pad, -pad)
    side_by_side = inner.width() - legend_w >= min(inner.height(), inner.width() * 0.6) * 0.8
    if side_by_side:
        d = min(inner.height(), inner.width() - legend_w - 16 * u)
        x0 = inner.left() + max((inner.width() - d - 16 * u - legend_w) / 2, 0)  # ring and legend centred as a group
        ring = QRectF(x0, inner.top() + (inner.height() - d) / 2, d, d)
        lx = ring.right() + 16 * u
        ly = inner.top() + max((inner.height() - legend_h) / 2, 0)
    else:
        d = min(inner.width(), inner.height() - legend_h - 8 * u)
        ring = QRectF(inner.left() + (inner.width() - d) / 2, inner.top(), d, d)
        lx = inner.left() + max((inner.width() - legend_w) / 2, 0)
        ly = ring.bottom() + 8 * u
    d = max(d, 0)
    thickness = d * 0.22
    angles: list[tuple[str, float, float]] = []
    if d > 10 * u:
        outer = QRectF(ring)
        hole = ring.adjusted(thickness, thickness, -thickness, -thickness)
        start = 90.0  # clockwise from twelve o'clock
        for name, v in slices:
            span = -360.0 * v / whole
            path = QPainterPath()
            path.arcMoveTo(outer, start)
            path.arcTo(outer, start, span)
            path.arcTo(hole, start + span, -span)
            path.closeSubpath()
            color = theme.category(name) if name != OTHER else QColor(theme.grid)
            painter.setPen(QPen(theme.color("background"), 1 * u))
            painter.setBrush(color)
            if highlight == name:
                mid = math.radians(start + span / 2)
                off = 3 * u
                painter.save()
                painter.translate(off * math.cos(mid), -off * math.sin(mid))
                painter.drawPath(path)
                painter.restore()
            else:
                painter.drawPath(path)
            angles.append((name, start, span))
            # Percentages on slices big enough to hold them.
            if abs(span) >= 18 and thickness > fm.height():
                mid = math.radians(start + span / 2)
                r = d / 2 - thickness / 2
                c = ring.center()
                pos = QPointF(c.x() + r * math.cos(mid), c.y() - r * math.sin(mid))
                text = f"{100 * v / whole:.0f}%"
                painter.setFont(font)
                painter.setPen(QColor("#000000") if color.lightnessF() > 0.55 else QColor("#FFFFFF"))
                tw = fm.horizontalAdvance(text) + 2 * u
                painter.drawText(QRectF(pos.x() - tw / 2, pos.y() - fm.height() / 2, tw, fm.height()),
                                 Qt.AlignmentFlag.AlignCenter, text)
            start += span
        # The whole in the middle, each line as large as the hole's width at its height allows (a small ring cut
        # "486.00 MiB" and "in nvidia-smi" at its edges).
        c, radius = hole.center(), hole.width() / 2
        lines: tuple[tuple[str, float, bool, QColor, bool], ...] = (
            (format_bytes(whole), 11, True, theme.color("foreground"), False),
            (caption, 8, False, theme.color("muted"), True))
        for text, size, bold_line, colour, below in lines:
            line_font, line_fm = _fitted(painter, text, size, bold_line, radius, 2 * u)
            h = line_fm.height()
            painter.setFont(line_font)
            painter.setPen(colour)
            painter.drawText(QRectF(c.x() - radius, c.y() if below else c.y() - h, 2 * radius, h),
                             Qt.AlignmentFlag.AlignHCenter | (Qt.AlignmentFlag.AlignTop if below
                                                              else Qt.AlignmentFlag.AlignBottom),
                             line_fm.elidedText(text, Qt.TextElideMode.ElideRight, _chord(radius, h) - 2 * u))

    painter.setFont(font)
    for i, (name, label, b, pct) in enumerate(rows):
        y = ly + i * row_h
        color = theme.category(name) if name != OTHER else QColor(theme.grid)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(color)
        painter.drawRect(QRectF(lx, y + (row_h - sw) / 2, sw, sw))
        painter.setPen(theme.color("foreground"))
        x = lx + sw + 6 * u
        va = Qt.AlignmentFlag.AlignVCenter
        painter.drawText(QRectF(x, y, name_w + 2 * u, row_h), Qt.AlignmentFlag.AlignLeft | va, label)
        x += name_w + 12 * u
        painter.drawText(QRectF(x, y, bytes_w + 2 * u, row_h), Qt.AlignmentFlag.AlignRight | va, b)
        x += bytes_w + 10 * u
        painter.setPen(theme.color("muted"))
        painter.drawText(QRectF(x, y, pct_w + 2 * u, row_h), Qt.AlignmentFlag.AlignRight | va, pct)
    painter.restore()
    return ring, angles
