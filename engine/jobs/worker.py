"""The engine process the app runs its heavy jobs in: the loop that takes (job id, pickled engine.jobs.calls call)
messages one at a time and answers with progress, a pickled result, a one-line error or "cancelled"; it ends
when the app does, even one killed with kill -9."""

from __future__ import annotations

import os
import pickle
import signal
import time
import traceback
from typing import Any

from ..core.errors import Cancelled
from ..core.failure_text import failure_text
from ..core.parent_watch import exit_with_parent
from ..core.progress import Progress
from .calls import EngineCall


def one_line(exc: BaseException, subject: str | None = None) -> str:
    """A user-facing one-line message (engine.core.failure_text): UserError text as is; anything else names `subject`
    (what the job read) and what went wrong, in words."""
    return failure_text(exc, subject)


class _Token:
    """The cancel token a job sees in the worker process: set when the parent names this job in `cancel_id`."""

    def __init__(self, cancel_id: Any, job_id: int):
        self._v, self._id = cancel_id, job_id

    def is_set(self) -> bool:
        return bool(self._v.value == self._id)


def _progress_to(outbox: Any, jid: int, token: _Token) -> Progress:
    """The job's progress callback: raises Cancelled once the job is cancelled, else sends a few updates a second."""
    last = [0.0]

    def progress(fraction: float, message: str = "") -> None:
        if token.is_set():
            raise Cancelled()
        now = time.monotonic()
        if now - last[0] >= 0.05 or fraction >= 1.0:  # a few updates a second is all a progress bar needs
            last[0] = now
            outbox.put(("progress", jid, max(-1.0, min(1.0, float(fraction))), message))

    return progress


def serve(inbox: Any, outbox: Any, cancel_id: Any, parent_pid: int | None = None) -> None:
    """Worker-process main loop: run (job id, pickled (function, args)) messages one at a time. `parent_pid`: the
    app's pid as the app saw it (an app that died while this process was starting has already left it to init,
    and os.getppid() here would name init as the parent to outlive).

    Replies: ("started", id), ("progress", id, fraction, text), ("result", id, pickled value),
    ("error", id, one-line message, traceback text), ("cancelled", id).
    """
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in the terminal is the parent's to handle
    except (ValueError, OSError):
        pass
    exit_with_parent(os.getppid() if parent_pid is None else parent_pid)
    while True:
        msg = inbox.get()
        if msg is None:
            return
        jid, payload = msg
        token = _Token(cancel_id, jid)
        progress = _progress_to(outbox, jid, token)
        outbox.put(("started", jid))
        subject: str | None = None
        try:
            fn, args = pickle.loads(payload)
            subject = EngineCall(fn, args).subject
            value = fn(*args, cancel=token, progress=progress)
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Cancelled:
            outbox.put(("cancelled", jid))
            continue
        except BaseException as e:  # noqa: BLE001 — the process must outlive any one job
            if isinstance(e, KeyboardInterrupt):
                return
            if token.is_set():
                outbox.put(("cancelled", jid))
            else:
                outbox.put(("error", jid, one_line(e, subject), traceback.format_exc()))
            continue
        outbox.put(("cancelled", jid) if token.is_set() else ("result", jid, data))
