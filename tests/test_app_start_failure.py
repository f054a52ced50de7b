"""An app that dies while it starts leaves nothing running (issue 26): its engine worker process and the
multiprocessing resource tracker end with it. Before, an exception in the window's construction aborted the
process (SIGABRT: a reader QThread destroyed running) and both children lived on under init; and a worker whose
app was killed while the worker started watched init, not the app, as its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .processes import still_alive

pytest.importorskip("pytestqt")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the children")

CHILDREN = """
import os, time
def children() -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out
def wait_for_children(n: int) -> list[int]:
    deadline = time.monotonic() + 60
    while len(children()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return children()
"""

DIES_IN_WINDOW = CHILDREN + """
import sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
import gui.actions
def boom(host, window):  # the window half built (its menus next): the engine process warming up, its reader running
    print(" ".join(map(str, wait_for_children(2))), flush=True)
    raise RuntimeError("forced start failure")
gui.actions.build = boom
from gui.app import run_app
sys.exit(run_app())
"""

KILLED_WHILE_WORKER_STARTS = CHILDREN + """
import signal
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from gui.app import make_app
from gui.bridge import EngineBridge
app = make_app()
bridge = EngineBridge(processes=True)
bridge.warm_up()
print(" ".join(map(str, wait_for_children(2))), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # before the worker's own code has run: no clean-up of any kind
"""


def _run(tmp_path: Path, script: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"))
    r = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    pids = [int(p) for p in r.stdout.split()]
    return r, pids


def _gone(pids: list[int], seconds: float) -> list[int]:
    left = still_alive(pids, seconds)
    for p in left:  # never leave them to the next test
        os.kill(p, signal.SIGKILL)
    return left


def test_an_exception_while_the_window_is_built_leaves_no_child(tmp_path):
    r, pids = _run(tmp_path, DIES_IN_WINDOW)
    assert len(pids) == 2, r.stderr[-2000:]  # the engine worker and the resource tracker were running
    assert r.returncode == 1 and "forced start failure" in r.stderr  # an exception, not SIGABRT
    assert "QThread: Destroyed" not in r.stderr
    assert _gone(pids, 10) == []


def test_an_app_killed_while_its_worker_starts_leaves_no_child(tmp_path):
    r, pids = _run(tmp_path, KILLED_WHILE_WORKER_STARTS)
    assert r.returncode == -signal.SIGKILL and len(pids) == 2, r.stderr[-2000:]
    assert _gone(pids, 60) == []  # the worker watches the app's pid from its first line
