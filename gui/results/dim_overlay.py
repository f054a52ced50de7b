"""A translucent veil over a widget, for figures that are of an older version (the results while a sketch does not
build). Painted on top rather than through a QGraphicsOpacityEffect, which renders a table's viewport dark, with
rows of the old picture showing through the new."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent
from PySide6.QtWidgets import QWidget

VEIL = QColor(255, 255, 255, 140)  # the window's white over what is shown: dimmed, still readable


class DimOverlay(QWidget):
    """Covers its parent exactly (following its resizes); clicks and keys go through to what is under it."""

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        parent.installEventFilter(self)
        self.hide()

    def set_dimmed(self, dimmed: bool) -> None:
        if dimmed:
            self._cover()
            self.show()
            self.raise_()
        else:
            self.hide()

    def _cover(self) -> None:
        parent = self.parentWidget()
        if parent is not None:
            self.setGeometry(parent.rect())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt naming)
        if watched is self.parentWidget() and event.type() in (QEvent.Type.Resize, QEvent.Type.ChildAdded):
            self._cover()
            if self.isVisible():
                self.raise_()  # above a tab page added or shown later
        return super().eventFilter(watched, event)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt naming)
        QPainter(self).fillRect(self.rect(), VEIL)
