"""A ceiling on the memory a reader may take, raised as it reads: a file that asks for far more memory than its
size explains (a pickle's memo index of a billion, a list of a billion `None`s from a few kilobytes of gzip) is
stopped by a MemoryError at the allocation that would pass the ceiling, before the machine runs short.

Python cannot stop a C routine in the middle of one opcode (the unpickler's memo resize for `LONG_BINPUT
0x0fffffff` is one 2 GiB allocation), so the ceiling is the process's address-space limit (RLIMIT_AS), set above
what the process already maps, for the length of the read, and put back after. Linux only (macOS does not enforce
RLIMIT_AS; Windows has none): elsewhere the reader's own size caps remain the bound.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LINUX = sys.platform.startswith("linux")
_ONE_AT_A_TIME = threading.Lock()
if _LINUX:
    import resource


def _mapped_bytes() -> int | None:
    """The process's address space now (VmSize), None when it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _available_bytes() -> int | None:
    """MemAvailable: what can be taken without pushing the machine into swapping or the OOM killer."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class MemoryBudget:
    """The ceiling of one read: `allow(n)` lets the process map `n` more bytes than when the read began (never more
    than three quarters of the memory the machine had available then). `active` is False where no ceiling is set."""

    def __init__(self) -> None:
        self.active = False
        self._base = 0
        self._most = 0
        self._old: tuple[int, int] = (0, 0)
        self.allowed = 0

    def _start(self) -> None:
        # One ceiling at a time per process: a second read on another thread meanwhile reads without one (its
        # own caps still hold), rather than put back a limit the first one set, for ever.
        if not _LINUX or not _ONE_AT_A_TIME.acquire(blocking=False):
            return
        base = _mapped_bytes()
        if base is None:
            _ONE_AT_A_TIME.release()
            return
        avail = _available_bytes()
        self._old = resource.getrlimit(resource.RLIMIT_AS)
        soft, hard = self._old
        self._base = base
        self._most = (avail * 3 // 4) if avail is not None else 1 << 62
        if soft != resource.RLIM_INFINITY:
            self._most = min(self._most, max(0, soft - base))
        if hard != resource.RLIM_INFINITY:
            self._most = min(self._most, max(0, hard - base))
        self.active = True

    def allow(self, extra: int) -> None:
        """Let the read take up to `extra` bytes beyond what the process mapped at its start."""
        if not self.active:
            return
        extra = min(max(0, extra), self._most)
        if extra == self.allowed:
            return
        self.allowed = extra
        resource.setrlimit(resource.RLIMIT_AS, (self._base + extra, self._old[1]))

    def _stop(self) -> None:
        if self.active:
            resource.setrlimit(resource.RLIMIT_AS, self._old)
            self.active = False
            _ONE_AT_A_TIME.release()


@contextmanager
def memory_budget(initial: int) -> Iterator[MemoryBudget]:
    """A ceiling `initial` bytes above the process's present address space for the `with` block; the block raises
    it with `allow` as its input justifies more. The old limit is back when the block ends, however it ends."""
    budget = MemoryBudget()
    budget._start()
    try:
        budget.allow(initial)
        yield budget
    finally:
        budget._stop()
