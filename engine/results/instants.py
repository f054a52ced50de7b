"""The instants a step's GPU figures belong to: where live memory peaks in an event stream, and how an instant is
named for a user (its step, phase and module)."""

from __future__ import annotations

from collections.abc import Sequence

from .types import MemEvent


def instant_label(events: Sequence[MemEvent], index: int) -> str:
    """"step 2, forward, layers.3.mlp": the step, phase and module of the event at `index` (empty for no events)."""
    if not events:
        return ""
    e = events[min(max(index, 0), len(events) - 1)]
    return f"step {e.step + 1}, {e.phase}, {e.module or '(model)'}"


def live_peak_index(events: Sequence[MemEvent]) -> int:
    """The first event after which the live bytes are at their peak (0 for no events)."""
    live = peak = 0
    at = 0
    for i, e in enumerate(events):
        live += e.nbytes
        if live > peak:
            peak, at = live, i
    return at
