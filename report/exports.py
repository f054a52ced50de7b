"""The three report exports — PDF, HTML, JSON — each written atomically from the same facts.

Threading: `build_report` paints with QPdfWriter/QPainter/QTextDocument only (no widgets), so the app may call it
from a worker thread; the engine work (the estimate) is done before, and painting a report takes well under a second.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QBuffer, QIODevice, QRect, QRectF, QSize
from PySide6.QtGui import QPainter
from PySide6.QtSvg import QSvgGenerator

from engine.core.progress import CancelToken, Progress
from engine.results.types import Estimate

from .content import ChartPainter, ReportContent, chart_painters, report_facts
from .markup import report_markup
from .pdf import ensure_gui_application, page_size_id, render_pdf, text_width_px
from .saving import check_target, write_atomic

if TYPE_CHECKING:  # typing_extensions: Unpack is in typing from Python 3.11
    from typing_extensions import Unpack

JSON_FORMAT = "vramscope-report/1"


def build_report(
    path: str | os.PathLike[str],
    est: Estimate,
    *,
    page: str = "a4",
    progress: Progress | None = None,
    cancel: CancelToken | None = None,
    **content: Unpack[ReportContent],
) -> None:
    """Write the PDF report of `est` to `path` (atomic). `content`: report_facts' keywords (recommendations,
    max_batch, measured, measured_against, gpu_snapshot, generated) — the same for every export.
    `progress(fraction, text)` is called as pages are drawn; `cancel` (anything with is_set(), e.g.
    threading.Event) stops it with engine.core.errors.Cancelled, writing nothing.

    Raises engine.core.errors.UserError for an unknown page size or a path that cannot be written (nothing is left
    behind).
    """
    page_size_id(page)
    target = check_target(path)
    if progress:
        progress(0.0, "collecting figures")
    facts = report_facts(est, **content)
    painters = chart_painters(est, content.get("measured"), content.get("measured_against"))
    data = render_pdf(facts, painters, page=page, progress=progress, cancel=cancel)
    write_atomic(target, data)
    if progress:
        progress(1.0, "done")


def _svg(paint: ChartPainter, w: float, h: float) -> str:
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    gen = QSvgGenerator()
    gen.setOutputDevice(buf)
    gen.setSize(QSize(int(w), int(h)))
    gen.setViewBox(QRect(0, 0, int(w), int(h)))
    gen.setResolution(96)
    p = QPainter(gen)
    paint(p, QRectF(0, 0, w, h))
    p.end()
    text = bytes(buf.data().data()).decode("utf-8")
    text = text[text.find("<svg"):]
    # Let the browser scale it to the column.
    return text.replace("<svg", '<svg style="max-width: 100%; height: auto;"', 1)


def export_html(
    path: str | os.PathLike[str], est: Estimate, *, page: str = "a4", **content: Unpack[ReportContent]
) -> None:
    """A self-contained HTML page with the same content as the PDF, charts as inline SVG (atomic write).
    `content`: report_facts' keywords."""
    target = check_target(path)
    ensure_gui_application()
    facts = report_facts(est, **content)
    painters = chart_painters(est, content.get("measured"), content.get("measured_against"))

    def chart(name: str, w: float, h: float) -> str:
        return f'<figure>{_svg(painters[name], w, h)}</figure>'

    html = report_markup(facts, chart=chart, text_width_px=text_width_px(page), browser=True)
    write_atomic(target, html.encode("utf-8"))


def report_json(est: Estimate, **content: Unpack[ReportContent]) -> dict[str, Any]:
    """The report's facts, the estimate and any measurement (`content`: report_facts' keywords)."""
    measured, against = content.get("measured"), content.get("measured_against")
    return {
        "format": JSON_FORMAT,
        "report": report_facts(est, **content),
        "estimate": est.to_json(),
        "measured": measured.to_json() if measured is not None else None,
        "measured_against": against.to_json() if against is not None else None,
    }


def export_json(
    path: str | os.PathLike[str], est: Estimate, *, page: str = "a4", **content: Unpack[ReportContent]
) -> None:
    """The report's facts plus the full Estimate as JSON (bytes as integers; atomic write). `page` is ignored;
    `content`: report_facts' keywords."""
    target = check_target(path)
    doc = report_json(est, **content)
    try:
        text = json.dumps(doc, indent=1, default=str)
    except ValueError as e:  # circular structure in a caller's snapshot
        from engine.core.errors import UserError

        raise UserError(f"cannot export JSON: {e}") from None
    write_atomic(target, text.encode("utf-8"))


__all__ = ["build_report", "export_html", "export_json", "report_json"]
