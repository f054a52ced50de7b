"""The thresholds dialog: when card colours turn and alerts fire (memory, temperature, power, leak)."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from engine.core.units import MIB
from engine.monitor.alerts import Thresholds


class ThresholdsDialog(QDialog):
    def __init__(self, th: Thresholds, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Monitor thresholds")
        form = QFormLayout(self)

        def pct(v: float) -> QSpinBox:
            s = QSpinBox()
            s.setRange(1, 100)
            s.setSuffix(" %")
            s.setValue(round(v * 100))
            return s

        def num(v: float, lo: int, hi: int, suffix: str) -> QSpinBox:
            s = QSpinBox()
            s.setRange(lo, hi)
            s.setSuffix(suffix)
            s.setValue(int(v))
            return s

        self.mem_warn, self.mem_alert = pct(th.memory_warn), pct(th.memory_alert)
        self.temp_warn, self.temp_alert = num(th.temp_warn_c, 20, 120, " °C"), num(th.temp_alert_c, 20, 120, " °C")
        self.power_warn, self.power_alert = pct(th.power_warn), pct(min(th.power_alert, 1.0))
        self.leak_window = QDoubleSpinBox()
        self.leak_window.setRange(5, 3600)
        self.leak_window.setSuffix(" s")
        self.leak_window.setValue(th.leak_window_s)
        self.leak_growth = num(th.leak_min_growth_bytes // MIB, 1, 1 << 20, " MiB")
        self.leak_steps = num(th.leak_min_steps, 1, 1000, " increases")
        form.addRow("Memory: warn at", self.mem_warn)
        form.addRow("Memory: alert at", self.mem_alert)
        form.addRow("Temperature: warn at", self.temp_warn)
        form.addRow("Temperature: alert at", self.temp_alert)
        form.addRow("Power (of limit): warn at", self.power_warn)
        form.addRow("Power (of limit): alert at", self.power_alert)
        form.addRow("Leak: growth over", self.leak_window)
        form.addRow("Leak: at least", self.leak_growth)
        form.addRow("Leak: in at least", self.leak_steps)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self._base = th

    def thresholds(self) -> Thresholds:
        """The values entered; a warn level above its alert level is lowered to it."""
        mw, ma = self.mem_warn.value() / 100, self.mem_alert.value() / 100
        tw, ta = self.temp_warn.value(), self.temp_alert.value()
        pw, pa = self.power_warn.value() / 100, self.power_alert.value() / 100
        return replace(
            self._base,
            memory_warn=min(mw, ma), memory_alert=ma,
            temp_warn_c=min(tw, ta), temp_alert_c=ta,
            power_warn=min(pw, pa), power_alert=pa,
            leak_window_s=self.leak_window.value(),
            leak_min_growth_bytes=self.leak_growth.value() * MIB,
            leak_min_steps=self.leak_steps.value(),
        )
