"""The summary of an estimate: the peak, where it happens, what it is made of, and the fits gauge."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import (
    QGraphicsOpacityEffect,
    QGridLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from engine.results.types import ALL_CATEGORIES, Estimate
from engine.sketch.analytic import AnalyticResult
from render.colors import category_meaning

from .formatting import category_color, category_label, format_bytes, format_count


def _luminance(c: QColor) -> float:
    """WCAG relative luminance."""
    ch = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in (c.redF(), c.greenF(), c.blueF())]
    return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2]


def _readable_on(fill: QColor) -> QColor:
    """Near-black or white, whichever contrasts more with the fill."""
    lum = _luminance(fill)
    return QColor("#ffffff") if (1.05 / (lum + 0.05)) >= ((lum + 0.05) / 0.0625) else QColor("#1a1a1a")


class FitGauge(QWidget):
    """A horizontal bar: needed bytes against the target's total, green when it fits, red when it does not."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("FitGauge")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.needed: int | None = None
        self.total: int | None = None
        self.high: int | None = None
        self.verdict: str | None = None
        self.text = ""

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt naming)
        return QSize(200, 22)

    def set_values(self, needed: int | None, total: int | None, *, high: int | None = None,
                   verdict: str | None = None, reason: str = "") -> None:
        """`high`: the upper end of the estimate's range (drawn lighter); `verdict`: the engine's fits / tight /
        does not fit, which the gauge shows as it is rather than judging again."""
        self.needed, self.total, self.high, self.verdict = needed, total, high, verdict
        if needed is None:
            self.text = ""
        elif not total:
            self.text = "no target GPU"
        elif verdict == "tight" and needed > total:  # the live tensors fit; the modelled allocator runs out
            self.text = f"tight — {format_bytes(needed - total)} over by the figure, the live tensors fit"
        elif verdict == "tight":
            self.text = f"tight — {format_bytes(total - needed)} to spare"
        elif verdict == "does not fit" or (verdict is None and needed > total):
            self.text = f"does not fit — {format_bytes(max(0, needed - total))} over"
        else:
            self.text = f"fits — {format_bytes(total - needed)} to spare"
        self.setToolTip(self.text + (f" of {format_bytes(total)} usable (what a process can allocate: the card's "
                                     "memory less the driver's reserve)" if total else "")
                        + (f"\n{reason}" if reason else ""))
        self.update()

    @property
    def fits(self) -> bool | None:
        if self.needed is None or not self.total:
            return None
        return self.needed <= self.total

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        pal = self.palette()
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(r, 4, 4)
        fill = QRectF()
        on_fill = pal.color(QPalette.ColorRole.Text)
        if self.needed is not None and self.total:
            frac = min(1.0, self.needed / self.total)
            fits = self.needed <= self.total if self.verdict is None else self.verdict != "does not fit"
            tight = self.verdict == "tight" or (self.verdict is None and frac >= 0.9)
            color = QColor("#c43c3c") if not fits else QColor("#d89614") if tight else QColor("#2e7d4a")
            fill = QRectF(r.left(), r.top(), max(4.0, r.width() * frac), r.height())
            p.setPen(Qt.PenStyle.NoPen)
            if self.high and self.high > self.needed:  # the range's upper end, lighter
                band = QColor(color)
                band.setAlpha(90)
                p.setBrush(band)
                p.drawRoundedRect(QRectF(r.left(), r.top(), r.width() * min(1.0, self.high / self.total),
                                         r.height()), 4, 4)
            fill = QRectF(r.left(), r.top(), max(4.0, r.width() * frac), r.height())
            p.setBrush(color)
            p.drawRoundedRect(fill, 4, 4)
            on_fill = _readable_on(color)
        if self.text:
            # The text in the track's colour over the track and in a contrasting one over the fill, so every word
            # reads wherever the fill ends.
            text_rect = r.adjusted(6, 0, -6, 0)
            flags = Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft
            font = p.font()
            font.setBold(True)
            p.setFont(font)
            for clip, colour in ((fill, on_fill), (QRectF(fill.right(), r.top(), r.width(), r.height()),
                                                   pal.color(QPalette.ColorRole.Text))):
                if clip.isEmpty() and clip is fill:
                    continue
                p.save()
                p.setClipRect(clip if not fill.isEmpty() else r)
                p.setPen(colour)
                p.drawText(text_rect, flags, p.fontMetrics().elidedText(self.text, Qt.TextElideMode.ElideRight,
                                                                        int(text_rect.width())))
                p.restore()
        p.end()


