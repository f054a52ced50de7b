"""Timeline chart: an Estimate's live bytes through the step, stacked by category, with phase bands and the peak.

`paint_timeline` is plain QPainter code (no widget), so the app's `TimelineChart` and the PDF report — even from a
worker thread — draw the very same picture; the widget only adds a cached pixmap and hover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPen, QPolygonF

from engine.core.units import format_bytes
from engine.results.types import Estimate

# Imported here, at module load (the GUI thread), not lazily inside a worker thread that paints a report.
try:
    from pyqtgraph.functions import create_qpolygonf, ndarray_from_qpolygonf
except ImportError:  # pragma: no cover
    create_qpolygonf = ndarray_from_qpolygonf = None

from .colors import LIGHT, ChartTheme, category_label, ordered_categories
from .painting import begin_chart, byte_ticks, chart_font

RESERVED_OFF_SCALE = 3.0
LegendItem = tuple[str, str, QColor]  # (swatch: box | dash | line, text, colour)
_PHASE_SHORT = {"setup": "setup", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "prefill": "prefill",
                "decode": "decode"}


class TimelineData:
    """Numpy arrays of one Estimate's timeline: x (event index), bytes per category, total."""

    def __init__(self, est: Estimate):
        tl = est.timeline
        keys: set[str] = set()
        for p in tl:
            keys.update(p.by_category)
        self.categories = ordered_categories(keys)
        # LoRA/QLoRA: the parameters are the frozen base; gradients and optimizer state the adapters' (the legend
        # names them as the summary and the breakdown do).
        self.peft = est.config.peft is not None
        self.x = np.array([p.index for p in tl], dtype=np.float64)
        self.values = np.array(
            [[p.by_category.get(c, 0) for c in self.categories] for p in tl], dtype=np.float64
        ).reshape(len(tl), len(self.categories))
        self.total = self.values.sum(axis=1) if len(tl) else np.zeros(0)
        # Drop categories that never hold a byte: they would only clutter the legend.
        live = self.values.max(axis=0) > 0 if len(tl) else np.zeros(len(self.categories), bool)
        self.categories = [c for c, keep in zip(self.categories, live, strict=False) if keep]
        self.values = self.values[:, live] if len(tl) else self.values[:, :0]
        reserved = est.gpu.reserved_timeline if est.gpu is not None else ()
        self.reserved = np.array(reserved, dtype=np.float64) if len(reserved) == len(tl) and len(tl) else None

    def __len__(self) -> int:
        return len(self.x)

    def keep(self, max_points: int, lo: float | None = None, hi: float | None = None) -> npt.NDArray[np.intp]:
        """Indices of at most ~max_points points: the largest total in each x bucket, so the peak survives.
        With `lo`/`hi` (a zoomed view) only the points drawn there: those inside and the one in effect at `lo`."""
        start, stop = 0, len(self.x)
        if lo is not None:
            start = max(int(np.searchsorted(self.x, lo, side="right")) - 1, 0)
        if hi is not None:
            stop = max(int(np.searchsorted(self.x, hi, side="right")), start + 1)
        n = stop - start
        if n <= max_points or max_points < 2:
            return np.arange(start, stop)
        x, total = self.x[start:stop], self.total[start:stop]
        edges = np.linspace(x[0], x[-1], max_points + 1)
        bucket = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, max_points - 1)
        order = np.lexsort((-total, bucket))
        first = np.r_[True, bucket[order][1:] != bucket[order][:-1]]
        return start + np.unique(np.r_[order[first], 0, n - 1])


