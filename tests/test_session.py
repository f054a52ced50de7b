"""gui.session: each job's answer reaches its own callbacks, a superseded job's never does, and an analytic answer
of an edit whose traced estimate is already on screen is dropped."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.errors import UserError  # noqa: E402
from engine.sketch.document import load_template  # noqa: E402
from gui.session import EngineSession, JobCallbacks  # noqa: E402


@pytest.fixture
def session(qtbot):
    s = EngineSession(processes=False)  # threads: quick to start, same routing
    yield s
    s.shutdown()


def _echo(value, gate: threading.Event | None = None):
    def job(cancel, progress):
        progress(0.5, "half way")
        if gate is not None:
            gate.wait(10)
        return value
    return job


def test_each_job_answers_its_own_callbacks(qtbot, session):
    got: dict[str, list] = {"a": [], "b": [], "progress": []}
    session.submit("one", _echo(1), JobCallbacks(got["a"].append,
                                                progress=lambda f, m: got["progress"].append((f, m))))
    session.submit("two", _echo(2), JobCallbacks(got["b"].append))
    qtbot.waitUntil(lambda: bool(got["a"] and got["b"]), timeout=10000)
    assert got["a"] == [1] and got["b"] == [2]
    assert got["progress"] == [(0.5, "half way")]


def test_a_superseded_job_never_answers(qtbot, session):
    gate = threading.Event()
    old, new = [], []
    session.submit("estimate", _echo("old", gate), JobCallbacks(old.append))
    session.submit("estimate", _echo("new"), JobCallbacks(new.append))
    gate.set()
    qtbot.waitUntil(lambda: bool(new), timeout=10000)
    qtbot.waitUntil(lambda: not session.is_busy(), timeout=10000)
    assert new == ["new"] and old == []


def test_errors_go_to_the_failed_callback(qtbot, session):
    def bad(cancel, progress):
        raise UserError("expects 100 input features, got 512", where="node 'fc2'")

    errors = []
    session.submit("estimate", bad, JobCallbacks(lambda v: None, errors.append))
    qtbot.waitUntil(lambda: bool(errors), timeout=10000)
    assert errors == ["node 'fc2': expects 100 input features, got 512"]


def test_analytic_of_a_shown_revision_is_stale(qtbot, session):
    """The traced estimate of edit 1 is on screen: edit 1's analytic answer, arriving late, is not drawn over it;
    edit 2's analytic answer is."""
    sketch = load_template("mlp").to_json()
    cfg = TrainConfig(batch_size=4, device="cpu")
    traced, analytic = [], []
    session.edited()
    session.estimate(("sketch", sketch, None), cfg, JobCallbacks(traced.append))
    qtbot.waitUntil(lambda: bool(traced), timeout=60000)
    assert session.shown_revision == session.revision
    session.analytic(sketch, cfg, JobCallbacks(analytic.append))  # same revision: stale on arrival
    qtbot.waitUntil(lambda: not session.is_busy(), timeout=30000)
    qtbot.wait(50)
    assert analytic == []
    session.edited()
    session.analytic(sketch, cfg, JobCallbacks(analytic.append))
    qtbot.waitUntil(lambda: bool(analytic), timeout=30000)
    assert analytic[0].peak_bytes > 0


def test_analytic_of_a_failed_revision_gives_its_node_figures_only(qtbot, session):
    """Edit 1's traced estimate failed: its analytic answer, arriving late, goes to `after_failure` (the canvas's
    per-node figures), not to the summary's callback, and its error is dropped (the trace said why); edit 2's
    answer is the summary's again."""
    sketch = load_template("mlp").to_json()
    cfg = TrainConfig(batch_size=4, device="cpu")
    failed, analytic, nodes, analytic_errors = [], [], [], []
    session.edited()
    session.estimate(("sketch", sketch, None), cfg.with_(mode="generate"), JobCallbacks(lambda e: None, failed.append))
    qtbot.waitUntil(lambda: bool(failed), timeout=60000)
    assert session.failed_revision == session.revision and session.shown_revision < session.revision
    session.analytic(sketch, cfg, JobCallbacks(analytic.append, analytic_errors.append), after_failure=nodes.append)
    qtbot.waitUntil(lambda: bool(nodes), timeout=30000)
    assert analytic == [] and nodes[0].nodes
    session.analytic({"nodes": "not a sketch"}, cfg, JobCallbacks(analytic.append, analytic_errors.append))
    qtbot.waitUntil(lambda: not session.is_busy(), timeout=30000)
    assert analytic_errors == []
    session.edited()
    session.analytic(sketch, cfg, JobCallbacks(analytic.append), after_failure=nodes.append)
    qtbot.waitUntil(lambda: bool(analytic), timeout=30000)
    assert analytic[0].peak_bytes > 0 and len(nodes) == 1
