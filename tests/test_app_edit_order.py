"""The app's edit → numbers path (issue 24): the engine process runs its jobs one at a time, in the order they are
asked for, so a read-only model's estimate is asked for before its module tree; and the step the engine process
keeps for the planner is let go before the next estimate is traced, not held through it."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.jobs import calls as jobs  # noqa: E402
from engine.planning import reuse  # noqa: E402
from engine.sketch.document import load_template  # noqa: E402
from gui.builder.document import SketchDocument  # noqa: E402
from gui.session import EngineSession  # noqa: E402
from gui.workspace import Workspace  # noqa: E402

CFG = TrainConfig(batch_size=2, device="cpu")


@pytest.fixture
def session():
    s = EngineSession(processes=False)
    yield s
    s.shutdown()


def test_a_read_only_models_estimate_is_asked_for_before_its_module_tree(qtbot, tmp_path, session):
    ws = Workspace(session, SketchDocument(autosave_dir=tmp_path / "autosave"), lambda: None)
    ws.auto_plan, ws.cfg = False, CFG
    asked: list[str] = []
    submit = session.bridge.submit
    session.bridge.submit = lambda kind, fn: (asked.append(kind), submit(kind, fn))[1]  # type: ignore[method-assign]
    with qtbot.waitSignal(ws.treeReady, timeout=120000):
        ws.open_ref("resnet18")
        assert asked == []  # nothing before the open model is shown
        ws.model_opened()
    assert asked == ["estimate", "tree"]
    qtbot.waitUntil(lambda: ws.estimate is not None, timeout=120000)


def test_the_kept_step_is_let_go_before_the_next_estimate_is_traced(monkeypatch):
    spec = ("sketch", load_template("mlp").to_json(), None)
    first = jobs.estimate(spec, CFG)
    assert jobs.kept_step(spec, CFG) is not None  # what the planner reuses
    held: list[int] = []
    traced_step = reuse.traced_step

    def watched(*args, **kwargs):
        held.append(len(jobs._last_step))
        return traced_step(*args, **kwargs)

    monkeypatch.setattr(reuse, "traced_step", watched)
    second = jobs.estimate(spec, CFG.with_(batch_size=4))
    assert held == [0]  # nothing of the previous estimate kept while this one traced
    assert jobs.kept_step(spec, CFG.with_(batch_size=4)) is not None and jobs.kept_step(spec, CFG) is None
    assert second.peak_bytes > first.peak_bytes


def test_start_up_objects_are_put_out_of_the_collectors_reach(monkeypatch):
    import gc

    from gui.app import settle_heap

    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))  # the suite's own heap is left as it is
    before = len(gc.get_objects())
    settle_heap()
    assert frozen == [True] and len(gc.get_objects()) <= before  # collected first, then frozen


def test_the_app_settles_its_heap_once_the_window_is_built_before_its_event_loop(monkeypatch):
    import gui.app as app_module
    import gui.main_window as main_window

    order: list[str] = []

    class App:
        def exec(self) -> int:
            order.append("exec")
            return 0

    class Document:
        def offer_recovery(self, _window) -> bool:
            return False

    class Window:
        def __init__(self, _settings) -> None:
            order.append("window")
            self.document = Document()

        def show(self) -> None:
            pass

        def open_default(self) -> bool:
            order.append("open")
            return True

    monkeypatch.setattr(app_module, "make_app", App)
    monkeypatch.setattr(app_module, "end_on_signals", lambda _app, _end: None)
    monkeypatch.setattr(app_module, "settle_heap", lambda: order.append("settle"))
    monkeypatch.setattr(main_window, "MainWindow", Window)
    assert app_module.run_app() == 0
    assert order == ["window", "open", "settle", "exec"]
