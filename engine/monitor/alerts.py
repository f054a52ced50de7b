"""Alert logic over monitor snapshots: thresholds (memory, temperature, power) and leak detection.

A leak is a process whose GPU memory only grows — never shrinks — by a real amount across a whole window
(the seeds' "memory that keeps growing step after step, not because of the batch size").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.units import MIB, format_bytes

from .samples import GPU_OK, GpuSnapshot, Snapshot

OK, WARN, ALERT, NA = "ok", "warn", "alert", "na"


@dataclass(frozen=True)
class Thresholds:
    memory_warn: float = 0.80  # fraction of the GPU's total memory
    memory_alert: float = 0.95
    temp_warn_c: int = 80
    temp_alert_c: int = 90
    power_warn: float = 0.90  # fraction of the enforced power limit
    power_alert: float = 1.00
    leak_window_s: float = 60.0  # growth must span at least this long
    leak_min_growth_bytes: int = 256 * MIB
    leak_min_steps: int = 5  # separate increases, so one big allocation is not a leak

    def __post_init__(self) -> None:
        if not (0 < self.memory_warn <= self.memory_alert):
            raise ValueError("memory thresholds: need 0 < warn <= alert")
        if self.leak_window_s <= 0 or self.leak_min_steps < 1 or self.leak_min_growth_bytes < 0:
            raise ValueError("leak settings must be positive")


def level(value: float | None, warn: float, alert: float) -> str:
    if value is None:
        return NA
    if value >= alert:
        return ALERT
    if value >= warn:
        return WARN
    return OK


def memory_level(g: GpuSnapshot, th: Thresholds) -> str:
    return level(g.memory_fraction, th.memory_warn, th.memory_alert)


def temperature_level(g: GpuSnapshot, th: Thresholds) -> str:
    return level(g.temperature_c, th.temp_warn_c, th.temp_alert_c)


def power_level(g: GpuSnapshot, th: Thresholds) -> str:
    return level(g.power_fraction, th.power_warn, th.power_alert)


def is_leak(series: Sequence[tuple[float, int]], th: Thresholds) -> bool:
    """`series` = (time, bytes) oldest first, already cut to the window. True when memory never went down,
    rose at least `leak_min_steps` times, by `leak_min_growth_bytes` in all, over the whole window."""
    if len(series) < th.leak_min_steps + 1:
        return False
    if series[-1][0] - series[0][0] < th.leak_window_s * 0.95:  # tolerate sampling jitter at the edges
        return False
    steps = 0
    for (_, a), (_, b) in zip(series, series[1:], strict=False):
        if b < a:
            return False
        if b > a:
            steps += 1
    return steps >= th.leak_min_steps and series[-1][1] - series[0][1] >= th.leak_min_growth_bytes


@dataclass(frozen=True)
class Alert:
    kind: str  # "memory" | "leak" | "lost" | "xid" (a fleet GPU's last XID error is not 0)
    gpu_index: int
    time: float
    message: str
    pid: int | None = None

    @property
    def key(self) -> tuple[str, int, int | None]:
        return (self.kind, self.gpu_index, self.pid)


class AlertMonitor:
    """Feed it every snapshot; it returns the alerts that just started. `active` holds those still true."""

    def __init__(self, thresholds: Thresholds | None = None):
        self.thresholds = thresholds or Thresholds()
        self.active: dict[tuple[str, int, int | None], Alert] = {}
        self._series: dict[tuple[int, int], deque[tuple[float, int]]] = {}

    def set_thresholds(self, th: Thresholds) -> None:
        self.thresholds = th

    def reset(self) -> None:
        self.active.clear()
        self._series.clear()

    def update(self, snap: Snapshot) -> list[Alert]:
        th = self.thresholds
        now: dict[tuple[str, int, int | None], Alert] = {}
        seen: set[tuple[int, int]] = set()
        for g in snap.gpus:
            name = g.name or g.label
            if g.status != GPU_OK:
                a = Alert("lost", g.index, snap.time, f"{g.label} ({name}): {g.error or g.status}")
                now[a.key] = a
                continue
            frac = g.memory_fraction
            if frac is not None and frac >= th.memory_alert:
                a = Alert("memory", g.index, snap.time,
                          f"{g.label} ({name}) memory at {frac:.0%}: {format_bytes(g.memory_used or 0)} "
                          f"of {format_bytes(g.memory_total or 0)}")
                now[a.key] = a
            if g.xid_error:
                a = Alert("xid", g.index, snap.time, f"{g.label} ({name}) reported XID error {g.xid_error}")
                now[a.key] = a
            for p in g.processes:
                if p.used_bytes is None:
                    continue
                key = (g.index, p.pid)
                seen.add(key)
                s = self._series.setdefault(key, deque())
                if s and s[-1][0] >= snap.time:
                    s.clear()  # time went backwards (a new replay): start over
                s.append((snap.time, p.used_bytes))
                # keep one sample older than the window so the window is fully covered
                while len(s) > 2 and s[1][0] <= snap.time - th.leak_window_s:
                    s.popleft()
                if is_leak(list(s), th):
                    grew = s[-1][1] - s[0][1]
                    who = f"pid {p.pid}" + (f" ({p.command.split()[0]})" if p.command else "")
                    a = Alert("leak", g.index, snap.time,
                              f"{who} on {g.label} keeps growing: +{format_bytes(grew)} in "
                              f"{s[-1][0] - s[0][0]:.0f} s, never freed", pid=p.pid)
                    now[a.key] = a
        for key in list(self._series):
            if key not in seen:
                del self._series[key]  # the process ended (or stopped reporting)
        started = [a for k, a in now.items() if k not in self.active]
        # an alert that stays true keeps its first time, so the mark shows when it began
        self.active = {k: self.active.get(k, a) for k, a in now.items()}
        return started
