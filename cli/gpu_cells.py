"""The cells the monitor's tables write for one GPU's figures, shared by this machine's table (cli/monitor.py) and a
fleet's (cli/fleet.py): "n/a" wherever the source does not give a figure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from engine.core.units import format_bytes
from engine.monitor.samples import GpuSnapshot

T = TypeVar("T")


def na(v: T | None, fmt: Callable[[T], str] = str) -> str:
    """`v` written by `fmt`, or "n/a" when it is not known."""
    return "n/a" if v is None else fmt(v)


def memory_cell(g: GpuSnapshot) -> str:
    """Memory used / total (the share used)."""
    if g.memory_used is not None and g.memory_total:
        return f"{format_bytes(g.memory_used)} / {format_bytes(g.memory_total)} ({g.memory_used / g.memory_total:.0%})"
    return "n/a"


def util_cell(g: GpuSnapshot) -> str:
    return na(g.util_gpu, lambda v: f"{v}%")


def temp_cell(g: GpuSnapshot) -> str:
    return na(g.temperature_c, lambda v: f"{v}°C")


def watts(mw: int) -> str:
    return f"{mw / 1000:.0f} W"
