"""The window's tabs: the builder, the GPU monitor (loaded when first shown: pyqtgraph is not a start-up cost) and a
fleet tab per Prometheus server added from the Monitor menu; each tab keeps its own dock layout (the monitor has
the window to itself, the builder gets its configuration and results docks back as they were)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtWidgets import QDockWidget, QFrame, QLabel, QMainWindow, QScrollArea, QTabWidget, QWidget

from engine.results.types import Estimate

from .workspace import Workspace

if TYPE_CHECKING:  # the monitor's modules (and pyqtgraph) load when first used, not at start-up
    from .monitor.fleet_panel import FleetPanel
    from .monitor.panel import MonitorPanel

BUILDER, MONITOR = 0, 1


class MainTabs(QTabWidget):
    """`window`'s central widget; `docks` are hidden on the monitor's tab the first time it shows."""

    def __init__(self, window: QMainWindow, builder_page: QWidget, docks: list[QDockWidget], ws: Workspace,
                 settings: QSettings):
        super().__init__()
        self.setObjectName("MainTabs")
        self.setDocumentMode(True)
        self.window_, self.docks, self.ws, self.settings = window, docks, ws, settings
        self.monitor: MonitorPanel | None = None
        self.fleet_panels: list[FleetPanel] = []  # Monitor ▸ Add Prometheus server… tabs
        self.monitor_placeholder = QLabel("The GPU monitor opens here.")
        self.monitor_placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.monitor_placeholder.setObjectName("Dim")
        self.addTab(builder_page, "Builder")
        self.addTab(self.monitor_placeholder, "Monitor")
        self.states: dict[int, QByteArray] = {}  # each tab's dock layout (QMainWindow.saveState)
        self.shown = BUILDER
        self.currentChanged.connect(self._changed)
        ws.traced.connect(self._estimate)

    # ---- dock layouts, per tab and in the settings
    def restore_states(self) -> None:
        state = self.settings.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.window_.restoreState(state)
        monitor_state = self.settings.value("window/state/monitor")
        if isinstance(monitor_state, QByteArray) and not monitor_state.isEmpty():
            self.states[MONITOR] = monitor_state

    def save_states(self) -> None:
        self.states[self.shown] = self.window_.saveState()
        self.settings.setValue("window/state", self.states.get(BUILDER, self.window_.saveState()))  # opens there
        if MONITOR in self.states:
            self.settings.setValue("window/state/monitor", self.states[MONITOR])

    def _changed(self, index: int) -> None:
        self.states[self.shown] = self.window_.saveState()
        self.shown = index
        if index == MONITOR and self.monitor is None:
            self._load_monitor()
        state = self.states.get(index)
        if state is not None and not state.isEmpty():
            self.window_.restoreState(state)
        elif index == MONITOR:
            for dock in self.docks:
                dock.hide()

    # ---- the monitor
    def _load_monitor(self) -> None:
        from .monitor import MonitorPanel  # pyqtgraph loads when the tab is first shown, not at start-up

        panel = MonitorPanel()  # without NVML or a GPU it says so itself
        self.monitor = panel
        # In a scroll area: the monitor's minimum height (four readable plots) then counts only on its own tab,
        # instead of growing the window under the builder and its docks.
        room = QScrollArea()
        room.setObjectName("MonitorRoom")
        room.setWidget(panel)
        room.setWidgetResizable(True)
        room.setFrameShape(QFrame.Shape.NoFrame)
        self.blockSignals(True)
        self.removeTab(MONITOR)
        self.insertTab(MONITOR, room, "Monitor")
        self.setCurrentIndex(MONITOR)
        self.blockSignals(False)
        if self.ws.estimate is not None:
            panel.set_estimate(self.ws.estimate)

    def _estimate(self, est: Estimate) -> None:
        if self.monitor is not None:
            self.monitor.set_estimate(est)  # "your model needs X" on the memory plot

    def gpu_snapshot(self) -> dict[str, Any] | None:
        """The GPUs as the monitor last saw them live, for a report (None before the monitor opens)."""
        return self.monitor.report_snapshot() if self.monitor is not None else None

    # ---- fleet tabs
    def add_prometheus_server(self) -> None:
        """Monitor ▸ Add Prometheus server…: a fleet tab reading that server (gui/monitor/fleet_panel.py)."""
        from .monitor.fleet_panel import ask_for_server

        panel = ask_for_server(self.settings, self.window_)
        if panel is None:
            return
        self.fleet_panels.append(panel)
        self.setCurrentIndex(self.addTab(panel, f"Fleet · {panel.source.server.split('://')[-1]}"))
        panel.closeRequested.connect(lambda: self._close_fleet(panel))

    def _close_fleet(self, panel: FleetPanel) -> None:
        panel.shutdown()
        self.removeTab(self.indexOf(panel))
        self.fleet_panels.remove(panel)
        panel.deleteLater()

    def shutdown(self) -> None:
        if self.monitor is not None:
            self.monitor.shutdown()  # the sampler thread ends with the window
        for panel in list(self.fleet_panels):
            panel.shutdown()
