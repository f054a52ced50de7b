"""The one bridge between the GUI and the engine: jobs go in, answers come back as signals.

Each job kind ("estimate", "analytic", "profile", "report", …) has its own lane, so a slow traced estimate
never holds up the instant analytic one. A newer job of a kind cancels the older one through its cancel
token (checked by the engine); answers of superseded jobs are dropped. The UI thread never waits on the
engine: submit() only queues, shutdown() only asks and waits briefly.

Lanes are QThreads, except for picklable `EngineCall` jobs of the heavy kinds, which run in a worker
*process*: a tracing step holds Python's GIL and its garbage collections pause every thread for hundreds of
milliseconds on a 7B model, which a thread cannot hide from the event loop and a process can.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import pickle
import queue
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.core.errors import Cancelled
from engine.core.progress import Progress
from engine.jobs.calls import EngineCall, warm_up
from engine.jobs.worker import one_line, serve

from . import qt_workarounds  # noqa: F401 — before any signal is emitted

log = logging.getLogger(__name__)

# A job function receives its cancel token and a progress callback (fraction, message), and returns the result.
JobFn = Callable[[threading.Event, Progress], Any]


@dataclass
class Job:
    kind: str
    id: int
    fn: JobFn
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)


# Kinds whose EngineCall jobs run in a worker process, and which process: the estimate and the planner share
# one (a new estimate cancels the planner's work anyway); a real profile run gets its own.
PROCESS_GROUPS = {"estimate": "engine", "max_batch": "engine", "max_context": "engine", "plan": "engine",
                  "plan_quick": "engine", "tree": "engine", "profile": "profile", "snapshot": "snapshot",
                  "beside": "snapshot", "what_fits": "snapshot"}


class _Worker(QObject):
    """Lives on a lane's thread; runs the jobs queued to it, one at a time, skipping cancelled ones."""

    started = Signal(object)  # Job
    progress = Signal(object, float, str)  # Job, fraction 0..1 (or -1 when unknown), message
    finished = Signal(object, object)  # Job, result
    failed = Signal(object, str, str)  # Job, one-line message, traceback text (for logs)
    cancelled = Signal(object)  # Job

    @Slot(object)
    def run(self, job: Job) -> None:
        if job.cancel.is_set():
            self.cancelled.emit(job)
            return
        self.started.emit(job)

        def progress(fraction: float, message: str = "") -> None:
            if job.cancel.is_set():
                raise Cancelled()
            self.progress.emit(job, max(-1.0, min(1.0, float(fraction))), message)

        try:
            result = job.fn(job.cancel, progress)
        except Cancelled:
            self.cancelled.emit(job)
            return
        except BaseException as e:  # noqa: BLE001 — nothing may escape a worker thread
            if job.cancel.is_set():
                self.cancelled.emit(job)
            else:
                subject = job.fn.subject if isinstance(job.fn, EngineCall) else None
                self.failed.emit(job, one_line(e, subject), traceback.format_exc())
            return
        if job.cancel.is_set():
            self.cancelled.emit(job)
        else:
            self.finished.emit(job, result)


_RUNNING_LANES: list[_Lane] = []  # lanes whose job outlived their bridge's shutdown; see EngineBridge.shutdown
_LIVE_BRIDGES: weakref.WeakSet[EngineBridge] = weakref.WeakSet()


def shutdown_all() -> None:
    """Every bridge still open shut down: an app that fails while it starts (its window half built) must not
    leave its engine processes, their reader threads (destroyed running, they abort the process) or the
    multiprocessing resource tracker behind."""
    for bridge in list(_LIVE_BRIDGES):
        if not bridge._closed:
            bridge.shutdown()


LANE_EXIT_WAIT_S = 3.0  # how long an exiting app waits for cancelled thread jobs to reach their next check


@atexit.register
def _join_running_lanes() -> None:
    # Their jobs were cancelled and stop at the engine's next check. A QThread destroyed while it runs aborts the
    # process ("QThread: Destroyed while thread is still running", SIGABRT), so one that is still busy after a
    # short wait (a long analytic pass between checks) ends the process here, before any destructor runs: its
    # answer is no longer wanted and every file was already saved or autosaved.
    deadline = time.monotonic() + LANE_EXIT_WAIT_S
    stuck = False
    for lane in _RUNNING_LANES:
        if not lane.worker_thread.wait(max(0, int((deadline - time.monotonic()) * 1000))):
            stuck = True
    if stuck:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(0)


