"""gui.workspace without a widget: a real engine session (on threads) and a sketch document, the figures that
come back checked against the engine's own estimate and published parameter counts, stale answers dropped, an
empty or broken sketch handled, the planner's largest batch checked trace by trace, and a real CPU profile run
kept as the measurement."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.jobs.calls import recommend  # noqa: E402
from engine.models.sources import SketchSource  # noqa: E402
from engine.planning.estimator import estimate  # noqa: E402
from engine.sketch.document import load_template  # noqa: E402
from gui.builder.document import SketchDocument  # noqa: E402
from gui.session import EngineSession  # noqa: E402
from gui.workspace import Workspace  # noqa: E402

# MLP template: Linear(784→512), Linear(512→256), Linear(256→10); a Linear holds in·out weights + out biases.
MLP_PARAMETERS = (784 * 512 + 512) + (512 * 256 + 256) + (256 * 10 + 10)
LENET_PARAMETERS = 61_706  # LeNet-5 as LeCun et al. (1998) count it
RESNET18_PARAMETERS = 11_689_512  # torchvision's resnet18
CFG = TrainConfig(batch_size=4, device="cpu")


def _workspace(qtbot, tmp_path, **kw) -> Workspace:
    session = EngineSession(processes=False)  # threads: quick to start, the same routing
    ws = Workspace(session, SketchDocument(autosave_dir=tmp_path / "autosave"), kw.pop("target", lambda: None),
                   **kw)
    ws.auto_plan = False
    ws.cfg = CFG
    return ws


@pytest.fixture
def ws(qtbot, tmp_path):
    w = _workspace(qtbot, tmp_path)
    yield w
    w.session.shutdown()


def _open(qtbot, ws: Workspace, template: str | None):
    ws.document.new(template=template)
    ws.open_sketch()
    ws.model_opened()


def _open_and_wait(qtbot, ws: Workspace, template: str):
    with qtbot.waitSignal(ws.estimateReady, timeout=60000) as blocker:
        _open(qtbot, ws, template)
    return blocker.args[0]


def _truth(sketch, cfg=CFG):
    return estimate(SketchSource(sketch), cfg)


def test_a_sketch_opened_gets_the_engines_traced_estimate(qtbot, ws):
    widgets = len(QApplication.allWidgets())
    seen: list[str] = []
    ws.opened.connect(lambda: seen.append("opened"))
    ws.estimating.connect(lambda empty: seen.append(f"estimating empty={empty}"))
    est = _open_and_wait(qtbot, ws, "mlp")
    assert seen[:2] == ["opened", "estimating empty=False"]
    assert est.parameters == MLP_PARAMETERS
    assert est.peak_bytes == _truth(load_template("mlp")).peak_bytes
    assert ws.estimate is est and ws.display_name() == "MLP" and ws.model_kind == "sketch"
    assert ws.session.shown_revision == ws.session.revision  # this edit's late analytic answer is dropped
    assert len(QApplication.allWidgets()) <= widgets  # the workspace owns no widget


def test_an_edit_gets_its_analytic_figures_at_once_and_no_trace_before_the_debounce(qtbot, tmp_path):
    ws = _workspace(qtbot, tmp_path, debounce_ms=600_000)  # the debounced trace never comes in this test
    try:
        with qtbot.waitSignal(ws.estimateReady, timeout=60000):
            _open(qtbot, ws, "mlp")  # opening asks for the trace at once, not after the debounce
        first = ws.estimate
        sketch = ws.current_sketch()
        sketch.set_field("fc1", "out_features", 256)
        sketch.set_field("fc2", "in_features", 256)
        with qtbot.waitSignal(ws.analyticReady, timeout=30000) as blocker:
            ws.sketch_edited()
        nodes = blocker.args[0].nodes
        assert nodes["fc1"].parameters == 784 * 256 + 256 and nodes["fc2"].parameters == 256 * 256 + 256
        assert not ws.session.is_busy("estimate") and ws.estimate is first  # the trace waits for the debounce
    finally:
        ws.session.shutdown()


def test_the_trace_after_the_debounce_is_of_the_edited_sketch(qtbot, ws):
    _open_and_wait(qtbot, ws, "mlp")
    sketch = ws.current_sketch()
    sketch.set_field("fc1", "out_features", 256)
    sketch.set_field("fc2", "in_features", 256)
    with qtbot.waitSignal(ws.estimateReady, timeout=60000) as blocker:
        ws.sketch_edited()
    est = blocker.args[0]
    assert est.parameters == (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)
    assert est.peak_bytes == _truth(sketch).peak_bytes


def test_a_newer_configuration_replaces_the_older_answer(qtbot, ws):
    _open_and_wait(qtbot, ws, "mlp")
    shown: list[int] = []
    ws.traced.connect(lambda est: shown.append(est.config.batch_size))
    ws.set_config(CFG.with_(batch_size=3))
    ws.set_config(CFG.with_(batch_size=5))
    qtbot.waitUntil(lambda: bool(shown), timeout=60000)
    qtbot.waitUntil(lambda: not ws.session.is_busy(), timeout=60000)
    qtbot.wait(100)
    assert shown == [5]  # the batch-3 answer never came back
    assert ws.estimate.config.batch_size == 5 and ws.config().batch_size == 5
    assert ws.document.sketch.training == ws.config().to_json()  # a sketch stores its configuration


def test_opening_another_model_drops_the_answers_for_the_one_before(qtbot, ws):
    shown: list[int] = []
    ws.traced.connect(lambda est: shown.append(est.parameters))
    _open(qtbot, ws, "mlp")  # not waited for
    est = _open_and_wait(qtbot, ws, "lenet")
    qtbot.waitUntil(lambda: not ws.session.is_busy(), timeout=60000)
    qtbot.wait(100)
    assert shown == [LENET_PARAMETERS] and est.parameters == LENET_PARAMETERS
    assert ws.display_name() == "LeNet-5"


def test_an_emptied_sketch_asks_the_engine_for_nothing(qtbot, ws):
    _open_and_wait(qtbot, ws, "mlp")
    # The open's analytic job may end after its trace (its own thread; stale then): done first, so that a job busy
    # below is one the emptied sketch asked for (a job is busy from the moment it is submitted).
    qtbot.waitUntil(lambda: not ws.session.is_busy(), timeout=30000)
    empty: list[bool] = []
    ws.estimating.connect(empty.append)
    _open(qtbot, ws, None)  # File ▸ New: no layers yet
    assert empty == [True]
    assert ws.estimate is None and ws.open_model_spec() is None
    assert not ws.session.is_busy("estimate") and not ws.session.is_busy("analytic")


def test_a_sketch_that_does_not_build_says_why_in_one_line_and_keeps_the_last_estimate(qtbot, ws):
    good = _open_and_wait(qtbot, ws, "mlp")
    ws.current_sketch().set_field("fc2", "in_features", 100)  # fc1 gives 512 features: shapes do not fit
    failed: list[str] = []
    ws.modelFailed.connect(failed.append)
    with qtbot.waitSignal(ws.estimateFailed, timeout=60000) as blocker:
        ws.request_estimate(immediate=True)
    message = blocker.args[0]
    assert "\n" not in message and "fc2" in message and "100" in message
    assert message in failed  # the views are told too
    assert ws.estimate is good


def test_the_planner_finds_the_largest_batch_that_fits_the_target(qtbot, tmp_path):
    budget = 12 << 20
    ws = _workspace(qtbot, tmp_path, target=lambda: budget)
    ws.auto_plan = True
    started: list[tuple[object, bool]] = []
    ws.planStarted.connect(lambda b, generating: started.append((b, generating)))
    try:
        with qtbot.waitSignal(ws.maxBatchFound, timeout=180000) as blocker:
            _open(qtbot, ws, "mlp")
        found = blocker.args[0]
        assert started == [(budget, False)]  # a CPU estimate names no GPU: the target's budget, peak compared
        assert ws.max_batch is found and found.budget_bytes == budget
        sketch = ws.current_sketch()
        assert _truth(sketch, CFG.with_(batch_size=found.batch_size)).peak_bytes <= budget
        assert _truth(sketch, CFG.with_(batch_size=found.batch_size + 1)).peak_bytes > budget
    finally:
        ws.session.shutdown()


def test_when_the_re_traced_plan_fails_the_quick_answers_are_the_plan(qtbot, ws):
    est = _open_and_wait(qtbot, ws, "mlp")
    quick = recommend(ws.source_spec(), est.config, est, True)  # the engine's own quick answers
    assert quick
    shown: list[tuple[object, str]] = []
    ws.quickPlan.connect(lambda recs, failed: shown.append((recs, failed)))
    settled: list[bool] = []
    ws.planSettled.connect(lambda: settled.append(True))
    ws._plan_error("--mode generate needs a text model")  # the re-traced answers failed first
    assert ws.recommendations is None and settled == [True]
    ws._show_quick_recommendations(quick)
    assert ws.recommendations == quick  # what the report will carry
    assert shown == [(quick, "Mode “Generation (KV cache)” needs a text model")]  # in the panel's terms


def test_a_built_in_model_opens_read_only_with_its_module_tree(qtbot, ws):
    with qtbot.waitSignal(ws.treeReady, timeout=120000) as blocker:
        ws.open_ref("resnet18")
        ws.model_opened()
    rows = blocker.args[0]
    assert rows[0][0] == "" and rows[0][3] == RESNET18_PARAMETERS
    assert ws.tree_rows == rows and ws.model_kind == "template" and ws.display_name() == "resnet18"
    assert ws.source_spec() == ("ref", "resnet18") and not ws.is_dirty()


def test_a_profile_run_is_kept_as_the_measurement(qtbot, ws):
    est = _open_and_wait(qtbot, ws, "mlp")
    events: list[str] = []
    ws.profileStarted.connect(lambda: events.append("started"))
    with qtbot.waitSignal(ws.measuredReady, timeout=180000):
        assert ws.profile()
    assert events == ["started"]
    measured = ws.measured
    assert measured is not None and measured.parameters == MLP_PARAMETERS  # the real model that ran
    # Parameters, gradients and Adam's two moments at least: the real step held them all at once.
    assert measured.peak_bytes >= 4 * MLP_PARAMETERS * 4
    assert ws.measured_against is None or ws.measured_against.config.batch_size == est.config.batch_size
    ws.drop_measured()
    assert ws.measured is None and ws.measured_against is None
