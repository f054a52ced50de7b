"""The layer palette: the engine's catalogue grouped and searchable; items drag onto the canvas with the
builder's MIME type, and a double-click (or Enter) asks to append the layer.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QLineEdit, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.sketch.catalogue import CATALOGUE, groups

from .canvas import LAYER_MIME, layer_mime
from .node_item import GROUP_COLOURS

TYPE_ROLE = Qt.ItemDataRole.UserRole + 1


def _swatch(colour: str) -> QIcon:
    pm = QPixmap(12, 12)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(QColor(colour))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawRoundedRect(1, 1, 10, 10, 3, 3)
    p.end()
    return QIcon(pm)


def _children(item: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    return [c for j in range(item.childCount()) if (c := item.child(j)) is not None]


class _LayerTree(QTreeWidget):
    def groups(self) -> list[QTreeWidgetItem]:
        """The top-level items: one per catalogue group, the layers as their children."""
        return [t for i in range(self.topLevelItemCount()) if (t := self.topLevelItem(i)) is not None]

    def supportedDropActions(self) -> Qt.DropAction:  # noqa: N802 - what a drag from here offers: copies only
        return Qt.DropAction.CopyAction

    def mimeTypes(self) -> list[str]:  # noqa: N802
        return [LAYER_MIME]

    def mimeData(self, items: Sequence[QTreeWidgetItem]) -> QMimeData:  # noqa: N802
        for it in items:
            name = it.data(0, TYPE_ROLE)
            if name:
                return layer_mime(name)
        return QMimeData()


class LayerPalette(QWidget):
    """Signals: layerActivated(str) — a layer double-clicked or chosen with Enter (append it)."""

    layerActivated = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Search layers…")
        self.filter_edit.setClearButtonEnabled(True)
        self.tree = _LayerTree(self)
        self.tree.setHeaderHidden(True)
        self.tree.setRootIsDecorated(True)
        self.tree.setDragEnabled(True)
        self.tree.setDragDropMode(QAbstractItemView.DragDropMode.DragOnly)
        self.tree.setDefaultDropAction(Qt.DropAction.CopyAction)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setUniformRowHeights(True)
        self.tree.setIndentation(14)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(4)
        lay.addWidget(self.filter_edit)
        lay.addWidget(self.tree)
        self._populate()
        self.filter_edit.textChanged.connect(self.set_filter)
        self.filter_edit.returnPressed.connect(self._activate_first_visible)
        self.tree.itemActivated.connect(self._on_activated)

    def _populate(self) -> None:
        self.tree.clear()
        for group, names in groups().items():
            top = QTreeWidgetItem([group])
            top.setFlags(Qt.ItemFlag.ItemIsEnabled)
            f = top.font(0)
            f.setBold(True)
            top.setFont(0, f)
            self.tree.addTopLevelItem(top)
            icon = _swatch(GROUP_COLOURS.get(group, "#6f7b84"))
            for name in names:
                lt = CATALOGUE[name]
                it = QTreeWidgetItem([name])
                it.setData(0, TYPE_ROLE, name)
                it.setIcon(0, icon)
                it.setToolTip(0, f"<b>{name}</b><br>{lt.description}<br><i>Drag onto the canvas, "
                                 "or double-click to append.</i>")
                it.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDragEnabled)
                top.addChild(it)
        self.tree.expandAll()

    def full_width(self) -> int:
        """The width that shows every layer name whole (icon, indentation, scroll bar and margins included)."""
        fm = self.tree.fontMetrics()
        text = max(fm.horizontalAdvance(n) for n in self.type_names())
        icon = self.tree.iconSize().width() if self.tree.iconSize().isValid() else 16
        bar = self.tree.verticalScrollBar().sizeHint().width()
        return text + icon + 2 * self.tree.indentation() + bar + 28

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.full_width(), super().sizeHint().height())

    def type_names(self, visible_only: bool = False) -> list[str]:
        out: list[str] = []
        for top in self.tree.groups():
            for it in _children(top):
                if not visible_only or not (it.isHidden() or top.isHidden()):
                    out.append(it.data(0, TYPE_ROLE))
        return out

    def item_for(self, type_name: str) -> QTreeWidgetItem | None:
        for top in self.tree.groups():
            for it in _children(top):
                if it.data(0, TYPE_ROLE) == type_name:
                    return it
        return None

    def set_filter(self, text: str) -> None:
        """Show layers whose name, group or description contains every word typed."""
        words = text.lower().split()
        for top in self.tree.groups():
            group = top.text(0).lower()
            any_visible = False
            for it in _children(top):
                name: str = it.data(0, TYPE_ROLE)
                hay = f"{name.lower()} {group} {CATALOGUE[name].description.lower()}"
                show = all(w in hay for w in words)
                it.setHidden(not show)
                any_visible |= show
            top.setHidden(not any_visible)
        if self.filter_edit.text() != text:
            self.filter_edit.setText(text)

    def mime_for(self, type_name: str) -> QMimeData:
        """What dragging `type_name` carries (the same as a real drag from the tree)."""
        item = self.item_for(type_name)
        return self.tree.mimeData([item]) if item is not None else layer_mime(type_name)

    def _activate_first_visible(self) -> None:
        names = self.type_names(visible_only=True)
        if names:
            self.layerActivated.emit(names[0])

    def _on_activated(self, item: QTreeWidgetItem, _col: int) -> None:
        name = item.data(0, TYPE_ROLE)
        if name:
            self.layerActivated.emit(name)
