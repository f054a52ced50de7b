"""How the results views word and colour engine figures: counts, shares, category names and colours."""

from __future__ import annotations

import math
from decimal import Decimal

from PySide6.QtGui import QGuiApplication

from engine.units import format_bytes
from render.colors import category_hex, category_label, is_dark_palette

__all__ = ["format_bytes", "format_count", "format_share", "category_label", "category_color"]


def format_count(n: int | float | None) -> str:
    """11689512 -> '11.69 M' (parameter counts, in decimal units as papers quote them)."""
    if n is None:
        return "—"
    try:
        v = float(n)
    except OverflowError:  # a count beyond a float (a sketch field of 400 digits): never raise while painting
        return f"{Decimal(n) / Decimal(10**9):.2e} B"
    if not math.isfinite(v):
        return "—"
    if abs(v) >= 1e15:
        return f"{v / 1e9:.2e} B"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{int(v)}"


def format_share(x: float | None) -> str:
    return "—" if x is None else f"{100.0 * x:.1f} %"


def category_color(cat: str) -> str:
    """Hex colour of a category: the charts' palette (light or dark to match the app), so views agree."""
    return category_hex(cat, is_dark_palette(QGuiApplication.palette()))
