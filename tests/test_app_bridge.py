"""The engine bridge: jobs run off the GUI thread, a newer job cancels an older one, stale answers are dropped,
errors arrive as one line."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("pytestqt")

from engine.core.errors import Cancelled, UserError  # noqa: E402
from gui.bridge import EngineBridge  # noqa: E402


@pytest.fixture
def bridge(qtbot):
    b = EngineBridge()
    yield b
    b.shutdown()


def _collect(bridge):
    got = {"result": [], "error": [], "cancelled": [], "started": []}
    bridge.result.connect(lambda k, i, v: got["result"].append((k, i, v)))
    bridge.error.connect(lambda k, i, m: got["error"].append((k, i, m)))
    bridge.cancelled.connect(lambda k, i: got["cancelled"].append((k, i)))
    bridge.started.connect(lambda k, i: got["started"].append((k, i)))
    return got


def test_job_runs_off_the_gui_thread(qtbot, bridge):
    got = _collect(bridge)
    gui_thread = threading.get_ident()
    jid = bridge.submit("estimate", lambda cancel, progress: threading.get_ident())
    qtbot.waitUntil(lambda: bool(got["result"]), timeout=5000)
    kind, rid, worker_thread = got["result"][0]
    assert (kind, rid) == ("estimate", jid)
    assert worker_thread != gui_thread
    assert got["started"] == [("estimate", jid)]


def test_newer_job_cancels_older_and_its_answer_is_dropped(qtbot, bridge):
    got = _collect(bridge)
    running = threading.Event()
    seen_cancel = threading.Event()

    def slow(cancel, progress):
        running.set()
        # Like the engine: checks its token and stops with Cancelled.
        for _ in range(500):
            if cancel.is_set():
                seen_cancel.set()
                raise Cancelled()
            time.sleep(0.01)
        return "old"

    old = bridge.submit("estimate", slow)
    qtbot.waitUntil(running.is_set, timeout=5000)
    new = bridge.submit("estimate", lambda cancel, progress: "new")
    qtbot.waitUntil(lambda: bool(got["result"]), timeout=5000)
    assert seen_cancel.is_set()
    assert [(k, i, v) for k, i, v in got["result"]] == [("estimate", new, "new")]
    assert all(i != old for _, i, _ in got["result"])
    assert not got["cancelled"]  # superseded silently, not reported as a user stop
    qtbot.waitUntil(lambda: not bridge.is_busy(), timeout=5000)


def test_stale_answer_of_a_job_that_ignores_its_token_is_dropped(qtbot, bridge):
    got = _collect(bridge)
    release = threading.Event()
    started = threading.Event()

    def stubborn(cancel, progress):
        started.set()
        release.wait(5)
        return "stale"

    bridge.submit("estimate", stubborn)
    qtbot.waitUntil(started.is_set, timeout=5000)
    new = bridge.submit("estimate", lambda cancel, progress: "fresh")
    release.set()
    qtbot.waitUntil(lambda: bool(got["result"]), timeout=5000)
    qtbot.wait(50)
    assert [v for _, _, v in got["result"]] == ["fresh"]
    assert got["result"][0][1] == new


def test_kinds_do_not_cancel_each_other(qtbot, bridge):
    got = _collect(bridge)
    bridge.submit("analytic", lambda c, p: "a")
    bridge.submit("estimate", lambda c, p: "t")
    qtbot.waitUntil(lambda: len(got["result"]) == 2, timeout=5000)
    assert sorted(v for _, _, v in got["result"]) == ["a", "t"]


def test_user_error_arrives_as_one_line(qtbot, bridge):
    got = _collect(bridge)

    def bad(cancel, progress):
        raise UserError("expects 100 input features,\n got 512", where="node 'fc2'")

    bridge.submit("estimate", bad)
    qtbot.waitUntil(lambda: bool(got["error"]), timeout=5000)
    msg = got["error"][0][2]
    assert msg == "node 'fc2': expects 100 input features, got 512"
    assert "\n" not in msg and "Traceback" not in msg


def test_unexpected_exception_is_named_not_a_traceback(qtbot, bridge):
    got = _collect(bridge)
    bridge.submit("estimate", lambda c, p: 1 / 0)
    qtbot.waitUntil(lambda: bool(got["error"]), timeout=5000)
    assert got["error"][0][2] == "the engine stopped: division by zero"  # no exception's repr (issue 26)
    assert "ZeroDivisionError" in bridge.last_traceback


def test_stop_reports_cancelled_and_progress_flows(qtbot, bridge):
    got = _collect(bridge)
    fractions = []
    bridge.progress.connect(lambda k, i, f, m: fractions.append((f, m)))
    half = threading.Event()

    def job(cancel, progress):
        progress(0.5, "halfway")
        half.set()
        while True:  # stops only through the token, via progress() raising Cancelled
            time.sleep(0.01)
            progress(0.5, "halfway")

    jid = bridge.submit("profile", job)
    qtbot.waitUntil(half.is_set, timeout=5000)
    # Progress reaches the GUI thread while the job is current (after a stop it would be dropped as stale).
    qtbot.waitUntil(lambda: bool(fractions), timeout=5000)
    assert fractions[0] == (0.5, "halfway")
    bridge.cancel("profile")
    qtbot.waitUntil(lambda: bool(got["cancelled"]), timeout=5000)
    assert got["cancelled"] == [("profile", jid)]
    assert not got["result"] and not got["error"]


# ---- the engine process: picklable EngineCall jobs of the heavy kinds run in a worker process.
# Targets below are module-level so the worker process can import them by name.

def proc_pid(*, cancel=None, progress=None):
    import os

    return os.getpid()


def proc_wait_for_cancel(seconds, *, cancel=None, progress=None):
    progress(0.25, "waiting")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cancel.is_set():
            raise Cancelled()
        time.sleep(0.01)
    return "old"


def proc_echo(value, *, cancel=None, progress=None):
    return value


def proc_user_error(*, cancel=None, progress=None):
    raise UserError("expects 100 input features, got 512", where="node 'fc2'")


def proc_die(*, cancel=None, progress=None):
    import os

    os._exit(3)


@pytest.fixture
def pbridge(qtbot):
    b = EngineBridge(processes=True)
    yield b
    b.shutdown()


def test_engine_call_runs_in_a_worker_process(qtbot, pbridge):
    import os

    from engine.jobs.calls import EngineCall

    got = _collect(pbridge)
    pbridge.submit("estimate", EngineCall(proc_pid))
    qtbot.waitUntil(lambda: bool(got["result"] or got["error"]), timeout=30000)
    assert not got["error"], got["error"]
    assert got["result"][0][2] != os.getpid()


def test_process_newer_job_cancels_older(qtbot, pbridge):
    from engine.jobs.calls import EngineCall

    got = _collect(pbridge)
    progress = []
    pbridge.progress.connect(lambda k, i, f, m: progress.append((i, f, m)))
    # The old job would run 10 minutes: the new one's answer within waitUntil's 10 s comes only if it stopped at its
    # token (the one worker process runs one job at a time).
    old = pbridge.submit("estimate", EngineCall(proc_wait_for_cancel, (600,)))
    qtbot.waitUntil(lambda: bool(progress), timeout=30000)  # the old job is running in the process
    assert progress[0] == (old, 0.25, "waiting")
    new = pbridge.submit("estimate", EngineCall(proc_echo, ("new",)))
    qtbot.waitUntil(lambda: bool(got["result"]), timeout=10000)
    assert got["result"] == [("estimate", new, "new")]
    assert not got["cancelled"]


def test_process_error_is_one_line_and_a_dead_process_is_replaced(qtbot, pbridge):
    from engine.jobs.calls import EngineCall

    got = _collect(pbridge)
    pbridge.submit("estimate", EngineCall(proc_user_error))
    qtbot.waitUntil(lambda: bool(got["error"]), timeout=30000)
    assert got["error"][0][2] == "node 'fc2': expects 100 input features, got 512"
    pbridge.submit("estimate", EngineCall(proc_die))
    qtbot.waitUntil(lambda: len(got["error"]) == 2, timeout=10000)
    assert "stopped unexpectedly (exit code 3)" in got["error"][1][2]
    pbridge.submit("estimate", EngineCall(proc_echo, (42,)))
    qtbot.waitUntil(lambda: bool(got["result"]), timeout=30000)
    assert got["result"][0][2] == 42


def test_without_a_process_jobs_fall_back_to_threads(qtbot, pbridge, monkeypatch):
    import multiprocessing.context

    from engine.jobs.calls import EngineCall

    def no_process(self):
        raise OSError("process creation is not permitted here")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", no_process)
    got = _collect(pbridge)
    pbridge.submit("estimate", EngineCall(proc_echo, ("via thread",)))
    qtbot.waitUntil(lambda: bool(got["result"] or got["error"]), timeout=10000)
    assert got["result"][0][2] == "via thread" and not got["error"]
    assert pbridge.processes is False
