"""The loop behind `monitor` and `monitor --prometheus`: a snapshot every interval on a fixed schedule (a slow
sample does not push the later ones back), each one recorded and shown, until told to stop or the duration is up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from engine.monitor.recording import Recorder
from engine.monitor.snapshot import Snapshot

S = TypeVar("S", bound=Snapshot)


def watch(sample: Callable[[], S], recorders: Sequence[Recorder], show: Callable[[S], None], *, interval: float,
          duration: float | None, stop: Callable[[S], bool]) -> S:
    """Samples, records and shows until `stop(snapshot)` is true or the next sample would fall at or past
    `duration` seconds; returns the last snapshot. Ctrl+C (KeyboardInterrupt) passes through to the caller."""
    start = time.monotonic()
    next_at = start
    while True:
        snap = sample()
        for r in recorders:
            r.write(snap)
        show(snap)
        if stop(snap):
            return snap
        next_at += interval
        if duration is not None and next_at - start >= duration - 1e-9:
            return snap
        time.sleep(max(0.0, next_at - time.monotonic()))
