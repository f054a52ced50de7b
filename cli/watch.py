"""The loop behind `monitor`, `monitor --prometheus` and `monitor --serve-metrics`: a snapshot every interval on a
fixed schedule (a slow sample does not push the later ones back), each one recorded and shown, until told to stop
or the duration is up; the options they share, and how a watch ends (Ctrl+C or SIGTERM: normally, with the
recordings put in place and reported).
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

from engine.errors import UserError
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


def check_watch_options(duration: float | None, recordings: dict[str, str | None]) -> None:
    """--duration must be a positive, finite number of seconds; a recording's file name (by option) not empty."""
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise UserError(f"--duration {duration}: must be a positive, finite number of seconds "
                        "(leave it out to watch until Ctrl+C)")
    for opt, path in recordings.items():
        if path is not None and not path.strip():
            raise UserError("is an empty file name; give a path", where=opt)


class _Terminated(Exception):
    """SIGTERM arrived: the watch ends as Ctrl+C ends it."""


def _stop_on_sigterm() -> Callable[[], object]:
    """SIGTERM (`kill`, a service manager, `timeout`) raises _Terminated in the main thread; returns the undo."""
    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise _Terminated()

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (an embedding program): leave its handlers alone
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, old)


@contextmanager
def until_stopped(recorders: Sequence[Recorder], close: Callable[[], None] = lambda: None) -> Iterator[None]:
    """The block runs until it returns or Ctrl+C / SIGTERM ends it (normally, not as an error); then the recordings
    are put in place, `close` releases the sources, and each recording says how many samples it holds."""
    restore = _stop_on_sigterm()
    try:
        yield
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        restore()
        for r in recorders:
            r.close()
        close()
    for r in recorders:
        print(f"recorded {r.count} samples to {r.path}", file=sys.stderr)
