"""The main window on the offscreen platform: it opens, a configuration change goes through the bridge and the
result view shows the engine's peak, a newer job replaces an older one, an engine error keeps the user's work."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings  # noqa: E402

import engine.sketch.document as sketch_mod  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402
from tests.app_windows import held_until, open_template, open_window  # noqa: E402

# MLP template: Linear(784→512), Linear(512→256), Linear(256→10); a Linear holds in·out weights + out biases.
MLP_PARAMETERS = (784 * 512 + 512) + (512 * 256 + 256) + (256 * 10 + 10)


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)  # engine on threads: quick to start
    yield w
    w.close()


@pytest.fixture
def pwindow(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path, processes=True)  # as the app runs: the engine in a worker process
    yield w
    w.close()


def _engine_estimate(sketch, cfg):
    from engine.models.sources import SketchSource
    from engine.planning.estimator import estimate

    return estimate(SketchSource(sketch), cfg)


def test_window_opens_with_menus_and_docks(window):
    titles = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert titles[:4] == ["File", "Edit", "View", "Run"]
    assert window.act_export_report.shortcut().toString() == "Ctrl+E"
    assert "Ctrl+Shift+Z" in [s.toString() for s in window.act_redo.shortcuts()]
    assert window.tabs.tabText(0) == "Builder" and window.tabs.tabText(1) == "Monitor"
    assert window.config_dock.isVisible() and window.results_dock.isVisible()
    assert window.windowTitle().endswith("— VRAMScope")


def test_config_change_runs_through_bridge_and_shows_engine_peak(qtbot, pwindow):
    window = pwindow
    first = open_template(qtbot, window, "mlp")
    assert first.parameters == MLP_PARAMETERS
    assert window.windowTitle().startswith("MLP")

    with qtbot.waitSignal(window.estimateReady, timeout=30000) as blocker:
        window.config_panel.batch.setValue(first.config.batch_size * 2)  # debounced, then one job
    shown = blocker.args[0]
    assert shown.config.batch_size == first.config.batch_size * 2

    truth = _engine_estimate(sketch_mod.load_template("mlp"), window.config())
    assert window.results.summary.peak.text() == format_bytes(truth.peak_bytes)
    assert shown.peak_bytes == truth.peak_bytes
    assert truth.peak_bytes > first.peak_bytes  # twice the batch holds more activations
    # The per-layer table lists the three Linear layers with their published parameter counts.
    model = window.results.layers.model
    params = {model.row_at(r).name: model.row_at(r).parameters for r in range(model.rowCount())}
    assert params["fc1"] == 784 * 512 + 512 and params["fc3"] == 256 * 10 + 10


def test_newer_request_replaces_older_one(qtbot, window):
    open_template(qtbot, window, "mlp")
    seen = []
    window.estimateReady.connect(lambda est: seen.append(est.config.batch_size))
    window.ws.cfg = window.config().with_(batch_size=3)
    window.request_estimate(immediate=True)
    window.ws.cfg = window.config().with_(batch_size=5)
    window.request_estimate(immediate=True)
    qtbot.waitUntil(lambda: bool(seen), timeout=30000)
    qtbot.waitUntil(lambda: not window.bridge.is_busy("estimate"), timeout=30000)
    qtbot.wait(100)
    assert seen == [5]  # the batch-3 answer never reached the view
    assert window.estimate.config.batch_size == 5


@pytest.mark.parametrize("analytic_after_failure", [False, True])
def test_engine_error_is_one_line_and_keeps_the_work(qtbot, window, monkeypatch, analytic_after_failure):
    from engine.jobs import calls as jobs

    good = open_template(qtbot, window, "mlp")
    sketch = window.current_sketch()
    sketch.set_field("fc2", "in_features", 100)  # fc1 gives 512 features: shapes do not fit
    before = sketch.to_json()
    # The edit's analytic answer (its per-node errors) before the trace's failure, or after it: each order held.
    failed, analytic = threading.Event(), threading.Event()
    window.estimateFailed.connect(lambda _message: failed.set())
    window.analyticReady.connect(lambda _res: analytic.set())
    if analytic_after_failure:
        monkeypatch.setattr(jobs, "analytic", held_until(failed, jobs.analytic))
    else:
        monkeypatch.setattr(jobs, "estimate", held_until(analytic, jobs.estimate))
    with qtbot.waitSignal(window.estimateFailed, timeout=30000) as blocker:
        window.request_estimate(immediate=True)
    msg = blocker.args[0]
    assert "fc2" in msg and "\n" not in msg and "Traceback" not in msg
    assert window.results.summary.error.text() == msg
    assert not window.results.summary.error.isHidden()
    # The user's sketch is untouched; the last traced estimate is kept (report, table) and the peak shown is
    # the traced one or, where the analytic estimate covers the rest of the sketch, its partial figure.
    assert window.current_sketch().to_json() == before
    assert window.estimate is good
    shown = {format_bytes(good.peak_bytes)}
    try:
        from engine.sketch.analytic import analytic

        shown.add(format_bytes(analytic(window.current_sketch(), window.config()).peak_bytes))
    except ImportError:
        pass
    assert window.results.summary.peak.text() in shown
    qtbot.waitUntil(lambda: not window.session.is_busy(), timeout=30000)  # the analytic answer has come too
    assert not window.results.summary.error.isHidden()  # it did not clear the error line
    assert window.results.summary.error.text() == msg and window.results.summary.peak.text() in shown


def test_title_marks_unsaved_changes_and_save_clears_it(qtbot, window, tmp_path):
    open_template(qtbot, window, "mlp")
    assert "*" not in window.windowTitle()
    assert window.undo_stack() is window.document.undo_stack()
    from gui.builder import commands as C

    window.document.push(C.SetFieldCommand(window.document, "fc1", "out_features", 256))
    qtbot.waitUntil(lambda: window.windowTitle().startswith("MLP*"), timeout=5000)
    path = tmp_path / "mine.json"
    assert window.save_as(str(path))
    assert window.windowTitle().startswith("mine.json —")
    assert str(path.resolve()) in window.recent_files()
    window.act_undo.trigger()
    assert window.windowTitle().startswith("mine.json*")


def test_export_report_runs_off_the_gui_thread(qtbot, window, tmp_path):
    est = open_template(qtbot, window, "mlp")
    out = tmp_path / "report.pdf"
    with qtbot.waitSignal(window.bridge.result, timeout=60000,
                          check_params_cb=lambda kind, jid, value: kind == "report") as blocker:
        window.export_report(str(out))
    assert blocker.args[2] == str(out)
    assert out.read_bytes()[:5] == b"%PDF-"
    pypdf = pytest.importorskip("pypdf")
    text = " ".join(" ".join(page.extract_text() for page in pypdf.PdfReader(str(out)).pages).split())
    assert format_bytes(est.peak_bytes) in text


def test_monitor_tab_opens_the_panel_or_says_why(qtbot, window):
    window.tabs.setCurrentIndex(1)
    widget = window.tabs.widget(1)
    try:
        from gui.monitor import MonitorPanel
    except ImportError:
        assert widget is window.tabs.monitor_placeholder
    else:
        # the panel, in the scroll area that gives it its own room
        assert isinstance(window.monitor, MonitorPanel) and widget.widget() is window.monitor
    assert window.tabs.tabText(1) == "Monitor"


def test_export_code_writes_a_module_with_the_same_parameters(qtbot, window, tmp_path):
    import importlib.util

    open_template(qtbot, window, "mlp")
    out = tmp_path / "mlp_model.py"
    assert window.export_code(str(out))
    spec = importlib.util.spec_from_file_location("mlp_model", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # a test may run the file it just wrote; the app never does
    model, x = mod.build(2)
    assert sum(p.numel() for p in model.parameters()) == MLP_PARAMETERS
    assert tuple(model(x).shape) == (2, 10)


def test_builtin_model_opens_read_only_with_its_module_tree(qtbot, window):
    from engine.models.templates import TEMPLATES

    assert window.open_model("resnet18")
    assert window.builder_stack.currentWidget() is window.model_views
    assert window.model_views.widget(1) is window.module_tree
    assert "(read-only)" in window.windowTitle()
    qtbot.waitUntil(lambda: window.module_tree.topLevelItemCount() > 0, timeout=30000)
    root = window.module_tree.topLevelItem(0)
    # torchvision's resnet18 has 11,689,512 parameters (its published count, the template's reference).
    assert TEMPLATES["resnet18"].reference_parameters == 11_689_512
    assert root.text(3) == "11.69 M"
    window.bridge.cancel("estimate")  # no need to finish the ResNet trace here


def test_table_row_selects_the_canvas_node_and_back(qtbot, window):
    open_template(qtbot, window, "mlp")
    layers = window.results.layers
    rows = {layers.model.row_at(r).name: r for r in range(layers.model.rowCount())}
    idx = layers.proxy.mapFromSource(layers.model.index(rows["fc2"], 0))
    layers.view.selectRow(idx.row())
    assert window.builder.selected_node() == "fc2"
    window.builder.select_node("fc3")
    qtbot.waitUntil(lambda: layers.selected_module() == "fc3", timeout=2000)


def test_settings_restore_configuration_and_geometry(qtbot, tmp_path):
    from gui.main_window import MainWindow

    path = str(tmp_path / "settings.ini")
    a = MainWindow(QSettings(path, QSettings.Format.IniFormat), engine_processes=False)
    a.confirm_close = False
    qtbot.addWidget(a)
    a.show()
    a.resize(790, 555)  # the offscreen screen is 800×800: restoring clamps the width to it, not the height
    a.config_dock.hide()
    a.config_panel.batch.setValue(7)
    a.config_panel.flush()
    a.close()
    b = MainWindow(QSettings(path, QSettings.Format.IniFormat), engine_processes=False)
    qtbot.addWidget(b)
    assert b.config_panel.batch.value() == 7 and b.config().batch_size == 7
    assert b.height() == 555
    assert b.config_dock.isHidden() and not b.results_dock.isHidden()  # the dock layout came back
    b.confirm_close = False
    b.close()


def test_profile_shows_measured_beside_estimate(qtbot, window):
    est = open_template(qtbot, window, "mlp")
    with qtbot.waitSignal(window.bridge.result, timeout=60000,
                          check_params_cb=lambda kind, jid, value: kind == "profile") as blocker:
        window.profile()
        assert not window.act_profile.isEnabled() and window.act_stop.isEnabled()
    measured, against = blocker.args[2]
    # Adam training holds weights, gradients and two moment buffers of every fp32 parameter at once.
    assert measured.peak_bytes >= MLP_PARAMETERS * 4 * 4
    name, e, m, err = window.results.compare.rows()[0]
    if est.config.device == measured.config.device:
        assert against is None and e == est.peak_bytes
    else:  # the app targets a GPU and the run was on this CPU: compared with the CPU's estimate of the same step
        assert against.config.device == measured.config.device == "cpu"
        assert against.config.batch_size == est.config.batch_size and e == against.peak_bytes
        assert "compared with the estimate for the CPU" in window.results.compare.message.text()
        assert abs(err) <= 0.01  # the tracer on the CPU is exact to within the zoo's bound
    assert (name, m) == ("Peak allocated", measured.peak_bytes)
    assert err == pytest.approx((e - measured.peak_bytes) / measured.peak_bytes)
    assert window.act_profile.isEnabled() and not window.act_stop.isEnabled()


def test_editing_a_layer_gives_analytic_figures_then_the_traced_estimate(qtbot, window, monkeypatch):
    from engine.jobs import calls as jobs
    from gui.builder import commands as C

    open_template(qtbot, window, "mlp")
    order = []
    shown = threading.Event()
    window.analyticReady.connect(lambda res: (order.append(("analytic", res.parameters)), shown.set()))
    window.estimateReady.connect(lambda est: order.append(("traced", est.parameters)))
    # The trace after the debounce waits for the instant figures: on a loaded machine the analytic thread could be
    # slower than the debounce and the trace together, and its answer was then dropped as stale (never shown).
    monkeypatch.setattr(jobs, "estimate", held_until(shown, jobs.estimate))
    window.document.push(C.SetFieldCommand(window.document, "fc1", "out_features", 256))
    qtbot.waitUntil(lambda: any(k == "traced" for k, _ in order), timeout=30000)
    # fc1 now 784→256 and fc2 256→256: the published Linear formula, in·out + out, for each.
    expected = (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)
    assert order == [("analytic", expected), ("traced", expected)]  # the instant figures, then the trace's
    assert window.results.summary.params.text() == f"{expected:,} parameters"


def test_calibrate_without_a_gpu_says_so_in_one_line(window):
    """Run → Calibrate this GPU on a machine without CUDA: one plain line, no job started, the work kept."""
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Run")
    assert window.act_calibrate in menu.actions()
    window.act_calibrate.trigger()
    text = window.statusBar().currentMessage()
    assert text.startswith("No CUDA GPU on this machine") and "\n" not in text
    assert not window.session.is_busy("calibrate")


def test_template_list_offers_the_hugging_face_catalogue(window):
    actions = {a.text(): a for a in window.template_menu.actions()}
    assert "llama-3.1-8b" in actions and "mixtral-8x7b" in actions and "resnet18" in actions
    assert "Hugging Face" in actions["llama-3.1-8b"].statusTip()


def test_the_summary_says_estimating_while_the_trace_runs_whatever_else_runs(qtbot, window, monkeypatch):
    """A configuration edit of a sketch asks for its analytic figures, then its trace: the summary said "traced in …
    s" of the figures before, no spinner, all the while the trace ran (the analytic job had made the engine busy
    first, and the trace's start was not announced). Nor does it say "estimating…" once the trace has answered
    while the analytic job still runs (a slow analytic thread). Each job is held to make the order certain."""
    from engine.jobs import calls as jobs

    open_template(qtbot, window, "mlp")
    qtbot.waitUntil(lambda: not window.session.is_busy(), timeout=30000)
    summary = window.results.summary
    trace, analytic = threading.Event(), threading.Event()
    monkeypatch.setattr(jobs, "estimate", held_until(trace, jobs.estimate))
    monkeypatch.setattr(jobs, "analytic", held_until(analytic, jobs.analytic))
    window.ws.set_config(window.config().with_(batch_size=64))  # what the panel sends after its debounce
    assert window.session.is_busy("estimate") and window.session.is_busy("analytic")
    assert not summary.busy.isHidden() and summary.status.text() == "estimating…"
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        trace.set()
    assert window.session.is_busy("analytic")  # still held
    assert summary.busy.isHidden() and summary.status.text() != "estimating…"
    analytic.set()
    qtbot.waitUntil(lambda: not window.session.is_busy(), timeout=30000)
    assert summary.busy.isHidden() and window.estimate.config.batch_size == 64