class _Lane(QObject):
    """A worker on its own thread; `submit` is a queued call into it."""

    submit = Signal(object)

    def __init__(self, kind: str):
        super().__init__()
        # Not `self.thread`: that would shadow QObject.thread(), the thread this object itself lives in.
        self.worker_thread = QThread()
        self.worker_thread.setObjectName(f"vramscope-{kind}")
        self.worker = _Worker()
        self.worker.moveToThread(self.worker_thread)
        self.submit.connect(self.worker.run)  # queued: the worker lives on another thread
        self.worker_thread.start()


class _Reader(QThread):
    """Reads a worker process's replies and hands them to the GUI thread (unpickling results here)."""

    reply = Signal(object)

    def __init__(self, proc: BaseProcess, outbox: Queue[Any], stop: threading.Event):
        super().__init__()
        self._proc, self._outbox, self._stop = proc, outbox, stop

    def run(self) -> None:
        proc, outbox, stop = self._proc, self._outbox, self._stop
        while not stop.is_set():
            try:
                msg = outbox.get(timeout=0.25)
            except queue.Empty:
                if not proc.is_alive():
                    if not stop.is_set():
                        self.reply.emit(("died", proc.exitcode))
                    return
                continue
            except (EOFError, OSError, ValueError):
                return
            if msg[0] == "result":
                try:
                    msg = ("result", msg[1], pickle.loads(msg[2]))  # here, not on the GUI thread
                except Exception as e:  # noqa: BLE001
                    msg = ("error", msg[1], one_line(e), traceback.format_exc())
            self.reply.emit(msg)


