"""One card per GPU: memory bar (used vs total, reserve marked, estimate tick), utilization, temperature, power,
fan, clocks, PCIe, MIG slices, a plain status when the GPU is lost, and alert marks. Colours follow thresholds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from engine.core.units import format_bytes
from engine.monitor.alerts import Alert, Thresholds, memory_level, power_level, temperature_level
from engine.monitor.samples import GpuSnapshot

LEVEL_COLOURS = {"ok": "#2e9d4f", "warn": "#e69500", "alert": "#d43c3c", "na": "#8a8a8a"}


class MemoryBar(QWidget):
    """Used memory over total; the driver's reserve drawn hatched at the start; an estimate as a tick."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.used: int | None = None
        self.total: int | None = None
        self.reserved: int | None = None
        self.colour = LEVEL_COLOURS["na"]
        self.mark: int | None = None  # predicted peak of the overlaid estimate

    def set_values(self, used: int | None, total: int | None, reserved: int | None, level: str,
                   mark: int | None = None) -> None:
        self.used, self.total, self.reserved, self.mark = used, total, reserved, mark
        self.colour = LEVEL_COLOURS.get(level, LEVEL_COLOURS["na"])
        self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(QPen(QColor("#666")))
        p.setBrush(QColor("#eeeeee"))
        p.drawRect(r)
        if self.total:
            w = r.width()
            x = r.left()
            if self.reserved:
                rw = w * min(1.0, self.reserved / self.total)
                p.setBrush(QColor("#b0b0b0"))
                p.setPen(Qt.PenStyle.NoPen)
                p.drawRect(QRectF(x, r.top(), rw, r.height()))
                p.setBrush(Qt.BrushStyle.BDiagPattern)
                p.drawRect(QRectF(x, r.top(), rw, r.height()))
                x += rw
            if self.used:
                uw = w * min(1.0, self.used / self.total)
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(QColor(self.colour))
                p.drawRect(QRectF(x, r.top(), min(uw, r.right() - x), r.height()))
            if self.mark is not None:
                mx = r.left() + w * min(1.0, self.mark / self.total)
                p.setPen(QPen(QColor("#1f4fd1"), 2, Qt.PenStyle.DashLine))
                p.drawLine(int(mx), int(r.top()), int(mx), int(r.bottom()))
        p.end()


_T = TypeVar("_T")


def _na(v: _T | None, fmt: Callable[[_T], str]) -> str:
    return "n/a" if v is None else fmt(v)


def _coloured(text: str, level: str) -> str:
    return f'<span style="color:{LEVEL_COLOURS.get(level, "#000")}; font-weight:600">{text}</span>'


