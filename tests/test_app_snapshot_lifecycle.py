"""A memory snapshot belongs to the model it was opened with: another model (New sketch, a template, a file) closes
it, File ▸ Close snapshot drops it from every view and the report, a model that clearly did not run it is warned
about, and one opened alone shows the run (not the empty sketch's hint) until a model is opened beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication, QFileDialog, QMenu  # noqa: E402

import gui.exports as exports  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402
from engine.snapshots.reader import open_snapshot  # noqa: E402
from gui.main_window import EMPTY_SKETCH_HINT  # noqa: E402
from tests.app_windows import open_window, press  # noqa: E402

DATA = Path(__file__).parent / "data"
RESNET18 = DATA / "resnet18-b8-adam.pickle.gz"
OOM = DATA / "resnet18-b512-oom-at-2gib.pickle.gz"


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    w = open_window(qtbot, tmp_path, exposed=True)
    yield w
    w.close()


def _choose(monkeypatch, path: Path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))


def _open_snapshot(qtbot, window, monkeypatch, path: Path, kind: str = "beside"):
    """Ctrl+Shift+O on `path`; waits for the comparison beside the open model (kind "beside") or the read alone."""
    _choose(monkeypatch, path)
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=lambda k, j, v: k == kind) as b:
        press(qtbot, window, "Ctrl+Shift+O")
    return b.args[2]


def _open_model(qtbot, window, name: str):
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as blocker:
        next(a for a in window.template_menu.actions() if a.text() == name).trigger()  # File ▸ Open template
    return blocker.args[0]


def _report_kwargs(qtbot, window, monkeypatch, tmp_path) -> dict:
    """What the report (Ctrl+E) is written with."""
    seen: dict = {}

    def fake(path, est, **kwargs):
        seen.update(kwargs, est=est)
        Path(path).write_bytes(b"%PDF")

    monkeypatch.setattr(exports, "build_report", fake)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(tmp_path / "r.pdf"), "")))
    with qtbot.waitSignal(window.bridge.result, timeout=60000, check_params_cb=lambda k, j, v: k == "report"):
        press(qtbot, window, "Ctrl+E")
    return seen


def _close_from_the_file_menu(qtbot, window) -> None:
    """Alt+F, then the item's accelerator, as a user types it."""
    press(qtbot, window, "Alt+F")
    qtbot.waitUntil(lambda: isinstance(QApplication.activePopupWidget(), QMenu), timeout=5000)
    menu = QApplication.activePopupWidget()
    assert window.act_close_snapshot in menu.actions() and window.act_close_snapshot.isEnabled()
    qtbot.keyClick(menu, Qt.Key.Key_L)
    qtbot.waitUntil(lambda: QApplication.activePopupWidget() is None, timeout=5000)


def _no_snapshot_anywhere(window) -> None:
    r = window.results
    assert window.snapshots.snap is None and not window.act_close_snapshot.isEnabled()
    assert r.compare.rows() == [] and r.compare.measured is None and r.timeline._measured is None
    assert r.plan.real_run.isHidden()
    assert "Real run" not in r.compare.message.text()


def test_another_model_closes_the_snapshot_and_its_plan(qtbot, window, monkeypatch, tmp_path):
    _open_model(qtbot, window, "resnet18")
    assert not window.act_close_snapshot.isEnabled()
    found = _open_snapshot(qtbot, window, monkeypatch, OOM)
    r = window.results
    assert window.act_close_snapshot.isEnabled() and r.timeline._measured is found.snapshot
    assert not r.plan.real_run.isHidden()  # what would have fit, on its way
    kwargs = _report_kwargs(qtbot, window, monkeypatch, tmp_path)
    assert kwargs["measured"] is found.snapshot and kwargs["measured_against"] is found.comparison.estimate
    from report.content import report_facts

    cmp_ = report_facts(kwargs["est"], measured=found.snapshot, measured_against=found.comparison.estimate)
    assert cmp_["comparison"]["against_step"] == "train, batch 512, fp32, adam"  # the run's step, said so
    assert cmp_["comparison"]["against_device"] is None
    # File ▸ Open template ▸ resnet34: not the model that ran, so the run leaves every view and the report
    est = _open_model(qtbot, window, "resnet34")
    _no_snapshot_anywhere(window)
    assert r.estimate is est
    # Its planner's job was cancelled; it ends at the engine's next check, on its own thread (not necessarily before
    # the new model's estimate has come).
    qtbot.waitUntil(lambda: not window.session.is_busy("what_fits"), timeout=30000)
    assert "Closed the snapshot resnet18-b512-oom-at-2gib.pickle.gz" in window.statusBar().currentMessage()
    kwargs = _report_kwargs(qtbot, window, monkeypatch, tmp_path)
    assert kwargs["est"] is est and kwargs["measured"] is None and kwargs["measured_against"] is None


