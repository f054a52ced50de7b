"""The PDF: Qt's own writer (QPdfWriter) paginating the report's HTML with QTextDocument, the app's charts painted
as vectors where the document reserved their place, and a running header and "page i of n" on every page.

No widget is involved — only QPdfWriter, QPainter and QTextDocument, which Qt allows outside the GUI thread — so
the whole export may run in a worker thread (a QGuiApplication must exist; `ensure_gui_application` makes one).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import cast

from PySide6.QtCore import QBuffer, QIODevice, QMarginsF, QPointF, QRectF, QSizeF, Qt, QUrl
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QImage,
    QPageLayout,
    QPageSize,
    QPainter,
    QPdfWriter,
    QPen,
    QTextBlock,
    QTextBlockFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextLine,
    QTextOption,
    QTextTable,
)

from engine.core.errors import Cancelled, UserError
from engine.core.progress import CancelToken, Progress
from render.painting import no_ligatures

from .content import ChartPainter, Facts, running_header
from .markup import report_markup

PAGE_SIZES = {"a4": QPageSize.PageSizeId.A4, "letter": QPageSize.PageSizeId.Letter}
DPI = 600  # layout resolution; everything stays vector, this only sets positioning precision
_MARGINS_MM = (18.0, 22.0, 18.0, 20.0)  # left, top, right, bottom; header and footer sit inside them
NAME_LINE_CHARS = (56, 48, 40, 32, 26, 20)  # the longest line of a module name, tried until the tables fit

def ensure_gui_application() -> QGuiApplication:
    """The Qt application that fonts and painting need. The app has its own; when there is none (the CLI, tests),
    a headless one: on Linux the offscreen platform, so a missing or unreachable display never matters."""
    app = QGuiApplication.instance()
    if app is not None:
        if not isinstance(app, QGuiApplication):  # fonts and painting need a GUI application, not a core one
            raise RuntimeError("a QCoreApplication exists: reports need a QGuiApplication (or QApplication)")
        return app
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("create the QApplication in the main thread before exporting a report")
    if not os.environ.get("QT_QPA_PLATFORM") and sys.platform.startswith("linux"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    # A QApplication, not a bare QGuiApplication: widgets created later in the same process (the app, tests)
    # need one, and Qt cannot upgrade the application object once it exists.
    from PySide6.QtWidgets import QApplication

    return QApplication(sys.argv[:1] or ["vramscope"])


def page_size_id(page: str) -> QPageSize.PageSizeId:
    key = str(page).lower()
    if key not in PAGE_SIZES:
        raise UserError(f"unknown page size '{page}'; choose one of: {', '.join(PAGE_SIZES)}")
    return PAGE_SIZES[key]


def text_width_px(page: str) -> float:
    """Width of the text column in CSS pixels (1/96 in), which sizes the charts."""
    size = QPageSize(page_size_id(page)).size(QPageSize.Unit.Millimeter)
    return (size.width() - _MARGINS_MM[0] - _MARGINS_MM[2]) / 25.4 * 96


def _widest_table(doc: QTextDocument) -> float:
    """The width of the document's widest table, laid out (Qt lets one pass the page's edge, where it is cut)."""
    layout = doc.documentLayout()
    widths = [layout.frameBoundingRect(f).width() for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]
    return max(widths, default=0.0)


def _cursor_x(line: QTextLine, pos: int) -> float:
    x = line.cursorToX(pos)  # (x, pos) in some PySide6 versions, x in others; the stubs say `object`
    return cast(float, x[0] if isinstance(x, tuple) else x)


def _chart_rects(doc: QTextDocument) -> list[tuple[str, QRectF]]:
    """Where the laid-out document put each <img src="chart:NAME"> placeholder, in document coordinates.

    (A custom QTextObjectInterface would be neater, but PySide6 cannot register one: Qt finds the interface with
    qobject_cast, which a Python subclass does not satisfy. So the document reserves the space with a transparent
    image and the chart is painted over it, page by page.)
    """
    out = []
    layout = doc.documentLayout()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.isImageFormat() and fmt.toImageFormat().name().startswith("chart:"):
                name = fmt.toImageFormat().name()[6:]
                rel = frag.position() - block.position()
                line = block.layout().lineForTextPosition(rel)
                br = layout.blockBoundingRect(block)
                x = _cursor_x(line, rel)
                w = _cursor_x(line, rel + 1) - x
                h = w * fmt.toImageFormat().height() / max(fmt.toImageFormat().width(), 1)
                # Images sit on the baseline: their top is the baseline minus their height.
                top = br.top() + line.y() + line.ascent() - h
                out.append((name, QRectF(br.left() + x, top, w, h)))
            it += 1
        block = block.next()
    return out


def _element_bottom(doc: QTextDocument, block: QTextBlock, page_height: float) -> tuple[float, QTextBlock]:
    """Bottom of what must not be parted from a heading above `block`, and the block after that element."""
    layout = doc.documentLayout()
    table = QTextCursor(block).currentTable()
    if table is not None:
        r = layout.frameBoundingRect(table)
        after = QTextCursor(table.lastCursorPosition())
        after.movePosition(QTextCursor.MoveOperation.NextBlock)
        if r.height() <= 0.6 * page_height:  # a short table stays whole on one page
            return r.bottom(), after.block()
        rows = max(table.rows(), 1)
        return r.top() + r.height() * min(rows, 3) / rows, after.block()
    r = layout.blockBoundingRect(block)
    lines = block.layout().lineCount()
    if "\ufffc" in block.text() or lines <= 2:
        return r.bottom(), block.next()
    return r.top() + block.layout().lineAt(1).rect().bottom(), block.next()


def _next_extent_bottom(doc: QTextDocument, heading: QTextBlock, page_height: float) -> float | None:
    """Bottom of what must stay on the heading's page: a chart or short table whole (with a short intro paragraph
    before it), else a long table's first rows or a paragraph's first two lines."""
    nb = heading.next()
    if not nb.isValid():
        return None
    bottom, after = _element_bottom(doc, nb, page_height)
    is_intro = QTextCursor(nb).currentTable() is None and "\ufffc" not in nb.text() and nb.layout().lineCount() <= 3
    if is_intro and after.isValid() and after.blockFormat().headingLevel() == 0:
        if QTextCursor(after).currentTable() is not None or "\ufffc" in after.text():
            bottom = max(bottom, _element_bottom(doc, after, page_height)[0])
    return bottom


def _heading_needs_break(doc: QTextDocument, block: QTextBlock, page_height: float) -> bool:
    r = doc.documentLayout().blockBoundingRect(block)
    top = r.top() + (block.layout().lineAt(0).y() if block.layout().lineCount() else 0)
    end = _next_extent_bottom(doc, block, page_height)
    return end is not None and int(top // page_height) != int((end - 1) // page_height)


def _row_extent(layout: QAbstractTextDocumentLayout, table: QTextTable, r: int) -> tuple[float, float] | None:
    tops: list[float] = []
    bottoms: list[float] = []
    for c in range(table.columns()):
        cell = table.cellAt(r, c)
        if cell.row() != r:  # part of a row span from above
            continue
        tops.append(layout.blockBoundingRect(cell.firstCursorPosition().block()).top())
        bottoms.append(layout.blockBoundingRect(cell.lastCursorPosition().block()).bottom())
    return (min(tops), max(bottoms)) if tops else None


def _first_line_heights(table: QTextTable, r: int) -> list[float]:
    out: list[float] = []
    for c in range(table.columns()):
        cell = table.cellAt(r, c)
        lay = cell.firstCursorPosition().block().layout()
        if cell.row() == r and lay is not None and lay.lineCount():
            out.append(lay.lineAt(0).height())
    return out


def _pad_row(table: QTextTable, r: int, *, top: float | None = None, bottom: float | None = None) -> None:
    """Extra padding (CSS px) on every cell of row r; its shading is dropped so no stray band shows at a page foot."""
    pad = table.format().cellPadding()
    for c in range(table.columns()):
        cell = table.cellAt(r, c)
        cf = cell.format().toTableCellFormat()
        if top is not None:
            cf.setTopPadding(pad + top)
        if bottom is not None:
            cf.setBottomPadding(pad + bottom)
        cf.clearBackground()
        cell.setFormat(cf)


def _keep_row_whole(doc: QTextDocument, table: QTextTable, r: int, page_height: float, px: float) -> bool:
    """If QTextDocument would split row r line by line across a page break, carry it whole to the next page."""
    layout = doc.documentLayout()
    ext = _row_extent(layout, table, r)

    def straddles(e: tuple[float, float] | None) -> bool:
        return (e is not None and int(e[0] // page_height) != int((e[1] - 1) // page_height)
                and e[1] - e[0] <= page_height / 2)

    if ext is None or not straddles(ext):
        return False
    page_top = (int(ext[0] // page_height) + 1) * page_height
    if r > table.format().headerRowCount():
        # Stretch the row above to the page foot: this row then starts the next page, under the repeated header.
        _pad_row(table, r - 1, bottom=(page_top - ext[0] + 1) / px)
        doc.pageCount()  # format changes are laid out lazily: force it before measuring again
        if not straddles(_row_extent(layout, table, r)):
            return True
        _pad_row(table, r - 1, bottom=0.0)
    # First body row: pad it until each cell's first line crosses the page foot, and Qt moves the row.
    first_line = min(_first_line_heights(table, r) or [0.0])
    _pad_row(table, r, top=(page_top - ext[0] - first_line + 1) / px)
    doc.pageCount()
    if straddles(_row_extent(layout, table, r)):
        _pad_row(table, r, top=(page_top - ext[0] + 1) / px)
        doc.pageCount()
    return True


def paginate(doc: QTextDocument, page_height: float) -> int:
    """One pass from the top: a heading that would end a page starts the next one with what follows it, and a
    table row that would be split across pages moves whole. Each fix only moves what is below it, so what has been
    checked stays right. Returns the number of fixes."""
    layout = doc.documentLayout()
    dev = layout.paintDevice()
    px = (dev.logicalDpiY() / 96.0) if dev is not None else 1.0  # paddings are CSS px, scaled to the device
    doc.pageCount()
    fixes = 0
    block = doc.begin()
    while block.isValid():
        table = QTextCursor(block).currentTable()
        if table is None:
            bf = block.blockFormat()
            if (
                bf.headingLevel() > 0
                and not (bf.pageBreakPolicy() & QTextFormat.PageBreakFlag.PageBreak_AlwaysBefore)
                and _heading_needs_break(doc, block, page_height)
            ):
                f = QTextBlockFormat(bf)
                f.setPageBreakPolicy(QTextFormat.PageBreakFlag.PageBreak_AlwaysBefore)
                QTextCursor(block).setBlockFormat(f)
                doc.pageCount()
                fixes += 1
        else:
            cell = table.cellAt(block.position())
            if (
                cell.isValid()
                and cell.column() == 0
                and cell.row() >= table.format().headerRowCount()
                and cell.firstCursorPosition().block().position() == block.position()
                and _keep_row_whole(doc, table, cell.row(), page_height, px)
            ):
                fixes += 1
        block = block.next()
    return fixes


def _qt_chart_tag(name: str, w: float, h: float) -> str:
    return f'<p align="center"><img src="chart:{name}" width="{int(w)}" height="{int(h)}" /></p>'


def render_pdf(
    facts: Facts,
    painters: dict[str, ChartPainter],
    *,
    page: str = "a4",
    progress: Progress | None = None,
    cancel: CancelToken | None = None,
) -> bytes:
    """The whole report as PDF bytes (nothing touches the disk here); `painters`: content.chart_painters.
    `cancel.is_set()` → engine Cancelled."""

    def tick(f: float, text: str) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        if progress is not None:
            progress(f, text)

    ensure_gui_application()
    tick(0.15, "laying out the report")
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QPdfWriter(buf)
    writer.setResolution(DPI)
    writer.setPageLayout(
        QPageLayout(QPageSize(page_size_id(page)), QPageLayout.Orientation.Portrait, QMarginsF(0, 0, 0, 0))
    )
    writer.setTitle(facts["title"])
    writer.setCreator(f"VRAMScope {facts['vramscope_version']}")

    mm = DPI / 25.4
    page_w, page_h = writer.width(), writer.height()
    ml, mt, mr, mb = (m * mm for m in _MARGINS_MM)
    body = QRectF(ml, mt, page_w - ml - mr, page_h - mt - mb)
    scale = DPI / 96.0

    doc = QTextDocument()
    doc.documentLayout().setPaintDevice(writer)
    font = no_ligatures(QFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.GeneralFont)))
    font.setPointSizeF(9.5)
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    # Lines break between words only: Qt's default also breaks inside a word that does not fit its cell
    # ("LlamaForCa|usalLM", "500.00 Mi|B"); a table column is as wide as its longest word instead.
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)
    doc.setDefaultTextOption(option)
    doc.setDefaultStyleSheet("h1 { font-size: 18pt; } h2 { font-size: 13pt; } h3 { font-size: 10.5pt; }")
    blank = QImage(1, 1, QImage.Format.Format_ARGB32)
    blank.fill(Qt.GlobalColor.transparent)
    for name in painters:
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(f"chart:{name}"), blank)
    doc.setPageSize(QSizeF(body.width(), body.height()))
    for name_chars in (None, *NAME_LINE_CHARS):  # module names broken only as far as the tables need to fit
        doc.setHtml(report_markup(facts, chart=_qt_chart_tag, text_width_px=body.width() / scale, browser=False,
                                  name_chars=name_chars))
        if _widest_table(doc) <= body.width() + 1:
            break
    paginate(doc, body.height())
    pages = doc.pageCount()
    charts = _chart_rects(doc)

    header = running_header(facts)
    date = facts["generated"][:10]
    painter = QPainter()
    if not painter.begin(writer):
        raise UserError("could not start the PDF writer")
    try:
        hfont = QFont(font)
        hfont.setPointSizeF(7.5)
        for i in range(pages):
            if i:
                writer.newPage()
            tick(0.2 + 0.7 * i / pages, f"page {i + 1} of {pages}")
            painter.setFont(hfont)
            painter.setPen(QColor("#5A5A5A"))
            top = QRectF(ml, mt - 12 * mm, body.width(), 6 * mm)
            painter.drawText(top, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom, header)
            painter.drawText(top, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom, date)
            painter.setPen(QPen(QColor("#BBBBBB"), 0.3 * mm))
            painter.drawLine(QPointF(ml, mt - 5 * mm), QPointF(ml + body.width(), mt - 5 * mm))
            painter.setPen(QColor("#5A5A5A"))
            foot = QRectF(ml, page_h - mb + 6 * mm, body.width(), 6 * mm)
            at_top = Qt.AlignmentFlag.AlignTop
            painter.drawText(foot, Qt.AlignmentFlag.AlignHCenter | at_top, f"Page {i + 1} of {pages}")
            painter.drawText(foot, Qt.AlignmentFlag.AlignRight | at_top, f"VRAMScope {facts['vramscope_version']}")

            painter.save()
            painter.translate(ml, mt - i * body.height())
            clip = QRectF(0, i * body.height(), body.width(), body.height())
            painter.setClipRect(clip)
            ctx = QAbstractTextDocumentLayout.PaintContext()
            ctx.clip = clip
            doc.documentLayout().draw(painter, ctx)
            for name, rect in charts:
                if rect.intersects(clip):
                    painters[name](painter, rect)
            painter.restore()
    finally:
        painter.end()
    buf.close()
    data = bytes(buf.data().data())
    # The document holds Qt objects of this thread: drop them here, not at interpreter exit.
    del doc, writer
    if not data.startswith(b"%PDF"):
        raise UserError("the PDF writer produced no output")
    tick(0.95, "saving")
    return data
