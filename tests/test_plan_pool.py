"""The planner's worker processes (engine.planning.pool): forked only where a child can trace, and gone with the
plan's process when it is killed."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from engine.planning import pool

ROOT = Path(__file__).resolve().parent.parent


def test_workers_are_forked_only_where_a_child_can_trace(monkeypatch):
    """A plan's default is one worker per core where they are forked; where CUDA is already set up in this process
    (a forked child cannot set it up again) or the process is daemonic (the app's engine worker), one."""
    assert pool.forks_workers()  # Linux, and the suite sets up no CUDA context
    assert 1 <= pool.default_workers() <= pool.MAX_WORKERS
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not pool.forks_workers() and pool.default_workers() == 1
    monkeypatch.undo()
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    assert pool.default_workers() == 1


POOL_SCRIPT = """
import multiprocessing, sys, threading, time
from engine.config.train_config import TrainConfig
from engine.planning import levers, pool

def slow(source, cfg, cancel=None):
    time.sleep(300)  # a long trace

levers.estimate_of_config = slow  # (what a forked worker runs: it is a copy of this process)
if __name__ == "__main__":
    cfg = TrainConfig(batch_size=1, device="cpu")
    threading.Thread(target=pool.pooled, args=(object(), None, [cfg, cfg.with_(batch_size=2)], 2, slow),
                     daemon=True).start()
    while len(multiprocessing.active_children()) < 2:
        time.sleep(0.05)
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")
def test_a_plans_workers_end_when_its_process_is_killed(tmp_path):
    """kill -9 of `plan` mid-way (no clean-up of its own) must not leave its workers waiting for work for ever."""
    script = tmp_path / "plan.py"
    script.write_text(textwrap.dedent(POOL_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "a worker outlived the plan"