class _ProcessLane(QObject):
    """A worker process fed one job at a time; speaks the same signals as a thread lane's _Worker.

    Jobs wait here (not in the process) until the process is free, so a superseded job that never started is
    simply dropped. The running job is cancelled through a shared integer naming it. A reader thread turns
    the process's replies into a queued signal; if the process dies, its job fails with a plain message and
    the next job starts a fresh process.
    """

    started = Signal(object)
    progress = Signal(object, float, str)
    finished = Signal(object, object)
    failed = Signal(object, str, str)
    cancelled = Signal(object)
    unavailable = Signal(object)  # Job: no process can be started here; the bridge runs it on a thread

    def __init__(self, name: str):
        super().__init__()
        import multiprocessing as mp

        self.name = name
        # spawn, never fork: a forked child of a process running Qt threads can deadlock.
        self._ctx = mp.get_context("spawn")
        self._cancel_id = self._ctx.Value("q", 0, lock=False)
        self._queue: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._proc: BaseProcess | None = None
        self._inbox: Queue[Any] | None = None
        self._outbox: Queue[Any] | None = None
        self._reader: _Reader | None = None
        self._stop = threading.Event()

    # ---- process
    def start(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._stop = threading.Event()
        self._inbox, self._outbox = self._ctx.Queue(), self._ctx.Queue()
        proc = self._ctx.Process(target=serve, args=(self._inbox, self._outbox, self._cancel_id, os.getpid()),
                                 name=f"vramscope-{self.name}", daemon=True)
        self._proc = proc
        proc.start()
        # A QThread, not a threading.Thread: Qt signals emitted from threads Qt did not start are fragile.
        self._reader = _Reader(proc, self._outbox, self._stop)
        self._reader.setObjectName(f"vramscope-{self.name}-reader")
        self._reader.reply.connect(self._on_reply)
        self._reader.start()

    def stop(self, wait_s: float = 2.0) -> None:
        self._queue.clear()
        if self._running is not None:
            self._cancel_id.value = self._running.id
        proc = self._proc
        self._proc = None
        if proc is None:
            self._stop.set()
            return
        # Nothing in the engine process needs a graceful end (its answers are no longer wanted, and the driver
        # frees a CUDA context with the process), and a torch interpreter takes seconds to finalise: stop it.
        proc.terminate()
        proc.join(wait_s)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
        self._stop.set()
        if self._reader is not None:
            self._reader.wait(1000)  # it sees the stop flag within a quarter second
            self._reader = None
        for q in (self._inbox, self._outbox):
            if q is None:  # never: start() makes both queues before the process
                continue
            try:
                q.close()
                q.join_thread()
            except (OSError, ValueError, AssertionError):
                pass

    # ---- jobs
    def submit(self, job: Job) -> None:
        self._queue.append(job)
        self._dispatch()

    def cancel(self, job: Job) -> None:
        if self._running is job:
            self._cancel_id.value = job.id

    def _dispatch(self) -> None:
        while self._running is None and self._queue:
            job = self._queue.popleft()
            if job.cancel.is_set():
                self.cancelled.emit(job)
                continue
            call = job.fn
            assert isinstance(call, EngineCall), "the bridge routes only EngineCall jobs to a process lane"
            try:
                payload = pickle.dumps((call.fn, call.args), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 — an argument that cannot travel
                self.failed.emit(job, one_line(e, call.subject), traceback.format_exc())
                continue
            try:
                self.start()
                assert self._inbox is not None, "start() made the queues"
                self._inbox.put((job.id, payload))
            except Exception:  # noqa: BLE001 — no process can be started here (sandbox, frozen build)
                log.warning("no engine process; running engine jobs on threads", exc_info=True)
                self._proc = None
                self.unavailable.emit(job)
                for rest in list(self._queue):
                    self.unavailable.emit(rest)
                self._queue.clear()
                return
            self._running = job

    @Slot(object)
    def _on_reply(self, msg: tuple[Any, ...]) -> None:
        job = self._running
        what = msg[0]
        if what == "died":
            if job is not None:
                self._running = None
                code = msg[1]
                self.failed.emit(job, f"the engine process stopped unexpectedly (exit code {code}); "
                                 "the next estimate starts a new one", "")
            self._proc = None
            self._dispatch()
            return
        if job is None or msg[1] != job.id:
            return  # a reply for a job this lane has already given up on
        if what == "started":
            self.started.emit(job)
        elif what == "progress":
            self.progress.emit(job, float(msg[2]), str(msg[3]))
        else:
            self._running = None
            if what == "result":
                self.finished.emit(job, msg[2])
            elif what == "error":
                self.failed.emit(job, msg[2], msg[3])
            else:
                self.cancelled.emit(job)
            self._dispatch()


class EngineBridge(QObject):
    """Queue engine work off the GUI thread. Signals carry (kind, job id, …) and only for current jobs.

    started(kind, id); progress(kind, id, fraction, message) with fraction in 0..1 or -1 when unknown;
    result(kind, id, value); error(kind, id, one_line_message); cancelled(kind, id);
    busyChanged(bool): whether any job is queued or running, said again each time a job is queued or ends (a view
    showing one kind's work, is_busy(kind), follows that kind's job, whatever else runs).

    `processes`: run EngineCall jobs of the kinds in PROCESS_GROUPS in worker processes (default: yes, unless
    the environment sets VRAMSCOPE_ENGINE_THREADS=1). Any other job runs on a thread lane.
    """

    started = Signal(str, int)
    progress = Signal(str, int, float, str)
    result = Signal(str, int, object)
    error = Signal(str, int, str)
    cancelled = Signal(str, int)
    busyChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None, *, processes: bool | None = None):
        super().__init__(parent)
        if processes is None:
            processes = os.environ.get("VRAMSCOPE_ENGINE_THREADS", "") not in ("1", "true", "yes")
        self.processes = processes
        self._lanes: dict[str, _Lane] = {}
        self._plans: dict[str, _ProcessLane] = {}
        self._job_lane: dict[int, _ProcessLane] = {}
        self._current: dict[str, Job] = {}  # newest job of each kind
        self._pending: set[int] = set()  # ids queued or running (superseded ones included until they end)
        self._ids = itertools.count(1)
        self._closed = False
        self.last_traceback = ""
        _LIVE_BRIDGES.add(self)

    # ---- submitting
    def submit(self, kind: str, fn: JobFn) -> int:
        """Queue `fn(cancel, progress)` on the lane of `kind`; cancels the older job of that kind."""
        if self._closed:
            return 0
        older = self._current.get(kind)
        if older is not None:
            self._cancel_job(older)
        job = Job(kind, next(self._ids), fn)
        self._current[kind] = job
        self._pending.add(job.id)
        group = PROCESS_GROUPS.get(kind) if self.processes and isinstance(fn, EngineCall) else None
        if group is not None:
            lane = self._process_lane(group)
            self._job_lane[job.id] = lane
            lane.submit(job)
        else:
            self._lane(kind).submit.emit(job)
        if job.id in self._pending:
            # Every job, not only the first: an estimate queued while an analytic job runs was never announced, and
            # the summary showed the figures before as done ("traced in 1.56 s", no spinner) while it traced.
            self.busyChanged.emit(True)
        return job.id

    def warm_up(self, group: str = "engine") -> None:
        """Start an engine process now and let it import the engine, so the first estimate is quick."""
        if self.processes and not self._closed:
            lane = self._process_lane(group)
            job = Job("warm_up", next(self._ids), EngineCall(warm_up))
            lane.submit(job)

    def _cancel_job(self, job: Job) -> None:
        job.cancel.set()
        lane = self._job_lane.get(job.id)
        if lane is not None:
            lane.cancel(job)

    def cancel(self, kind: str) -> None:
        """Ask the current job of `kind` to stop; its `cancelled` signal follows when it does."""
        job = self._current.get(kind)
        if job is not None:
            self._cancel_job(job)

    def cancel_all(self) -> None:
        for job in self._current.values():
            self._cancel_job(job)

    def is_current(self, kind: str, job_id: int) -> bool:
        job = self._current.get(kind)
        return job is not None and job.id == job_id and not job.cancel.is_set()

    def is_busy(self, kind: str | None = None) -> bool:
        if kind is None:
            return bool(self._pending)
        job = self._current.get(kind)
        return job is not None and job.id in self._pending

    def shutdown(self, wait_ms: int = 2000) -> None:
        """Cancel everything and stop the lanes; waits at most `wait_ms` per lane for a job to notice."""
        self._closed = True
        self.cancel_all()
        for plane in self._plans.values():
            plane.stop(wait_ms / 1000)
        for lane in self._lanes.values():
            lane.worker_thread.quit()
        deadline = time.monotonic() + wait_ms / 1000
        for kind, lane in list(self._lanes.items()):
            left = max(0, int((deadline - time.monotonic()) * 1000))
            if not lane.worker_thread.wait(left):
                # A job still running: keep its lane alive beyond this bridge until the thread ends. Destroying a
                # running QThread aborts the process, and the bridge itself may be collected at any moment (by a
                # garbage collection in whichever thread holds the GIL).
                _RUNNING_LANES.append(lane)
            del self._lanes[kind]

    # ---- lanes
    def _connect(self, w: _Worker | _ProcessLane) -> None:
        # Queued connections where the sender lives on another thread: these slots run on the GUI thread.
        w.started.connect(self._on_started)
        w.progress.connect(self._on_progress)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.cancelled.connect(self._on_cancelled)

    def _lane(self, kind: str) -> _Lane:
        lane = self._lanes.get(kind)
        if lane is None:
            lane = _Lane(kind)
            self._connect(lane.worker)
            self._lanes[kind] = lane
        return lane

    def _process_lane(self, group: str) -> _ProcessLane:
        lane = self._plans.get(group)
        if lane is None:
            lane = _ProcessLane(group)
            self._connect(lane)
            lane.unavailable.connect(self._run_on_thread)
            self._plans[group] = lane
        return lane

    @Slot(object)
    def _run_on_thread(self, job: Job) -> None:
        self.processes = False  # later jobs go straight to threads
        self._job_lane.pop(job.id, None)
        if job.kind == "warm_up":
            return
        self._lane(job.kind).submit.emit(job)

    def _done(self, job: Job) -> None:
        self._job_lane.pop(job.id, None)
        if job.id in self._pending:
            self._pending.discard(job.id)
            self.busyChanged.emit(bool(self._pending))  # (an estimate ending while another job runs is news too)

    def _live(self, job: Job) -> bool:
        return self.is_current(job.kind, job.id)

    @Slot(object)
    def _on_started(self, job: Job) -> None:
        if self._live(job):
            self.started.emit(job.kind, job.id)

    @Slot(object, float, str)
    def _on_progress(self, job: Job, frac: float, msg: str) -> None:
        if self._live(job):
            self.progress.emit(job.kind, job.id, frac, msg)

    @Slot(object, object)
    def _on_finished(self, job: Job, value: object) -> None:
        live = self._live(job)
        self._done(job)
        if live:
            self.result.emit(job.kind, job.id, value)

    @Slot(object, str, str)
    def _on_failed(self, job: Job, msg: str, tb: str) -> None:
        live = self._live(job)
        self._done(job)
        if tb:
            log.debug("%s job failed:\n%s", job.kind, tb)
        if live:
            self.last_traceback = tb
            self.error.emit(job.kind, job.id, msg)

    @Slot(object)
    def _on_cancelled(self, job: Job) -> None:
        self._done(job)
        # Reported for the job that was asked to stop (Stop button), not for ones silently superseded.
        if self._current.get(job.kind) is job:
            self.cancelled.emit(job.kind, job.id)