class GpuCard(QFrame):
    """Shows one GpuSnapshot. Labels are attributes so the panel's tests read what the user reads."""

    def __init__(self, index: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMinimumWidth(300)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(2)
        self.title = QLabel(f"GPU {index}")
        self.title.setStyleSheet("font-weight: 700")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setStyleSheet(f"color: {LEVEL_COLOURS['alert']}; font-weight: 600")
        self.bar = MemoryBar()
        self.memory = QLabel()
        self.util = QLabel()
        self.thermal = QLabel()
        self.thermal.setTextFormat(Qt.TextFormat.RichText)
        self.details = QLabel()
        self.details.setStyleSheet("color: #555")
        self.mig = QLabel()
        self.mig.setWordWrap(True)
        self.overlay = QLabel()
        self.overlay.setWordWrap(True)
        self.alert = QLabel()
        self.alert.setWordWrap(True)
        self.alert.setStyleSheet(f"color: {LEVEL_COLOURS['alert']}")
        for w in (self.title, self.status, self.bar, self.memory, self.util, self.thermal, self.details, self.mig,
                  self.overlay, self.alert):
            lay.addWidget(w)
        self.memory.setTextFormat(Qt.TextFormat.RichText)
        self.snapshot: GpuSnapshot | None = None

    def show_gpu(self, g: GpuSnapshot, th: Thresholds, alerts: Sequence[Alert] = (),
                 overlay: tuple[str, int] | None = None) -> None:
        self.snapshot = g
        self.title.setText(f"GPU {g.index} · {g.name or 'unknown'}")
        self.title.setToolTip(g.uuid or "")
        lost = not g.ok
        self.status.setVisible(lost)
        if lost:
            word = "GPU lost" if g.status == "lost" else "GPU not readable"
            self.status.setText(f"{word}: {g.error or g.status}")
        for w in (self.bar, self.memory, self.util, self.thermal, self.details):
            w.setVisible(not lost)
        mem_level = memory_level(g, th)
        mark = overlay[1] if overlay else None
        self.bar.set_values(g.memory_used, g.memory_total, g.memory_reserved, mem_level, mark)
        if g.memory_used is not None and g.memory_total:
            text = (f"{format_bytes(g.memory_used)} / {format_bytes(g.memory_total)} "
                    f"({g.memory_used / g.memory_total:.0%})")
            mem = _coloured(text, mem_level)
        else:
            mem = "memory n/a"
        resv = g.memory_reserved
        mem += f" · reserved {format_bytes(resv)}" if resv is not None else " · reserved n/a"
        self.memory.setText(mem)
        self.memory.setToolTip(self._why(g, "memory_used", "memory_reserved"))
        self.util.setText(f"utilization GPU {_na(g.util_gpu, lambda v: f'{v}%')} · "
                          f"memory {_na(g.util_memory, lambda v: f'{v}%')}")
        self.util.setToolTip(self._why(g, "util_gpu"))
        temp = _coloured(_na(g.temperature_c, lambda v: f"{v} °C"), temperature_level(g, th))
        if g.power_mw is not None:
            ptext = f"{g.power_mw / 1000:.0f} W" + (f" / {g.power_limit_mw / 1000:.0f} W" if g.power_limit_mw else "")
        else:
            ptext = "power n/a"
        self.thermal.setText(f"{temp} · {_coloured(ptext, power_level(g, th))} · "
                             f"fan {_na(g.fan_percent, lambda v: f'{v}%')}")
        self.thermal.setToolTip(self._why(g, "temperature_c", "power_mw", "fan_percent"))

        def rate(kbs: int | None) -> str:
            return _na(kbs, lambda v: format_bytes(v * 1024) + "/s")

        self.details.setText(f"SM {_na(g.clock_sm_mhz, lambda v: f'{v} MHz')} · "
                             f"mem {_na(g.clock_mem_mhz, lambda v: f'{v} MHz')} · "
                             f"PCIe TX {rate(g.pcie_tx_kbs)} RX {rate(g.pcie_rx_kbs)}")
        self.details.setToolTip(self._why(g, "clock_sm_mhz", "pcie_tx_kbs"))
        self.mig.setVisible(bool(g.mig_mode))
        if g.mig_mode:
            parts = [f"{m.index}: {_na(m.memory_used, format_bytes)} / {_na(m.memory_total, format_bytes)}"
                     for m in g.mig_devices]
            self.mig.setText(f"MIG on, {len(g.mig_devices)} slice(s): " + ("; ".join(parts) or "none created"))
        self._show_overlay(g, overlay)
        self.alert.setVisible(bool(alerts))
        self.alert.setText("\n".join(f"⚠ {a.message}" for a in alerts))

    def _show_overlay(self, g: GpuSnapshot, overlay: tuple[str, int] | None) -> None:
        self.overlay.setVisible(overlay is not None and g.ok)
        if overlay is None:
            return
        name, need = overlay
        if g.memory_free is None:
            self.overlay.setText(f"{name} needs {format_bytes(need)}; this GPU's free memory is n/a")
            return
        verdict = ("fits" if need <= g.memory_free
                   else f"short by {format_bytes(need - g.memory_free)}")
        colour = LEVEL_COLOURS["ok"] if need <= g.memory_free else LEVEL_COLOURS["alert"]
        self.overlay.setText(f"{name} needs {format_bytes(need)}, this GPU has {format_bytes(g.memory_free)} free: "
                             f"{verdict}")
        self.overlay.setStyleSheet(f"color: {colour}")

    @staticmethod
    def _why(g: GpuSnapshot, *names: str) -> str:
        reasons = [f"{n}: {g.why_unavailable(n)}" for n in names if g.why_unavailable(n)]
        return "\n".join(f"n/a — {r}" for r in reasons)
