"""The charts the app and the PDF report share: the memory timeline, the breakdown donut and the category colours."""

from .colors import CATEGORY_COLORS, CATEGORY_COLORS_DARK, DARK, LIGHT, ChartTheme, category_color, category_hex
from .donut import DonutChart, paint_donut
from .timeline import TimelineChart, paint_timeline

__all__ = [
    "CATEGORY_COLORS",
    "CATEGORY_COLORS_DARK",
    "ChartTheme",
    "DARK",
    "LIGHT",
    "DonutChart",
    "TimelineChart",
    "category_color",
    "category_hex",
    "paint_donut",
    "paint_timeline",
]