def test_new_sketch_closes_the_snapshot(qtbot, window, monkeypatch):
    _open_model(qtbot, window, "resnet18")
    _open_snapshot(qtbot, window, monkeypatch, RESNET18)
    press(qtbot, window, "Ctrl+N")
    _no_snapshot_anywhere(window)
    assert window.results.banner.text() == EMPTY_SKETCH_HINT and window.results.estimate is None


def test_close_snapshot_in_the_file_menu(qtbot, window, monkeypatch, tmp_path):
    est = _open_model(qtbot, window, "resnet18")
    _open_snapshot(qtbot, window, monkeypatch, RESNET18)
    assert window.results.compare.rows()
    _close_from_the_file_menu(qtbot, window)
    _no_snapshot_anywhere(window)
    assert window.results.estimate is est and window.results.freshness == "current"  # the model's figures stay
    kwargs = _report_kwargs(qtbot, window, monkeypatch, tmp_path)
    assert kwargs["est"] is est and kwargs["measured"] is None


def _parameter_bytes(name: str) -> int:
    import torch

    from engine.config.train_config import TrainConfig
    from engine.models.sources import resolve_source

    with torch.device("meta"):
        model, _inputs = resolve_source(name).build(TrainConfig(batch_size=1))
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def test_a_model_that_did_not_run_the_snapshot_is_warned_about(qtbot, window, monkeypatch, tmp_path):
    # ResNet-50 open, ResNet-18's snapshot opened beside it: its parameters and buffers (the snapshot cannot tell
    # them apart) are ResNet-18's, 2.2 times fewer bytes than ResNet-50's.
    _open_model(qtbot, window, "resnet50")
    found = _open_snapshot(qtbot, window, monkeypatch, RESNET18)
    run, model = _parameter_bytes("resnet18"), _parameter_bytes("resnet50")
    assert open_snapshot(RESNET18).breakdown_at_peak["parameters"] == run
    text = window.results.compare.message.text()
    assert text.startswith(f"Warning: resnet50 holds {format_bytes(model)} of parameters in fp32, the run held "
                           f"{format_bytes(run)} ({model / run:.1f}× more): it is not the model that ran")
    assert "Close snapshot" in text and found.mismatch in window.statusBar().currentMessage()
    assert window.results.timeline._measured is None  # no line of another model's run over its timeline
    kwargs = _report_kwargs(qtbot, window, monkeypatch, tmp_path)
    assert kwargs["measured"] is None
    # the model that ran: no warning
    _open_model(qtbot, window, "resnet18")
    found = _open_snapshot(qtbot, window, monkeypatch, RESNET18)
    assert found.mismatch == "" and not window.results.compare.message.text().startswith("Warning")


def test_a_snapshot_opened_alone_shows_the_run_then_goes_beside_the_model_opened(qtbot, window, monkeypatch):
    press(qtbot, window, "Ctrl+N")
    r = window.results
    assert r.banner.text() == EMPTY_SKETCH_HINT and r.banner.isVisible()
    snap = _open_snapshot(qtbot, window, monkeypatch, RESNET18, kind="snapshot")
    assert r.estimate is snap and not r.banner.isVisible() and r.freshness == "current"
    # a setting changed meanwhile: the run stays on screen, not the hint
    window.config_panel.batch.setValue(4)
    window.config_panel.flush()
    assert r.estimate is snap and not r.banner.isVisible()
    # the model that ran, opened next: the run goes beside its estimate
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=lambda k, j, v: k == "beside") as b:
        est = _open_model(qtbot, window, "resnet18")
    found = b.args[2]
    assert r.estimate is est and window.snapshots.spec == window.source_spec()  # the resnet18 sketch
    assert r.compare.rows()[0][1:3] == found.comparison.rows[0][1:3] and r.timeline._measured is found.snapshot


def test_closing_a_snapshot_shown_alone_brings_the_empty_sketch_back(qtbot, window, monkeypatch):
    press(qtbot, window, "Ctrl+N")
    _open_snapshot(qtbot, window, monkeypatch, OOM, kind="snapshot")
    _close_from_the_file_menu(qtbot, window)
    _no_snapshot_anywhere(window)
    assert window.results.estimate is None and window.results.banner.text() == EMPTY_SKETCH_HINT


def test_a_sketch_built_after_a_snapshot_opened_alone_closes_it(qtbot, window, monkeypatch):
    # The layers dropped on the empty sketch are not the model that ran: the run leaves the views, not compared.
    press(qtbot, window, "Ctrl+N")
    _open_snapshot(qtbot, window, monkeypatch, RESNET18, kind="snapshot")
    said: list[str] = []
    window.statusBar().messageChanged.connect(said.append)
    with qtbot.waitSignal(window.estimateFailed, timeout=60000):
        window.builder.add_layer("Input")
    _no_snapshot_anywhere(window)
    assert any("the sketch built is not the model that ran (open that model, then the snapshot)" in m for m in said)
    assert window.results.estimate is None
