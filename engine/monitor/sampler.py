"""A background thread that takes a snapshot every `interval` seconds into a ring buffer and a callback.

The source is anything with `sample() -> Snapshot | None` (None: a replay has ended) and `close()`; the
callback runs on the sampler thread, so a GUI must hand the snapshot over to its own thread (a queued signal)
rather than draw there.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from engine.core.errors import UserError

from .ringbuffer import HOUR_AT_1HZ, RingBuffer
from .samples import Snapshot

S = TypeVar("S", bound=Snapshot)  # the kind of snapshot a sampler takes (a fleet's FleetSnapshot, …)
S_co = TypeVar("S_co", bound=Snapshot, covariant=True)

MIN_INTERVAL_S = 0.1
DEFAULT_INTERVAL_S = 1.0


class SnapshotSource(Protocol[S_co]):
    """Where snapshots come from (NVML, a replayed recording, a Prometheus server)."""

    def sample(self) -> S_co | None: ...

    def close(self) -> None:
        """Release what the source holds (NVML's handle); a no-op for sources that hold nothing."""
        ...


MAX_INTERVAL_S = 86400.0  # time.sleep() overflows far above; a day between samples is already no monitor


def check_interval(interval: float) -> float:
    try:
        v = float(interval)
    except (TypeError, ValueError):
        raise UserError(f"interval {interval!r} is not a number of seconds; use e.g. 1 or 0.5") from None
    if not math.isfinite(v):
        raise UserError(f"interval {interval} is not a finite number of seconds; use e.g. 1 or 0.5")
    if v < MIN_INTERVAL_S:
        raise UserError(f"interval {interval} s is below the minimum; use {MIN_INTERVAL_S} s or more")
    if v > MAX_INTERVAL_S:
        raise UserError(f"interval {interval} s is more than a day; use at most {MAX_INTERVAL_S:g} s")
    return v


def capacity_for(interval: float, seconds: float = HOUR_AT_1HZ) -> int:
    """Buffer size that holds `seconds` of history at this interval (an hour by default)."""
    return max(1, int(math.ceil(seconds / interval)))


class Sampler(Generic[S]):
    """Samples `source` off the caller's thread. `stop()` returns once the thread has ended."""

    def __init__(
        self,
        source: SnapshotSource[S],
        callback: Callable[[S], None] | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        buffer: RingBuffer[S] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ):
        self.source = source
        self.callback = callback
        self.on_error = on_error
        self.on_end = on_end
        self._interval = check_interval(interval)
        self.buffer: RingBuffer[S] = buffer if buffer is not None else RingBuffer(capacity_for(self._interval))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    @property
    def interval(self) -> float:
        return self._interval

    def set_interval(self, interval: float) -> None:
        """Takes effect at once (the current wait is cut short); the buffer grows to keep an hour."""
        self._interval = check_interval(interval)
        need = capacity_for(self._interval)
        if need > self.buffer.capacity:
            self.buffer.resize(need)
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="vramscope-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        if t is None or not t.is_alive():
            self._thread = None  # else `running` stays true: the thread is stuck in a driver call

    def sample_now(self) -> S | None:
        """Take one sample on the calling thread (used by --once and by tests)."""
        snap = self.source.sample()
        if snap is not None:
            self._deliver(snap)
        return snap

    def _deliver(self, snap: S) -> None:
        self.samples += 1
        self.buffer.append(snap)
        if self.callback is not None:
            self.callback(snap)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                snap = self.source.sample()
            except Exception as e:  # a bug in a source must not kill the thread silently
                snap = None
                if self.on_error is not None:
                    self.on_error(e)
                else:
                    raise
            else:
                if snap is None:  # a replay reached its end
                    if self.on_end is not None:
                        self.on_end()
                    break
                self._deliver(snap)
            # fixed-rate schedule; after a stall (slow driver call) skip missed ticks instead of bursting
            next_at += self._interval
            now = time.monotonic()
            if next_at < now:
                next_at = now
            self._wake.clear()
            self._wake.wait(max(0.0, next_at - now))
            if self._wake.is_set() and not self._stop.is_set():
                next_at = time.monotonic()  # interval changed: restart the schedule from now
