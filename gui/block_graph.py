"""A built-in or loaded model drawn as a graph of its blocks (engine.results.module_groups.blocks): repeated blocks
folded into one (`layers.0–31 ×32`), each with its parameters and its memory at the peak; click a block with sub-blocks
to expand it. Read-only: the builder cannot express these models."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QMouseEvent, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsScene, QGraphicsView, QStyleOptionGraphicsItem, QWidget

from engine.core.units import format_bytes
from engine.results.module_groups import Block

from .results.formatting import format_count

BOX_W, BOX_H, GAP, INDENT = 340.0, 58.0, 18.0, 40.0


class BlockItem(QGraphicsItem):
    """One block: its name (×count), type, parameters and memory; a ▸/▾ when it has sub-blocks."""

    def __init__(self, block: Block, share: float | None, expanded: bool):
        super().__init__()
        self.block, self.share, self.expanded = block, share, expanded
        self.setCursor(Qt.CursorShape.PointingHandCursor if block.children else Qt.CursorShape.ArrowCursor)
        self.setToolTip(f"{block.label} ({block.type})\n{block.parameters:,} parameters"
                        + (f"\n{format_bytes(block.bytes_at_peak)} at the peak" if block.bytes_at_peak is not None
                           else ""))

    def boundingRect(self) -> QRectF:  # noqa: N802
        return QRectF(0, 0, BOX_W, BOX_H)

    def paint(self, p: QPainter, _opt: QStyleOptionGraphicsItem, _w: QWidget | None = None) -> None:
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        folded = self.block.count > 1
        p.setPen(QPen(QColor("#8a94a3"), 1.2))
        p.setBrush(QBrush(QColor("#eef3fb" if folded else "#ffffff")))
        p.drawRoundedRect(self.boundingRect(), 7, 7)
        if self.share is not None and self.share > 0:  # a bar along the bottom: its share of the model's memory
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QColor("#3a78b8"))
            p.drawRoundedRect(QRectF(4, BOX_H - 7, (BOX_W - 8) * min(self.share, 1.0), 4), 2, 2)
        title = QFont(p.font())
        title.setPointSizeF(10.5)
        title.setBold(True)
        body = QFont(p.font())
        body.setPointSizeF(10.0)
        p.setPen(QColor("#1a1a1a"))
        p.setFont(title)
        mark = ("▾ " if self.expanded else "▸ ") if self.block.children else ""
        name = p.fontMetrics().elidedText(mark + self.block.label, Qt.TextElideMode.ElideMiddle, int(BOX_W - 110))
        p.drawText(QRectF(10, 5, BOX_W - 110, 22), Qt.AlignmentFlag.AlignVCenter, name)
        p.setFont(body)
        mem = "—" if self.block.bytes_at_peak is None else format_bytes(self.block.bytes_at_peak)
        p.drawText(QRectF(BOX_W - 105, 5, 95, 22), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, mem)
        p.setPen(QColor("#3d4450"))
        p.drawText(QRectF(10, 27, BOX_W - 20, 20), Qt.AlignmentFlag.AlignVCenter,
                   f"{self.block.type} · {format_count(self.block.parameters)} params")


class BlockGraph(QGraphicsView):
    """The blocks top to bottom in forward order, joined by arrows. `blockClicked(name)` on a click."""

    blockClicked = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self._blocks: list[Block] = []
        self._expanded: set[str] = set()
        self.items_by_name: dict[str, BlockItem] = {}

    def set_blocks(self, blocks: list[Block]) -> None:
        keep = {b.name for b in blocks}
        self._expanded &= keep | {c.name for b in blocks for c in b.children}
        self._blocks = list(blocks)
        self._layout()

    def toggle(self, name: str) -> None:
        self._expanded ^= {name}
        self._layout()

    def _layout(self) -> None:
        scene = self.scene()
        scene.clear()
        self.items_by_name = {}
        total = sum(b.bytes_at_peak or 0 for b in self._blocks) or None
        y = 0.0
        prev: QPointF | None = None
        pen = QPen(QColor("#8a94a3"), 1.4)

        def place(block: Block, x: float) -> None:
            nonlocal y, prev
            expanded = block.name in self._expanded
            share = (block.bytes_at_peak or 0) / total if total else None
            item = BlockItem(block, share, expanded)
            item.setPos(x, y)
            scene.addItem(item)
            self.items_by_name[block.name] = item
            top = QPointF(x + BOX_W / 2, y)
            if prev is not None:
                scene.addLine(prev.x(), prev.y(), top.x(), top.y(), pen)
            prev = QPointF(x + BOX_W / 2, y + BOX_H)
            y += BOX_H + GAP
            if expanded:
                for child in block.children:
                    place(child, x + INDENT)

        for b in self._blocks:
            place(b, 0.0)
        scene.setSceneRect(scene.itemsBoundingRect().adjusted(-20, -20, 20, 20))

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        item = self.itemAt(event.position().toPoint())
        if isinstance(item, BlockItem):
            if item.block.children:
                self.toggle(item.block.name)
            self.blockClicked.emit(item.block.name)
            event.accept()
            return
        super().mousePressEvent(event)
