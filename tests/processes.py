"""Whether a test's child processes have ended (the app's engine worker, a plan's workers)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie (exited, not yet reaped by init) counts as ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def still_alive(pids: Sequence[int], seconds: float) -> list[int]:
    """The processes of `pids` that have not ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]
