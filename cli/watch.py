"""The loop behind `monitor`, `monitor --prometheus` and `monitor --serve-metrics`: a snapshot every interval on a
fixed schedule (a slow sample does not push the later ones back), each one recorded and shown, until told to stop
or the duration is up; the options they share, and how a watch ends (Ctrl+C or SIGTERM, wherever it lands: at the
next check, normally, with the recordings put in place and reported).
"""

from __future__ import annotations

import math
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

from cli.terminal import shown
from engine.core.errors import UserError
from engine.monitor.recording import Recorder
from engine.monitor.samples import Snapshot

S = TypeVar("S", bound=Snapshot)


def watch(sample: Callable[[], S], recorders: Sequence[Recorder], show: Callable[[S], None], *, interval: float,
          duration: float | None, stop: Callable[[S], bool], asked: StopRequest) -> S:
    """Samples, records and shows until `stop(snapshot)` is true, `asked` to stop (by Ctrl+C or SIGTERM, whenever
    it came: the sample it came in is still recorded) or the next sample would fall at or past `duration`
    seconds; returns the last snapshot."""
    start = time.monotonic()
    next_at = start
    while True:
        snap = sample()
        for r in recorders:
            r.write(snap)
        show(snap)
        if stop(snap) or asked.asked:
            return snap
        next_at += interval
        if duration is not None and next_at - start >= duration - 1e-9:
            return snap
        if asked.wait(max(0.0, next_at - time.monotonic())):
            return snap


def check_watch_options(duration: float | None, recordings: dict[str, str | None]) -> None:
    """--duration must be a positive, finite number of seconds; a recording's file name (by option) not empty."""
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise UserError(f"--duration {duration}: must be a positive, finite number of seconds "
                        "(leave it out to watch until Ctrl+C)")
    for opt, path in recordings.items():
        if path is not None and not path.strip():
            raise UserError("is an empty file name; give a path", where=opt)


class StopRequest:
    """Ctrl+C or SIGTERM during a watch. The handler only notes the signal: it raises nothing, so the code it lands
    in (an NVML call under a broad `except Exception`, a recording's write, a Prometheus query) runs to its end, and
    the watch ends at its next check (after the sample, or in its wait, which the signal wakes)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        # Python's C-level handler writes each signal's number here (signal.set_wakeup_fd) before the Python-level
        # one runs: a signal that comes just before select() starts still wakes it.
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)

    @property
    def asked(self) -> bool:
        return self.signal is not None

    def note(self, signum: int, _frame: FrameType | None = None) -> None:
        self.signal = signum

    def wait(self, seconds: float | None) -> bool:
        """Waits `seconds` (None: until asked), or less when asked to stop; True when asked."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.asked:  # the loop's back edge runs a pending Python-level handler before select() again
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ready, _, _ = select.select([self._wake_r], [], [], left)
            if ready:  # a signal's byte (ours, or another handled signal's: then the wait goes on)
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:  # BlockingIOError: drained
                    pass
        return self.asked

    def install(self) -> Callable[[], None]:
        """SIGINT and SIGTERM noted here instead of raising; returns the undo. Outside the main thread (an
        embedding program) its handlers are left alone, and wait() only times out."""
        try:
            old_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        except ValueError:
            return lambda: None
        old = {sig: signal.signal(sig, self.note) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, handler in old.items():
                if handler is not None:  # None: set outside Python (an embedding program), not ours to put back
                    signal.signal(sig, handler)
            signal.set_wakeup_fd(old_fd)
        return restore

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()


@contextmanager
def until_stopped(recorders: Sequence[Recorder], close: Callable[[], None] = lambda: None) -> Iterator[StopRequest]:
    """The block runs until it returns, checking the StopRequest it is given (Ctrl+C / SIGTERM ask it to end,
    normally, not as an error); then the recordings are put in place, `close` releases the sources, and each
    recording says how many samples it holds."""
    asked = StopRequest()
    restore = asked.install()
    try:
        yield asked
    finally:
        restore()
        asked.close()
        for r in recorders:
            r.close()
        close()
    for r in recorders:
        print(f"recorded {r.count} samples to {shown(r.path)}", file=sys.stderr)
