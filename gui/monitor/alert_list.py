"""The alerts pane shared by the GPU monitor and the fleet view: a labelled list of alerts, newest first, holding
at most MAX_ALERTS lines (a week-long session must not grow without bound)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from PySide6.QtWidgets import QLabel, QListWidget, QVBoxLayout, QWidget

from engine.monitor.alerts import Alert

MAX_ALERTS = 500


def _line(a: Alert) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(a.time))}  {a.message}"


class AlertList(QListWidget):
    """One line per alert, `HH:MM:SS  message`, newest at the top."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWordWrap(True)

    def prepend(self, a: Alert) -> None:
        """A new alert on top; the oldest line goes beyond MAX_ALERTS."""
        self.insertItem(0, _line(a))
        while self.count() > MAX_ALERTS:
            self.takeItem(self.count() - 1)

    def fill(self, alerts: Sequence[Alert]) -> None:
        """The list replaced by `alerts` (oldest first), the latest MAX_ALERTS of them, newest on top."""
        self.clear()
        for a in reversed(alerts[-MAX_ALERTS:]):
            self.addItem(_line(a))


def labelled(alert_list: AlertList) -> QWidget:
    """The list under its "Alerts" heading."""
    box = QWidget()
    lay = QVBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(QLabel("Alerts"))
    lay.addWidget(alert_list)
    return box