def _measured_x(est: Estimate, measured: Estimate, mx: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Map a measured trace's event indices onto the estimate's axis, phase by phase when both have the same phases."""
    est_spans = {(s.step, s.phase): s for s in est.phases}
    pairs = sorted(
        ((m.start, m.end + 1, est_spans[(m.step, m.phase)]) for m in measured.phases if (m.step, m.phase) in est_spans),
        key=lambda t: t[0],
    )
    xp, fp = [], []
    for ms, me, es in pairs:
        xp += [ms, me]
        fp += [es.start, es.end + 1]
    if len(xp) >= 2 and np.all(np.diff(xp) > 0) and np.all(np.diff(fp) >= 0):
        return np.interp(mx, xp, fp)
    # No common phases: stretch the measured step over the estimated one.
    if len(mx) < 2 or not est.timeline:
        return mx
    x0, x1 = est.timeline[0].index, est.timeline[-1].index
    m0, m1 = float(mx[0]), float(mx[-1])
    return x0 + (mx - m0) / max(m1 - m0, 1) * (x1 - x0)


@dataclass
class TimelineGeometry:
    """Where the last paint put things, for hit-testing the mouse."""

    plot: QRectF
    x0: float  # the x range shown (zoomed or whole)
    x1: float
    data: TimelineData | None
    full: tuple[float, float] = (0.0, 1.0)  # the whole step's x range

    def index_at(self, px: float) -> int | None:
        """Position in est.timeline of the point in effect at device x `px` (None outside the plot)."""
        if self.data is None or not len(self.data) or not (self.plot.left() <= px <= self.plot.right()):
            return None
        x = self.x0 + (px - self.plot.left()) / max(self.plot.width(), 1e-9) * (self.x1 - self.x0)
        i = int(np.searchsorted(self.data.x, x, side="right")) - 1
        return min(max(i, 0), len(self.data) - 1)


def hover_text(est: Estimate, i: int) -> str:
    p = est.timeline[i]
    module = p.module or "(top level)"
    step = p.step - min((s.step for s in est.phases), default=p.step) + 1
    return f"{p.op} in {module} · {p.phase}, step {step} · {format_bytes(p.total)}"


def clamp_range(view: tuple[float, float], full: tuple[float, float], min_span: float = 8.0) -> tuple[float, float]:
    """A zoomed x range kept inside the whole step and at least `min_span` events wide."""
    lo, hi = sorted((float(view[0]), float(view[1])))
    span = min(max(hi - lo, min_span), full[1] - full[0])
    lo = min(max(lo, full[0]), full[1] - span)
    return lo, lo + span


def event_ticks(x0: float, x1: float, target: int) -> list[float]:
    """Round event counts (1, 2, 2.5 or 5 × 10^k apart) inside [x0, x1], about `target` of them."""
    span = max(x1 - x0, 1.0)
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = max(1.0, next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))
    if step != int(step):
        step = float(math.ceil(step))
    first = math.ceil(x0 / step) * step
    return [first + i * step for i in range(int((x1 - first) // step) + 1)]


def event_label(v: float) -> str:
    """An event count for an axis: 1400, 25k, 1.5M (one word, no separator to break or misread)."""
    v = int(v)
    if abs(v) < 10_000:
        return str(v)
    if abs(v) < 1_000_000:
        return f"{v / 1000:g}k"
    return f"{v / 1_000_000:g}M"


def _steps(
    xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64], x_end: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Memory holds its value until the next event: the staircase through the points, as vertex arrays."""
    return np.repeat(np.r_[xs, x_end], 2)[1:-1], np.repeat(ys, 2)


def _polygon(xx: npt.NDArray[np.float64], yy: npt.NDArray[np.float64]) -> QPolygonF:
    """A QPolygonF filled straight from numpy (pyqtgraph's zero-copy view) — a Python loop is too slow to repaint."""
    if create_qpolygonf is None:  # pragma: no cover - pyqtgraph is a dependency; keep working without it
        return QPolygonF([QPointF(a, b) for a, b in zip(xx.tolist(), yy.tolist(), strict=False)])
    poly: QPolygonF = create_qpolygonf(len(xx))
    view = ndarray_from_qpolygonf(poly)
    view[:, 0] = xx
    view[:, 1] = yy
    return poly


def _paint_peak(painter: QPainter, est: Estimate, plot: QRectF, px: float, py: float, theme: ChartTheme, u: float,
                font: QFont, fm: QFontMetricsF, bold: QFont, bfm: QFontMetricsF) -> None:
    """The peak's marker, dashed drop line and a label that stays inside the plot."""
    painter.setPen(QPen(theme.color("peak"), 1.2 * u, Qt.PenStyle.DashLine))
    painter.drawLine(QPointF(px, plot.bottom()), QPointF(px, py))
    painter.setPen(QPen(theme.color("background"), 1.2 * u))
    painter.setBrush(theme.color("peak"))
    painter.drawEllipse(QPointF(px, py), 4 * u, 4 * u)
    where = " · ".join(t for t in (est.peak_phase, est.peak_module or "(top level)") if t)
    lines = [f"Peak {format_bytes(est.peak_bytes)}", where]
    # Generous padding: rasterisers at low resolution draw text a little wider than its metrics.
    tw = max(bfm.horizontalAdvance(lines[0]), fm.horizontalAdvance(lines[1])) * 1.08 + 10 * u
    th = bfm.height() + fm.height() + 6 * u
    lx = px + 8 * u if px + 8 * u + tw <= plot.right() - 2 * u else max(plot.left() + 2 * u, px - 8 * u - tw)
    ly = min(max(py - th / 2, plot.top() + 2 * u), plot.bottom() - th - 2 * u)
    box = QRectF(lx, ly, tw, th)
    bg = theme.color("background")
    bg.setAlphaF(0.85)
    painter.setPen(QPen(theme.color("peak"), 1 * u))
    painter.setBrush(bg)
    painter.drawRoundedRect(box, 3 * u, 3 * u)
    painter.setPen(theme.color("foreground"))
    painter.setFont(bold)
    painter.drawText(QRectF(lx + 4 * u, ly + 3 * u, tw, bfm.height()), Qt.AlignmentFlag.AlignLeft, lines[0])
    painter.setFont(font)
    painter.drawText(QRectF(lx + 4 * u, ly + 3 * u + bfm.height(), tw, fm.height()), Qt.AlignmentFlag.AlignLeft,
                     lines[1])


def paint_timeline(
    painter: QPainter,
    rect: QRectF,
    est: Estimate | None,
    *,
    measured: Estimate | None = None,
    show_reserved: bool = True,
    theme: ChartTheme = LIGHT,
    hover_index: int | None = None,
    data: TimelineData | None = None,
    measured_data: TimelineData | None = None,
    background: bool = True,
    x_range: tuple[float, float] | None = None,
) -> TimelineGeometry:
    """Draw the whole chart inside `rect` (device coordinates of `painter`). Safe on any paint device and thread.
    `x_range`: the events to show (a zoomed view), in event indices; None shows the whole step."""
    u = begin_chart(painter, rect, theme.color("background") if background else None)
    font, fm = chart_font(painter, 8)
    bold, bfm = chart_font(painter, 8, bold=True)
    painter.setFont(font)

    if est is None or not est.timeline:
        painter.setPen(theme.color("muted"))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "No estimate yet" if est is None else "Empty timeline")
        painter.restore()
        return TimelineGeometry(QRectF(rect), 0.0, 1.0, None)

    data = data or TimelineData(est)
    mdata = None
    if measured is not None and measured.timeline:
        mdata = measured_data or TimelineData(measured)
    reserved = data.reserved if show_reserved else None

    y_max_data = float(data.total.max())
    if mdata is not None:
        y_max_data = max(y_max_data, float(mdata.total.max()))
    # The allocator's reserve of a tiny model (a 2 MiB segment minimum, 20 MiB blocks) would flatten the
    # tensors to a sliver: past RESERVED_OFF_SCALE × the tensors it is clipped at the top and its legend says so.
    reserved_clipped = False
    if reserved is not None:
        r_max = float(reserved.max())
        if r_max <= RESERVED_OFF_SCALE * max(y_max_data, 1.0):
            y_max_data = max(y_max_data, r_max)
        else:
            reserved_clipped = True
    # Legend entries first: their height decides the plot's bottom.
    legend: list[LegendItem] = [("box", category_label(c, data.peft), theme.category(c)) for c in data.categories]
    if reserved is not None:
        how = "measured" if est.source in ("snapshot", "profiler-cuda") else "predicted"
        text = f"Reserved ({how})"
        if reserved_clipped:
            text = f"Reserved ({how}; up to {format_bytes(r_max)}, above the scale)"
        legend.append(("dash", text, theme.color("reserved")))
    if mdata is not None and measured is not None:
        legend.append(("line", f"Measured ({measured.source})", theme.color("measured")))
    pad = 6 * u
    sw = 10 * u  # legend swatch
    rows: list[list[tuple[float, LegendItem]]] = [[]]
    cx = 0.0
    avail = rect.width() - 2 * pad
    for item in legend:
        w = sw + 4 * u + fm.horizontalAdvance(item[1]) + 12 * u
        if cx + w > avail and rows[-1]:
            rows.append([])
            cx = 0.0
        rows[-1].append((cx, item))
        cx += w
    row_h = max(fm.height(), sw) + 3 * u
    legend_h = len(rows) * row_h

    ticks, labels, y_top = byte_ticks(y_max_data * 1.05)
    label_w = max(fm.horizontalAdvance(t) for t in labels)

    plot = QRectF(
        rect.left() + pad + label_w + 6 * u,
        rect.top() + pad + bfm.height() + 4 * u,  # room for the phase labels above the plot
        0,
        0,
    )
    plot.setRight(rect.right() - pad - 4 * u)
    plot.setBottom(rect.bottom() - pad - legend_h - 2 * fm.height() - 8 * u)  # x tick values, then the caption
    if plot.width() < 20 * u or plot.height() < 20 * u:
        painter.restore()
        return TimelineGeometry(plot, 0.0, 1.0, None)

    x0 = float(data.x[0])
    x1 = float(max(data.x[-1] + 1, x0 + 1))
    for s in est.phases:
        x0 = min(x0, s.start)
        x1 = max(x1, s.end + 1)
    full = (x0, x1)
    if x_range is not None:
        x0, x1 = clamp_range(x_range, full)

    def X(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return plot.left() + (np.asarray(x, dtype=np.float64) - x0) / (x1 - x0) * plot.width()

    def Y(v: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return plot.bottom() - np.asarray(v, dtype=np.float64) / y_top * plot.height()

    # Phase bands, labelled above the plot when there is room.
    prev_step = None
    first_step = min((s.step for s in est.phases), default=0)
    for s in est.phases:
        left, right = float(X(s.start)), float(X(s.end + 1))
        if right <= plot.left() or left >= plot.right():  # outside a zoomed view
            prev_step = s.step
            continue
        at_edge = left < plot.left()
        left, right = max(left, plot.left()), min(right, plot.right())
        painter.fillRect(QRectF(left, plot.top(), right - left, plot.height()),
                         QColor(theme.phase_tint.get(s.phase, theme.grid)))
        n = s.step - first_step + 1  # steps are shown counted from 1
        short = _PHASE_SHORT.get(s.phase, s.phase)
        # Setup happens once: no step number. A band too narrow for a word stays unlabelled (hover names it).
        names = (s.phase, short) if s.phase == "setup" else (f"{s.phase} {n}", f"{short} {n}", short)
        for text in names:
            if bfm.horizontalAdvance(text) + 4 * u <= right - left:
                painter.setFont(bold)
                painter.setPen(theme.color("muted"))
                painter.drawText(QRectF(left, rect.top() + pad, right - left, bfm.height()),
                                 Qt.AlignmentFlag.AlignCenter, text)
                painter.setFont(font)
                break
        if prev_step is not None and s.step != prev_step and not at_edge:
            painter.setPen(QPen(theme.color("muted"), 1 * u, Qt.PenStyle.DashLine))
            painter.drawLine(QPointF(left, plot.top()), QPointF(left, plot.bottom()))
        prev_step = s.step

    # Grid and y labels.
    painter.setFont(font)
    for v, text in zip(ticks, labels, strict=False):
        y = float(Y(v))
        painter.setPen(QPen(theme.color("grid"), 0.75 * u))
        painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        painter.setPen(theme.color("muted"))
        painter.drawText(
            QRectF(rect.left() + pad, y - fm.height() / 2, label_w, fm.height()),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            text,
        )

    # Everything plotted stays inside the plot (a zoomed view cuts through the areas).
    painter.save()
    painter.setClipRect(plot, Qt.ClipOperation.IntersectClip)
    # Stacked areas, downsampled to about one point per device-independent pixel (peaks kept).
    keep = data.keep(int(plot.width() / u * 1.5), *((x0, x1) if x_range is not None else (None, None)))
    xs = X(data.x[keep])
    cum = np.cumsum(data.values[keep], axis=1)
    x_end = float(X(x1))
    lower = (np.array([float(xs[0]), x_end]), np.array([plot.bottom(), plot.bottom()]))
    painter.setPen(Qt.PenStyle.NoPen)
    for j, c in enumerate(data.categories):
        upper = _steps(xs, Y(cum[:, j]), x_end)
        painter.setBrush(QBrush(theme.category(c)))
        painter.drawPolygon(_polygon(np.r_[upper[0], lower[0][::-1]], np.r_[upper[1], lower[1][::-1]]))
        lower = upper

    # Overlays: predicted reserved, measured total.
    painter.setBrush(Qt.BrushStyle.NoBrush)
    if reserved is not None:
        painter.setPen(QPen(theme.color("reserved"), 1.4 * u, Qt.PenStyle.DashLine))
        shown = np.minimum(reserved[keep], y_top) if reserved_clipped else reserved[keep]
        painter.drawPolyline(_polygon(*_steps(xs, Y(shown), x_end)))
    if mdata is not None and measured is not None:
        mkeep = mdata.keep(int(plot.width() / u * 1.5))
        mxs = X(_measured_x(est, measured, mdata.x)[mkeep])
        painter.setPen(QPen(theme.color("measured"), 1.6 * u))
        painter.drawPolyline(_polygon(*_steps(mxs, Y(mdata.total[mkeep]), x_end)))
    painter.restore()

    # Axes frame, with the events counted along x.
    painter.setPen(QPen(theme.color("muted"), 1 * u))
    painter.drawLine(plot.bottomLeft(), plot.bottomRight())
    painter.drawLine(plot.bottomLeft(), plot.topLeft())
    painter.setPen(theme.color("muted"))
    for v in event_ticks(x0, x1, max(2, int(plot.width() / (fm.horizontalAdvance("000 000") + 24 * u)))):
        tx = float(X(v))
        painter.setPen(QPen(theme.color("muted"), 1 * u))
        painter.drawLine(QPointF(tx, plot.bottom()), QPointF(tx, plot.bottom() + 3 * u))
        text = event_label(v)
        tw_ = fm.horizontalAdvance(text) + 4 * u
        painter.drawText(QRectF(tx - tw_ / 2, plot.bottom() + 3 * u, tw_, fm.height()), Qt.AlignmentFlag.AlignCenter,
                         text)
    painter.drawText(
        QRectF(plot.left(), plot.bottom() + 4 * u + fm.height(), plot.width(), fm.height()),
        Qt.AlignmentFlag.AlignCenter,
        "allocation events through the step →" if x_range is None else
        f"allocation events {int(x0):,}–{int(x1):,} of {int(full[1]):,} (zoomed; double-click for the whole step)",
    )

    # The peak: marker, dashed drop line and a label that stays inside the plot (when the view shows it).
    px, py = float(X(est.peak_index + 0.5)), float(Y(est.peak_bytes))
    if not plot.left() <= px <= plot.right():
        px = float("nan")
    if px == px:  # not NaN
        _paint_peak(painter, est, plot, px, py, theme, u, font, fm, bold, bfm)

    # Hover: a thin line where the mouse is (the text goes out through the widget's signal).
    if hover_index is not None and 0 <= hover_index < len(data):
        hx = float(X(data.x[hover_index] + 0.5))
        painter.setPen(QPen(theme.color("foreground"), 1 * u))
        painter.drawLine(QPointF(hx, plot.top()), QPointF(hx, plot.bottom()))

    # Legend.
    painter.setFont(font)
    ly0 = rect.bottom() - pad - legend_h
    for i, row in enumerate(rows):
        y = ly0 + i * row_h
        for cx, (kind, text, color) in row:
            x = rect.left() + pad + cx
            sy = y + (row_h - sw) / 2
            if kind == "box":
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(color)
                painter.drawRect(QRectF(x, sy, sw, sw))
            else:
                style = Qt.PenStyle.DashLine if kind == "dash" else Qt.PenStyle.SolidLine
                painter.setPen(QPen(color, 1.6 * u, style))
                painter.drawLine(QPointF(x, sy + sw / 2), QPointF(x + sw, sy + sw / 2))
            painter.setPen(theme.color("foreground"))
            painter.drawText(
                QRectF(x + sw + 4 * u, y, fm.horizontalAdvance(text) + 2 * u, row_h),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                text,
            )
    painter.restore()
    return TimelineGeometry(plot, x0, x1, data, full)
