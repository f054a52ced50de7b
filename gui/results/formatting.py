"""How the results views word and colour engine figures: counts, shares, category names and colours."""

from __future__ import annotations

from PySide6.QtGui import QGuiApplication

from engine.core.units import format_bytes, format_count
from render.colors import category_hex, category_label, is_dark_palette

__all__ = ["format_bytes", "format_count", "format_share", "category_label", "category_color"]


def format_share(x: float | None) -> str:
    return "—" if x is None else f"{100.0 * x:.1f} %"


def category_color(cat: str) -> str:
    """Hex colour of a category: the charts' palette (light or dark to match the app), so views agree."""
    return category_hex(cat, is_dark_palette(QGuiApplication.palette()))
