"""How the results views word and colour engine figures: counts, shares, category names and colours."""

from __future__ import annotations

from engine.units import format_bytes

__all__ = ["format_bytes", "format_count", "format_share", "category_label", "category_color"]

# Fallback colours, used only while gui.charts.colors is missing (the charts own the real palette,
# so that the summary, the donut and the timeline agree).
_FALLBACK_COLORS = {
    "parameters": "#4e79a7",
    "buffers": "#a0cbe8",
    "gradients": "#f28e2b",
    "optimizer_state": "#e15759",
    "activations": "#59a14f",
    "temporaries": "#b6992d",
    "inputs": "#8cd17d",
    "allocator_overhead": "#bab0ac",
    "cuda_context": "#79706e",
    "workspace": "#d37295",
}


def format_count(n: int | float | None) -> str:
    """11689512 -> '11.69 M' (parameter counts, in decimal units as papers quote them)."""
    if n is None:
        return "—"
    v = float(n)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{int(v)}"


def format_share(x: float | None) -> str:
    return "—" if x is None else f"{100.0 * x:.1f} %"


def category_label(cat: str) -> str:
    """The charts' name for a category, so the summary, the donut and the timeline say the same."""
    try:
        from gui.charts.colors import category_label as charts_label
    except ImportError:
        return {"optimizer_state": "Optimizer state", "cuda_context": "CUDA context"}.get(
            cat, cat.replace("_", " ").capitalize())
    return charts_label(cat)


def category_color(cat: str) -> str:
    """Hex colour of a category: the charts' palette (light or dark to match the app), so views agree."""
    try:
        from gui.charts.colors import category_hex
    except ImportError:
        return _FALLBACK_COLORS.get(cat, "#888888")
    from PySide6.QtGui import QGuiApplication, QPalette

    pal = QGuiApplication.palette()
    dark = pal.color(QPalette.ColorRole.Window).lightnessF() < pal.color(QPalette.ColorRole.WindowText).lightnessF()
    return category_hex(cat, dark)
