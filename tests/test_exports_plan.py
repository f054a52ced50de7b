"""File ▸ Export report… writes at once with the planner's quick answers (as the CLI's `report --plan quick`, its
default), never waiting for the re-traced answers or the largest batch (issue 24); Export report with full plan…
waits for them, its progress shown in a dialog that cancels the wait."""

from __future__ import annotations

import re
import threading

import pytest

pytest.importorskip("pytestqt")
pypdf = pytest.importorskip("pypdf")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QPushButton  # noqa: E402

from engine.core.errors import Cancelled  # noqa: E402
from engine.jobs import calls as jobs  # noqa: E402
from gui.actions import TABLE  # noqa: E402
from tests.app_windows import open_window  # noqa: E402


def _held(monkeypatch) -> threading.Event:
    """The full plan and the largest-batch search held until the event is set (the quick answers go through)."""
    release = threading.Event()
    search, recommend = jobs.max_batch, jobs.recommend

    def wait(cancel) -> None:
        while not release.wait(0.02):
            if cancel is not None and cancel.is_set():
                raise Cancelled()

    def slow_search(*args, cancel=None, progress=None):
        wait(cancel)
        return search(*args, cancel=cancel, progress=progress)

    def slow_plan(spec, cfg, base=None, quick=False, *, cancel=None, progress=None):
        if not quick:
            if progress is not None:
                progress(0.25, "tracing the step with activation checkpointing")
            wait(cancel)
        return recommend(spec, cfg, base, quick, cancel=cancel, progress=progress)

    monkeypatch.setattr(jobs, "max_batch", slow_search)
    monkeypatch.setattr(jobs, "recommend", slow_plan)
    return release


def _text(path) -> str:
    return re.sub(r"\s+", " ", " ".join(p.extract_text() for p in pypdf.PdfReader(str(path)).pages))


def _report_written(qtbot, window):
    return qtbot.waitSignal(window.bridge.result, timeout=120000,
                            check_params_cb=lambda kind, _jid, _value: kind == "report")


def _opened(qtbot, window, auto_plan: bool = True) -> None:
    window.auto_plan = auto_plan
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")


def test_the_report_is_written_with_the_quick_answers_while_the_full_plan_works(qtbot, tmp_path, monkeypatch):
    release = _held(monkeypatch)
    window = open_window(qtbot, tmp_path)  # the engine on threads
    _opened(qtbot, window)
    out = tmp_path / "mlp.pdf"
    with _report_written(qtbot, window):
        window.export_report(str(out))  # at once, or once the quick answers (seconds) have come
    ws = window.ws
    assert window.session.planning() and ws.recommendations is None and ws.max_batch is None  # still held
    quick = ws.quick_recommendations
    assert quick, "the quick answers of the mlp template (another optimizer, …)"
    text = _text(out)
    for r in quick[:3]:
        assert r.title.split(" (")[0] in text
    assert "Largest batch that fits" not in text or "not computed" in text  # the search had not answered
    assert window.exports.waiting is None and window.exports.progress is None
    release.set()
    window.close()


def test_with_the_planner_off_the_report_asks_for_the_quick_answers_only(qtbot, tmp_path, monkeypatch):
    release = _held(monkeypatch)
    window = open_window(qtbot, tmp_path)
    _opened(qtbot, window, auto_plan=False)
    # (not session.is_busy(): the open's analytic job may still be ending, after its trace, on its own thread)
    assert window.ws.quick_recommendations is None
    assert not window.session.planning() and not window.session.is_busy("plan_quick")  # nothing asked of the planner
    out = tmp_path / "mlp.pdf"
    with _report_written(qtbot, window):
        assert window.export_report(str(out)) == 0  # it waits for the quick answers it asked for
    assert window.ws.quick_recommendations and not window.session.planning()  # and never the full plan
    assert window.ws.quick_recommendations[0].title.split(" (")[0] in _text(out)
    release.set()
    window.close()


def test_the_full_plan_report_waits_with_its_progress_and_the_wait_cancels(qtbot, tmp_path, monkeypatch):
    release = _held(monkeypatch)
    window = open_window(qtbot, tmp_path)
    _opened(qtbot, window)
    ex = window.exports
    out = tmp_path / "full.pdf"
    assert window.export_report(str(out), full=True) == 0
    dialog = ex.progress
    assert dialog is not None and dialog.isVisible() and ex.waiting == (str(out), True)
    qtbot.waitUntil(lambda: "activation checkpointing" in dialog.labelText(), timeout=60000)  # the plan's progress
    assert dialog.value() == 25
    cancel = next(b for b in dialog.findChildren(QPushButton) if b.text() == "Cancel")
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)  # the wait ends; the planner goes on (the Plan tab's)
    assert ex.waiting is None and ex.progress is None and window.session.planning()
    assert "cancelled" in window.statusBar().currentMessage()

    assert window.export_report(str(out), full=True) == 0  # asked again: it waits again
    with _report_written(qtbot, window):
        release.set()
    assert ex.progress is None and window.recommendations is not None and window.max_batch is not None
    text = _text(out)
    assert f"Largest batch that fits {window.max_batch.batch_size}" in text
    for r in window.recommendations[:3]:
        assert r.title.split(" (")[0] in text
    window.close()


def test_the_full_plan_report_runs_the_planner_when_it_is_off(qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    _opened(qtbot, window, auto_plan=False)
    out = tmp_path / "full.pdf"
    with _report_written(qtbot, window):
        assert window.export_report(str(out), full=True) == 0
    assert window.recommendations is not None and window.max_batch is not None
    assert f"Largest batch that fits {window.max_batch.batch_size}" in _text(out)
    window.close()


def test_both_exports_are_file_menu_actions_with_their_keys(qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    items = {i.name: i for i in TABLE if i.menu == "&File"}
    assert items["export_report"].shortcut == "Ctrl+E" and items["export_report_full"].shortcut == "Ctrl+Alt+E"
    file_menu = window.menuBar().actions()[0].menu()
    assert window.acts["export_report_full"] in file_menu.actions()
    window.close()


def test_a_waiting_full_plan_report_of_an_edited_model_asks_the_planner_again(qtbot, tmp_path, monkeypatch):
    release = _held(monkeypatch)
    window = open_window(qtbot, tmp_path)
    _opened(qtbot, window, auto_plan=False)
    out = tmp_path / "edited.pdf"
    assert window.export_report(str(out), full=True) == 0  # the planner, off, is asked for this estimate
    first = window.estimate
    with qtbot.waitSignal(window.estimateReady, timeout=60000):  # an edit while the report waits
        window.ws.set_config(window.config().with_(batch_size=first.config.batch_size * 2))
    edited = window.estimate
    assert edited is not first and window.ws.plan_asked(full=True)  # asked again, for the edited estimate
    assert window.ws.quick_recommendations is None or window.ws.plan_asked(full=False)  # none of the first's
    with _report_written(qtbot, window):
        release.set()
    assert window.recommendations is not None and window.max_batch is not None
    assert window.max_batch.batch_size >= 1 and window.estimate is edited
    window.close()


def test_escape_in_the_full_plan_dialog_cancels_the_wait(qtbot, tmp_path, monkeypatch):
    release = _held(monkeypatch)
    window = open_window(qtbot, tmp_path)
    _opened(qtbot, window)
    assert window.export_report(str(tmp_path / "full.pdf"), full=True) == 0
    dialog = window.exports.progress
    assert dialog is not None
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert window.exports.waiting is None and window.exports.progress is None
    assert "cancelled" in window.statusBar().currentMessage()
    release.set()
    window.close()