class SummaryView(QWidget):
    """Peak, place of the peak, parameters, breakdown by category and the gauge. Keeps the last figures on error."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("SummaryView")
        self.estimate: Estimate | None = None
        self._done_text = ""  # what the status line says when no job runs

        self.title = QLabel("Peak memory")
        self.title.setObjectName("SummaryTitle")
        self.peak = QLabel("—")
        self.peak.setObjectName("PeakLabel")
        self.peak.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.where = QLabel("")
        self.where.setObjectName("PeakWhere")
        self.where.setWordWrap(True)
        self.params = QLabel("")
        self.params.setWordWrap(True)  # "1,237,518,336 parameters, 1,703,936 trainable" outgrows a narrow summary
        self.gpu_line = QLabel("")
        self.gpu_line.setWordWrap(True)
        self.gauge = FitGauge()
        self.busy = QProgressBar()
        self.busy.setObjectName("BusyBar")
        self.busy.setRange(0, 0)  # indeterminate: quiet, thin
        self.busy.setTextVisible(False)
        self.busy.setFixedHeight(3)
        self.busy.setVisible(False)
        sp = self.busy.sizePolicy()
        sp.setRetainSizeWhenHidden(True)  # the layout must not jump each time a job starts
        self.busy.setSizePolicy(sp)
        self.status = QLabel("")
        self.status.setObjectName("SummaryStatus")
        self.error = QLabel("")
        self.error.setObjectName("ErrorLine")
        self.error.setWordWrap(True)
        self.error.setVisible(False)

        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(8)
        self.grid.setVerticalSpacing(2)

        self._dimmed = False
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(4)
        lay.addWidget(self.busy)
        for w in (self.title, self.peak, self.where, self.gauge, self.gpu_line, self.params):
            lay.addWidget(w)
        lay.addLayout(self.grid)
        lay.addWidget(self.error)
        lay.addStretch(1)
        lay.addWidget(self.status)

    # ---- state
    def set_dimmed(self, dimmed: bool) -> None:
        """Dim the figures (they are of an older version); the error and the status line stay at full strength.
        Each figure widget gets its own effect: a container widget would lose the wrapped labels' heights."""
        self._dimmed = dimmed
        for w in self._figure_widgets():
            self._dim(w)

    def _figure_widgets(self) -> list[QWidget]:
        items = (self.grid.itemAt(i) for i in range(self.grid.count()))
        grid = [w for item in items if item is not None and (w := item.widget()) is not None]
        return [self.title, self.peak, self.where, self.gauge, self.gpu_line, self.params, *grid]

    def _dim(self, w: QWidget) -> None:
        if self._dimmed:
            effect = QGraphicsOpacityEffect(w)
            effect.setOpacity(0.45)
            w.setGraphicsEffect(effect)
        else:
            # PySide6's stub omits None, which Qt takes as "remove the effect".
            w.setGraphicsEffect(None)  # type: ignore[arg-type]

    def set_busy(self, busy: bool, message: str = "") -> None:
        """While busy the status line says so; after, it says again what the figures are (never a stale
        "estimating…" once the engine has answered, with figures or with an error)."""
        self.busy.setVisible(busy)
        if busy:
            self.status.setText(message or "estimating…")
        else:
            self.status.setText(message or self._done_text)

    def set_error(self, message: str) -> None:
        """A one-line error; the previous figures stay (dimmed by the stylesheet via the 'stale' property)."""
        self.error.setText(message)
        self.error.setVisible(bool(message))
        self.peak.setProperty("stale", bool(message))
        self.peak.style().unpolish(self.peak)
        self.peak.style().polish(self.peak)

    def clear(self) -> None:
        self.estimate = None
        self._done_text = ""
        self.title.setText("Peak memory")
        self.peak.setText("—")
        self.where.setText("")
        self.params.setText("")
        self.gpu_line.setText("")
        self.gauge.set_values(None, None)
        self._set_breakdown({}, 0)
        self.status.setText("")

    def set_estimate(self, est: Estimate, *, target_bytes: int | None = None) -> None:
        """Show an engine Estimate (traced, analytic or measured)."""
        self.estimate = est
        self.set_error("")
        source = est.source
        self.title.setText("Peak memory (analytic, refining…)" if source == "analytic" else
                           "Peak memory (measured)" if str(source).startswith("profiler") else "Peak memory")
        self.peak.setText(format_bytes(est.peak_bytes))
        where = " / ".join(x for x in (est.peak_phase, est.peak_module or "", est.peak_op or "") if x)
        program = f" — {est.generation.describe_program()}" if est.generation is not None else \
            " — compiled (torch.compile)" if est.config.compile else ""
        self.where.setText(f"at {where}{program}" if where else "")
        trainable = (f", {est.trainable_parameters:,} trainable"
                     if est.trainable_parameters != est.parameters else "")
        self.params.setText(f"{est.parameters:,} parameters{trainable}")
        self.params.setToolTip(f"{format_count(est.parameters)} parameters")
        gpu = est.gpu
        if gpu is not None and gpu.gpu_total_bytes:
            # Against what a process can allocate (the total less the driver's reserve), as the CLI and the
            # report judge the fit.
            usable = gpu.nvidia_smi_bytes + gpu.margin_bytes if gpu.margin_bytes is not None else gpu.gpu_total_bytes
            self.gauge.set_values(gpu.nvidia_smi_bytes, usable, high=gpu.nvidia_smi_high_bytes or None,
                                  verdict=gpu.verdict, reason=gpu.verdict_reason)
            verdict = f" — {gpu.verdict}" if gpu.verdict else ""
            band = (f" ({format_bytes(gpu.nvidia_smi_low_bytes)}–{format_bytes(gpu.nvidia_smi_high_bytes)})"
                    if gpu.nvidia_smi_high_bytes else "")
            self.gpu_line.setText(
                f"{gpu.assumed_gpu or gpu.gpu_name} ({format_bytes(usable)} usable): reserved "
                f"{format_bytes(gpu.reserved_bytes)}, nvidia-smi {format_bytes(gpu.nvidia_smi_bytes)}{band}{verdict}"
            )
            instants = (f"\nreserved peaks at {gpu.reserved_peak_at}; at the live peak ({gpu.live_peak_at}) "
                        f"{format_bytes(gpu.reserved_at_live_peak_bytes)} reserved, "
                        f"{format_bytes(gpu.cached_free_bytes)} of it cached free blocks"
                        if gpu.live_peak_at else "")
            self.gpu_line.setToolTip(
                f"{gpu.verdict_reason}\nmeasured {format_bytes(gpu.measured_bytes)} (traced tensors, kernels and "
                f"context measured on this GPU model), modelled {format_bytes(gpu.modelled_bytes)} (allocator, "
                f"kernels and context from rules){instants}" if gpu.verdict else "")
        else:
            self.gauge.set_values(est.peak_bytes, target_bytes)
            self.gpu_line.setText(gpu.assumed_gpu if gpu is not None else "")
            self.gpu_line.setToolTip("")
        self._set_breakdown(est.breakdown_at_peak, est.peak_bytes, peft=est.config.peft is not None)
        elapsed = est.elapsed_s
        label = {"analytic": "analytic", "tracer": "traced"}.get(source, source)
        self._done_text = f"{label}" + (f" in {elapsed:.2f} s" if elapsed else "")
        self.status.setText(self._done_text)

    def set_analytic(self, res: AnalyticResult, *, target_bytes: int | None = None) -> None:
        """Instant figures from engine.sketch.analytic (AnalyticResult) while the traced estimate is on its way.

        An error line stays: only a traced estimate that succeeds clears it."""
        self.title.setText("Peak memory (analytic, refining…)")
        self.peak.setText(format_bytes(res.peak_bytes))
        where = " / ".join(x for x in (res.peak_phase, res.peak_node) if x)
        self.where.setText(f"at {where}" if where else "")
        self.params.setText(f"{res.parameters:,} parameters")
        self.params.setToolTip(f"{format_count(res.parameters)} parameters")
        self.gauge.set_values(res.peak_bytes, target_bytes)
        self.gpu_line.setText(f"{format_bytes(target_bytes)} usable on the target GPU" if target_bytes else "")
        self._set_breakdown(res.breakdown_at_peak, res.peak_bytes)
        errors = res.errors
        self._done_text = "analytic" + (f" — {len(errors)} node(s) without a shape" if errors else "")
        self.status.setText(self._done_text)

    def _set_breakdown(self, breakdown: dict[str, int], total: int, peft: bool = False) -> None:
        while self.grid.count():
            item = self.grid.takeAt(0)
            w = item.widget() if item is not None else None
            if w is not None:
                w.deleteLater()
        row = 0
        ordered = [c for c in ALL_CATEGORIES if breakdown.get(c)] + [
            c for c in breakdown if c not in ALL_CATEGORIES and breakdown.get(c)
        ]
        for cat in ordered:
            n = breakdown[cat]
            swatch = QLabel()
            swatch.setFixedSize(10, 10)
            swatch.setStyleSheet(f"background:{category_color(cat)}; border-radius:2px;")
            name = QLabel(category_label(cat, peft))
            name.setToolTip(category_meaning(cat))
            value = QLabel(format_bytes(n))
            value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            share = QLabel(f"{100.0 * n / total:.1f} %" if total else "")
            share.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            share.setObjectName("Dim")
            self.grid.addWidget(swatch, row, 0)
            self.grid.addWidget(name, row, 1)
            self.grid.addWidget(value, row, 2)
            self.grid.addWidget(share, row, 3)
            for w in (swatch, name, value, share):
                self._dim(w)
            row += 1
        self.grid.setColumnStretch(1, 1)
