"""The live GPU monitor tab: `MonitorPanel` (cards, history, processes, alerts, record/replay, estimate overlay)."""

from .panel import MonitorPanel

__all__ = ["MonitorPanel"]
