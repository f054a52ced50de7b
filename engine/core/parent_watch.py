"""A worker process that ends with its parent: the app's engine process (engine.jobs.worker), a plan's worker
processes (engine.planning.pool). Killed, even with kill -9, the parent cannot stop them itself; a worker blocked
on its inbox, or deep in a job, would otherwise live on forever."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """A daemon thread that ends this process once `parent_pid` is no longer its parent."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(poll_s)

    t = threading.Thread(target=watch, name="vramscope-parent-watch", daemon=True)
    t.start()
    return t
