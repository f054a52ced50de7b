"""The app's chart widgets: the memory timeline and the breakdown donut (painted by render/)."""

from .donut import DonutChart
from .timeline import TimelineChart

__all__ = ["DonutChart", "TimelineChart"]
