"""Issue 27 item 9: the Plan tab's progress bar belongs to the recommendations: it is hidden whenever they are shown,
at every signal the engine sends, whatever order the planner's jobs end in (on thread lanes the largest-batch
search runs beside the re-traced recommendations, and its progress could come after them and show the bar again)."""

from __future__ import annotations

import threading

import pytest

from engine.jobs import calls as jobs
from tests.app_windows import open_window


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)  # the engine on thread lanes: the planner's jobs run side by side
    yield w
    w.close()


def test_the_largest_batch_search_reporting_after_the_recommendations_leaves_the_bar_hidden(
        qtbot, window, monkeypatch):
    """The search is held until the recommendations are on screen, then reports progress and ends: the bar stays
    hidden, the search's progress shows on its own line, then its answer."""
    answered = threading.Event()
    real = jobs.max_batch

    def held_max_batch(*args, cancel=None, progress=None, **kw):
        assert answered.wait(120), "the recommendations never came"
        assert progress is not None
        progress(0.4, "estimating batch 64")
        progress(-1, "estimating batch 96")
        return real(*args, cancel=cancel, progress=progress, **kw)

    monkeypatch.setattr(jobs, "max_batch", held_max_batch)
    plan = window.results.plan
    seen: list[tuple[str, bool, bool, str]] = []  # after each signal: (which, answer shown, bar shown, batch line)

    def check(kind: str, *_rest: object) -> None:  # runs after the window's own slot (connected after it)
        seen.append((kind, window.recommendations is not None, not plan.progress.isHidden(), plan.max_batch.text()))
        if window.recommendations is not None:
            answered.set()

    bridge = window.session.bridge
    bridge.progress.connect(check)
    bridge.result.connect(check)
    window.auto_plan = True
    assert window.open_template("mlp")
    qtbot.waitUntil(lambda: window.max_batch is not None, timeout=180000)
    assert window.recommendations is not None and plan.progress.isHidden()
    assert not [s for s in seen if s[1] and s[2]], seen  # never the answer and a bar still waiting for it
    lines = [text for kind, _answer, _bar, text in seen if kind == "max_batch"]
    assert "Largest batch that fits: searching… (estimating batch 64, 40 %)" in lines
    assert "Largest batch that fits: searching… (estimating batch 96)" in lines
    assert plan.max_batch.text().startswith("Largest batch that fits in ")  # its answer, once it came
