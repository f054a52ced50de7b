"""The planner's worker processes (engine.planning.pool): forked only where a child can trace, and gone with the
plan's process when it is killed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from engine.config.train_config import TrainConfig
from engine.planning import pool
from engine.results.types import Estimate

from .processes import alive, still_alive

ROOT = Path(__file__).resolve().parent.parent


def test_workers_are_forked_only_where_a_child_can_trace(monkeypatch):
    """A plan's default is one worker per core where they are forked: a GPU target on Linux. Not for a CPU target
    (its trace runs real CPU kernels on torch's OpenMP threads, which a fork does not carry over: `plan --device cpu`
    waited for ever), nor where CUDA is already set up in this process (a forked child cannot set it up again) or
    the process is daemonic (the app's engine worker): one, and the candidates are traced here."""
    assert pool.forks_workers("cuda")  # Linux, and the suite sets up no CUDA context
    assert 1 <= pool.default_workers("cuda") <= pool.MAX_WORKERS
    assert not pool.forks_workers("cpu") and pool.default_workers("cpu") == 1
    cfg = TrainConfig(batch_size=1, device="cpu")
    run = pool.pooled(object(), None, [cfg, cfg.with_(batch_size=2)], 2, _never)  # type: ignore[arg-type]
    assert run is _never  # (nothing forked, nothing spawned: no name to resolve)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not pool.forks_workers("cuda") and pool.default_workers("cuda") == 1
    monkeypatch.undo()
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    assert pool.default_workers("cuda") == 1


def test_whether_to_fork_is_asked_after_the_adapters_libraries_are_imported(monkeypatch):
    """bitsandbytes may set up CUDA as it loads (on a GPU machine), and a forked child cannot set it up again: a plan
    with a QLoRA candidate that imports it before forking then forks nothing."""
    def loads_cuda(kind: str) -> None:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    monkeypatch.setattr(pool, "import_libraries", loads_cuda)
    cfg = TrainConfig(batch_size=1, gpu="T4")
    run = pool.pooled(object(), None, [cfg, cfg.with_(peft="qlora")], 2, _never)  # type: ignore[arg-type]
    assert run is _never


def _never(cfg: TrainConfig) -> Estimate:
    raise AssertionError(f"traced here: {cfg}")


OPENMP_SCRIPT = """
import torch
from engine.config.train_config import TrainConfig
from engine.planning import levers, pool

def parallel(source, cfg, cancel=None):
    return str(float((torch.ones(4_000_000) * 2).sum()))  # a parallel CPU op, in the forked worker

levers.estimate_of_config = parallel
if __name__ == "__main__":
    (torch.ones(4_000_000) * 2).sum()  # torch's OpenMP threads started here, before the fork
    cfg = TrainConfig(batch_size=1, gpu="T4")
    answer = pool.pooled(object(), None, [cfg, cfg.with_(batch_size=2)], 2, None)
    try:
        answer(cfg)
    except Exception as e:  # (the worker's str result comes back as a UserError: it is the sum)
        print(e, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")
def test_a_forked_worker_runs_parallel_cpu_ops_after_its_parent_did(tmp_path):
    """torch's OpenMP pool does not survive a fork: a forked worker runs its CPU ops on one thread of its own."""
    script = tmp_path / "omp.py"
    script.write_text(textwrap.dedent(OPENMP_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "8000000.0", out.stderr[-2000:]


POOL_SCRIPT = """
import multiprocessing, sys, threading, time
from engine.config.train_config import TrainConfig
from engine.planning import levers, pool

def slow(source, cfg, cancel=None):
    time.sleep(300)  # a long trace

levers.estimate_of_config = slow  # (what a forked worker runs: it is a copy of this process)
if __name__ == "__main__":
    cfg = TrainConfig(batch_size=1, gpu="T4")
    threading.Thread(target=pool.pooled, args=(object(), None, [cfg, cfg.with_(batch_size=2)], 2, slow),
                     daemon=True).start()
    while len(multiprocessing.active_children()) < 2:
        time.sleep(0.05)
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    time.sleep(300)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")
def test_a_plans_workers_end_when_its_process_is_killed(tmp_path):
    """kill -9 of `plan` mid-way (no clean-up of its own) must not leave its workers waiting for work for ever."""
    script = tmp_path / "plan.py"
    script.write_text(textwrap.dedent(POOL_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(w) for w in workers)
    parent.kill()
    parent.wait(10)
    assert not still_alive(workers, 20), "a worker outlived the plan"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux")
def test_ctrl_c_stops_a_plans_workers_at_once():
    """Ctrl+C (SIGINT to the whole process group, as a terminal sends it) mid-plan: the plan stops, its queued
    candidates are dropped and its workers end, without waiting for the traces they run."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, "-c", INTERRUPTED], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert parent.stdout is not None
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2
    t0 = time.monotonic()
    os.killpg(parent.pid, signal.SIGINT)
    parent.wait(60)
    assert time.monotonic() - t0 < 15, "the plan waited for its workers' traces"
    assert parent.stdout.read().strip() == "interrupted"
    assert not still_alive(workers, 10)


INTERRUPTED = """
import multiprocessing, threading, time
from engine.config.train_config import TrainConfig
from engine.planning import levers, pool

def slow(source, cfg, cancel=None):
    time.sleep(60)  # a long trace

levers.estimate_of_config = slow
if __name__ == "__main__":
    cfg = TrainConfig(batch_size=1, gpu="T4")
    def report():
        while len(multiprocessing.active_children()) < 2:
            time.sleep(0.05)
        print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    threading.Thread(target=report, daemon=True).start()
    try:
        pool.pooled(object(), None, [cfg.with_(batch_size=b) for b in range(1, 9)], 2, slow)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""
