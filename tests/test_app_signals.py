"""SIGTERM ends the desktop app as closing its window does: the engine's worker processes end with it
(issue 13, item 8). The real program, as a process, on the offscreen platform."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .processes import alive, still_alive

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        kids = (task / "children").read_text().split() if (task / "children").exists() else []
        out.update(int(k) for k in kids)
    return out


def _descendants(pid: int) -> set[int]:
    seen, todo = set(), [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_app_and_its_engine_processes(tmp_path, sig):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    log = (tmp_path / "app.log").open("wb")  # a file, not a pipe: worker processes may hold it open
    app = subprocess.Popen([sys.executable, str(ROOT / "main.py")], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        workers: set[int] = set()
        while time.monotonic() < deadline and not workers:  # the engine's worker process(es) started
            time.sleep(0.5)
            assert app.poll() is None, (tmp_path / "app.log").read_text(errors="replace")
            workers = {p for p in _descendants(app.pid) if "python" in Path(f"/proc/{p}/exe").resolve().name}
        assert workers, "the app started no engine process"  # (its signal handlers are set before they start)
        app.send_signal(sig)
        rc = app.wait(timeout=30)
        assert rc == 0, (rc, (tmp_path / "app.log").read_text(errors="replace"))
        assert not still_alive(workers, 10), "engine processes outlived the app"
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
        for p in _descendants(app.pid) if alive(app.pid) else ():
            os.kill(p, signal.SIGKILL)
        log.close()
