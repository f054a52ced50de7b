"""The app as a new user meets it (issue 13): the standard keys, the docks per tab, what each view says about
the figures it shows. Driven with real key and mouse events on the offscreen platform."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from tests.app_windows import held_until, press  # noqa: E402


def test_undo_and_both_redo_keys_work_from_the_keyboard(qtbot, window):
    assert window.open_template("mlp")
    canvas = window.builder.canvas()
    canvas.setFocus()
    stack = window.undo_stack()
    keys = [k.toString() for k in window.act_redo.shortcuts()]
    assert len(keys) == len(set(keys)) and {"Ctrl+Shift+Z", "Ctrl+Y"} <= set(keys)  # each bound once
    n_nodes = len(window.current_sketch().nodes)
    window.builder.add_layer("ReLU")
    assert len(window.current_sketch().nodes) == n_nodes + 1
    for redo in ("Ctrl+Shift+Z", "Ctrl+Y"):
        press(qtbot, canvas, "Ctrl+Z")
        assert len(window.current_sketch().nodes) == n_nodes, "Ctrl+Z did not undo"
        press(qtbot, canvas, redo)
        assert len(window.current_sketch().nodes) == n_nodes + 1, f"{redo} did not redo"
    assert stack.canUndo()


def _contrast(a, b) -> float:
    def lum(c):
        ch = [x / 255 for x in (c.red(), c.green(), c.blue())]
        ch = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in ch]
        return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2]

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("dark", [False, True])
@pytest.mark.parametrize("needed", [55, 95, 120])  # green, amber, red
def test_the_gauge_words_read_over_its_fill(qtbot, needed, dark):
    from PySide6.QtGui import QColor, QPalette

    from gui.results.summary import FitGauge

    g = FitGauge()
    qtbot.addWidget(g)
    if dark:
        pal = g.palette()
        pal.setColor(QPalette.ColorRole.Text, QColor("#e6e6e6"))
        pal.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
        g.setPalette(pal)
    g.resize(320, 24)
    g.set_values(needed * 2**30, 100 * 2**30)
    img = g.grab().toImage()
    fill_end = int(320 * min(1.0, needed / 100)) - 8
    fill = QColor(img.pixel(fill_end, 12))
    # The words over the fill ("fits", "does not fit") in a colour that stands out from it (WCAG AA: 4.5:1).
    best = max(_contrast(QColor(img.pixel(x, y)), fill) for x in range(4, min(fill_end, 120)) for y in range(4, 20))
    assert best >= 4.5, (fill.name(), best)


def test_the_gauge_compares_with_one_figure_before_and_after_the_trace(qtbot, window, monkeypatch):
    # The analytic and the traced jobs run on threads of their own: an analytic answer that comes after its edit's
    # trace is dropped (stale), never shown. Here each trace is held until its edit's analytic figures are on
    # screen, so the gauge is read with both, on any machine (a late one made the waits below time out).
    from engine.jobs import calls as jobs

    gauge = window.results.summary.gauge
    shown = threading.Event()
    with_analytic: list[int | None] = []  # the gauge's total with each edit's analytic figures on screen
    window.analyticReady.connect(lambda _res: (with_analytic.append(gauge.total), shown.set()))
    monkeypatch.setattr(jobs, "estimate", held_until(shown, jobs.estimate))
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        window.open_template("mlp")
    traced_total = gauge.total
    shown.clear()
    with qtbot.waitSignal(window.estimateReady, timeout=60000):  # the analytic figures now, the trace after them
        window.request_estimate()
    assert with_analytic == [traced_total, traced_total]  # was 80.00 GiB, then 79.36 GiB
    assert gauge.total == traced_total and "79.36 GiB usable" in window.results.summary.gpu_line.text()


def test_the_batch_box_refuses_minus_five_visibly_and_takes_large_batches(qtbot, window):
    box = window.config_panel.batch
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, "-5")
    assert box.value() != -5
    msg = window.config_panel.message
    assert msg.isVisible() and "at least 1" in msg.text() and "Batch size" in msg.text()
    box.selectAll()
    qtbot.keyClicks(box, "2000000")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 2_000_000  # was capped at 999,999
    with qtbot.waitSignal(window.config_panel.configChanged, timeout=5000) as blocker:
        pass
    assert blocker.args[0].batch_size == 2_000_000
    assert not msg.isVisible()  # a valid edit clears the message


def test_record_is_offered_only_with_a_gpu_to_record(qtbot):
    from engine.monitor.nvml import NvmlSource
    from gui.monitor import MonitorPanel
    from tests.fake_nvml import FakeNvml, fake_details, three_gpus

    none = MonitorPanel(source=NvmlSource(FakeNvml([], library_missing=True)), autostart=False)
    qtbot.addWidget(none)
    none.show()
    none.sample_now()
    none.refresh()
    assert not none.record_button.isEnabled() and "nothing to record" in none.record_button.toolTip()
    qtbot.mouseClick(none.record_button, Qt.MouseButton.LeftButton)  # a click does nothing, asks nothing
    assert not none.record_button.isChecked() and none.recorded_samples is None
    none.shutdown()

    gpus = MonitorPanel(source=NvmlSource(FakeNvml(three_gpus()), process_details=fake_details), autostart=False)
    qtbot.addWidget(gpus)
    gpus.sample_now()
    gpus.refresh()
    assert gpus.record_button.isEnabled()
    gpus.shutdown()


def test_about_says_which_figures_are_exact_and_which_modelled(qtbot, window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append(text))
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text().replace("&", "") == "Help")
    next(a for a in help_menu.actions() if "About" in a.text()).trigger()
    text = shown[0]
    assert "modelled" in text and "nvidia-smi" in text
    assert "exact" in text.split("modelled")[0]  # exact: the traced tensor bytes, said before the modelled part


def test_the_monitor_tab_has_the_room_and_the_builder_gets_its_docks_back(qtbot, window, monkeypatch):
    import gui.monitor
    from engine.monitor.nvml import NvmlSource
    from tests.fake_nvml import FakeNvml, fake_details, three_gpus

    real = gui.monitor.MonitorPanel
    monkeypatch.setattr(gui.monitor, "MonitorPanel", lambda: real(
        source=NvmlSource(FakeNvml(three_gpus()), process_details=fake_details), interval=0.2))
    window.resize(1360, 900)
    qtbot.wait(100)
    heights = (window.config_dock.height(), window.results_dock.height())
    press(qtbot, window, "Ctrl+2")
    assert window.tabs.currentIndex() == 1 and window.monitor is not None
    qtbot.waitUntil(lambda: window.monitor.buffer.last() is not None, timeout=5000)
    window.monitor.refresh()
    qtbot.wait(200)
    assert not window.config_dock.isVisible() and not window.results_dock.isVisible()
    room = window.tabs.currentWidget()
    assert room.height() >= 800  # the whole window below the tab bar, no docks
    assert not room.verticalScrollBar().isVisible()
    for pw in window.monitor.plots.plots.values():
        assert pw.height() >= 150, pw.height()
        axis = pw.getAxis("left")
        assert axis.isVisible() and axis.height() >= 60
    window.grab().save(str(_shots() / "monitor_tab.png"))
    press(qtbot, window, "Ctrl+1")
    assert window.config_dock.isVisible() and window.results_dock.isVisible()
    qtbot.waitUntil(lambda: (window.config_dock.height(), window.results_dock.height()) == heights, timeout=2000)
    # The monitor keeps its own layout: a dock the user shows there stays shown there, and only there.
    press(qtbot, window, "Ctrl+2")
    window.results_dock.show()
    press(qtbot, window, "Ctrl+1")
    press(qtbot, window, "Ctrl+2")
    assert window.results_dock.isVisible() and not window.config_dock.isVisible()
    window.monitor.shutdown()


def _shots():
    import os
    from pathlib import Path

    d = Path(os.environ.get("VRAMSCOPE_SHOTS", "/tmp/vramscope-shots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_node_text_is_large_and_dark_enough_to_read(qtbot, window):
    from PySide6.QtGui import QColor, QPalette

    from gui.builder.node_item import secondary_text

    assert window.open_template("mlp")
    node = next(iter(window.builder.canvas().scene_().nodes.values()))
    _title, body, _mono = node._fonts()
    assert body.pointSizeF() >= 10.0
    pal = window.builder.canvas().palette()
    text, base = pal.color(QPalette.ColorRole.Text), QColor("#ffffff")
    muted = secondary_text(text)
    # The muted colour as painted on the white card.
    a = muted.alphaF()
    seen = QColor.fromRgbF(*(a * c + (1 - a) * 1.0 for c in (muted.redF(), muted.greenF(), muted.blueF())))
    assert _contrast(seen, base) >= 7.0  # WCAG AAA for small text


def test_a_saved_sketch_keeps_its_training_setup_and_its_name(qtbot, window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from engine.sketch.codegen import class_name

    assert window.open_template("mlp")
    panel = window.config_panel
    panel.batch.setFocus()
    panel.batch.selectAll()
    qtbot.keyClicks(panel.batch, "7")
    panel.optimizer.setCurrentIndex(panel.optimizer.findData("sgd"))
    panel.precision.setCurrentIndex(panel.precision.findData("bf16"))
    window.document.sketch.name = "untitled"  # as a New sketch is
    asked = []
    target = tmp_path / "work" / "mynet.json"
    target.parent.mkdir()

    def save_dialog(parent, caption, start, filt):
        asked.append(start)
        return str(target), filt

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    press(qtbot, window, "Ctrl+Shift+S")  # Save As…
    assert target.is_file()
    assert window.windowTitle().startswith("mynet.json")
    # Another setup, another sketch; then the saved one again brings its own back.
    window.new_sketch()
    panel.batch.setValue(64)
    panel.optimizer.setCurrentIndex(panel.optimizer.findData("adamw"))
    panel.flush()
    assert window.open_path(str(target))
    cfg = window.config()
    assert (cfg.batch_size, cfg.optimizer, cfg.precision) == (7, "sgd", "bf16")
    assert window.current_sketch().name == "mynet"  # the report's title and the exported class
    assert class_name(window.current_sketch().name) == "Mynet"
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        window.request_estimate(immediate=True)
    assert blocker.args[0].model_name == "mynet"
    # The next file dialog opens in the folder the user last chose.
    window.export_code_dialog()
    assert asked[-1] == str(target.parent / "mynet.py")


def test_files_that_fail_to_open_do_not_join_open_recent(qtbot, window, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    assert not window.open_path(str(broken))
    assert str(broken.resolve()) not in window.recent_files()
    raising = tmp_path / "model.py"
    raising.write_text("def build(batch_size):\n    raise RuntimeError('no weights here')\n")
    ref = f"{raising}:build"
    with qtbot.waitSignal(window.estimateFailed, timeout=60000):
        window.open_path(ref)
    qtbot.waitUntil(lambda: not window.bridge.is_busy("tree"), timeout=30000)
    assert ref not in window.recent_files() and str(raising) not in " ".join(window.recent_files())
    good = tmp_path / "good.py"
    good.write_text("import torch\n\ndef build(batch_size):\n"
                    "    return torch.nn.Linear(4, 2), torch.zeros(batch_size, 4)\n")
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        window.open_path(f"{good}:build")
    qtbot.waitUntil(lambda: f"{good}:build" in window.recent_files(), timeout=30000)


def test_profiling_progress_moves_with_the_step(qtbot, window):
    """The Measured tab's bar follows the real run phase by phase (it sat at 10 % until the end)."""
    assert window.open_template("mlp")
    seen: list[tuple[int, str]] = []
    bar = window.results.compare.progress
    bar.valueChanged.connect(lambda v: seen.append((v, window.results.compare.message.text())))
    with qtbot.waitSignal(window.bridge.result, timeout=120000, check_params_cb=lambda k, *_: k == "profile"):
        press(qtbot, window, "Ctrl+R")
    values = [v for v, _ in seen]
    assert len(set(values)) >= 6 and values == sorted(values), values  # many steps forward, never back
    texts = " | ".join(t for _, t in seen)
    for phase in ("step 1: forward", "step 1: backward", "step 1: optimizer", "step 2: optimizer"):
        assert phase in texts, texts


# ---- what each view says about its figures (issue 13, item 3)

def _opened(qtbot, window, name="mlp"):
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        assert window.open_template(name)
    return blocker.args[0]


def test_new_sketch_leaves_no_old_figures(qtbot, window):
    _opened(qtbot, window)
    assert window.results.freshness == "current" and window.status_label.text().startswith("peak ")
    window.builder.canvas().setFocus()
    press(qtbot, window, "Ctrl+N")
    r = window.results
    assert r.estimate is None and r.timeline.estimate() is None and r.donut.breakdown() == {}
    assert r.summary.peak.text() == "—" and window.status_label.text() == ""
    assert r.freshness == "empty" and r.banner.isVisible()


def test_a_broken_sketch_says_its_figures_are_older_and_stops_estimating(qtbot, window):
    from gui.builder import commands as C

    first = _opened(qtbot, window)
    with qtbot.waitSignal(window.estimateFailed, timeout=60000) as failed:
        window.document.push(C.SetFieldCommand(window.document, "fc2", "in_features", 100))
    message = failed.args[0]
    qtbot.waitUntil(lambda: not window.session.is_busy("estimate"), timeout=30000)
    r = window.results
    assert r.summary.status.text() != "estimating…"  # it said so forever
    assert r.freshness == "stale" and "last version that built" in r.banner.text()
    assert r.summary.error.isVisible() and r.summary.error.text() == message
    assert "(last version that built)" in window.status_label.text()
    assert window.statusBar().currentMessage() == message
    window.grab().save(str(_shots() / "broken_sketch.png"))
    window.builder.canvas().setFocus()
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as fixed:
        press(qtbot, window, "Ctrl+Z")
    assert fixed.args[0].peak_bytes == first.peak_bytes
    assert r.freshness == "current" and not r.banner.isVisible() and not r.summary.error.isVisible()
    assert window.statusBar().currentMessage() == ""  # the fixed error left the status bar


def test_another_model_never_shows_the_previous_ones_figures(qtbot, window, tmp_path):
    _opened(qtbot, window)
    assert window.open_model("resnet18")
    r = window.results
    assert r.estimate is None and r.summary.peak.text() == "—" and r.timeline.estimate() is None
    assert r.freshness == "empty" and "resnet18" in r.banner.text()
    raising = tmp_path / "model.py"
    raising.write_text("def build(batch_size):\n    raise RuntimeError('no weights here')\n")
    with qtbot.waitSignal(window.estimateFailed, timeout=60000):
        window.open_path(f"{raising}:build")
    assert r.estimate is None and r.summary.peak.text() == "—" and r.layers.model.rowCount() == 0
    assert "does not build" in r.banner.text() and "no weights here" in r.summary.error.text()


# ---- advice (issue 13, item 5)

def test_the_plan_tab_shows_progress_and_the_quick_answers_first_and_the_report_carries_the_plan(
        qtbot, window, tmp_path):
    pypdf = pytest.importorskip("pypdf")
    window.auto_plan = True
    order: list[str] = []
    plan = window.results.plan
    plan.progress.valueChanged.connect(lambda _v: order.append("progress") if "progress" not in order else None)
    quick_shown = []
    real_quick = window.ws._show_quick_recommendations

    def quick(value):
        quick_shown.append(list(value))
        order.append("quick")
        real_quick(value)

    window.ws._show_quick_recommendations = quick
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    assert not plan.progress.isHidden() or window.recommendations is not None  # where the answer will appear
    out = tmp_path / "mlp.pdf"
    window.export_report(str(out), full=True)  # while the planner works: the full-plan report waits for it
    # (on threads each kind has its own lane: under load the full plan may answer before the quick one)
    qtbot.waitUntil(lambda: window.recommendations is not None and bool(quick_shown), timeout=180000)
    assert quick_shown and order.index("quick") < len(order)
    # the quick answers need no new forward/backward: formulas, sharding, or another optimizer (its step traced
    # again on the estimate's own trace, engine.planning.reuse)
    step = window.results.estimate.config
    assert all(r.analytic or r.config is not None and (
        r.config.world_size > 1 or r.config.with_(optimizer=step.optimizer, fused=step.fused) == step)
        for r in quick_shown[0])
    assert plan.progress.isHidden()
    qtbot.waitUntil(out.exists, timeout=60000)
    qtbot.waitUntil(lambda: not window.session.is_busy("report"), timeout=60000)
    import re

    text = re.sub(r"\s+", " ", " ".join(p.extract_text() for p in pypdf.PdfReader(str(out)).pages))
    assert "vramscope plan" not in text  # the app's own plan is in it
    for r in window.recommendations[:3]:
        assert r.title.split(" (")[0] in text


def test_resnet18_at_the_apps_defaults_is_offered_activation_checkpointing():
    """Its peak is mostly activations; checkpointing its blocks is the classic answer (traced, not assumed)."""
    from engine.config.train_config import TrainConfig
    from engine.models.sources import resolve_source
    from engine.planning.planner import recommend

    cfg = TrainConfig(batch_size=32, gpu="A100 80GB")
    recs = recommend(resolve_source("resnet18"), cfg)
    ck = next(r for r in recs if r.title == "Activation checkpointing")
    assert ck.saves_bytes > 0.1 * (ck.new_peak_bytes + ck.saves_bytes) and "layer1.0" in ck.detail


# ---- built-in models as a graph of blocks (issue 13, item 7)

def test_a_built_in_model_is_a_graph_of_folded_blocks_with_memory(qtbot, window):
    from engine.results.module_groups import blocks

    with qtbot.waitSignal(window.estimateReady, timeout=120000) as ready:
        assert window.open_model("resnet18")
    est = ready.args[0]
    qtbot.waitUntil(lambda: bool(window.block_graph.items_by_name), timeout=30000)
    graph = window.block_graph
    assert window.builder_stack.currentWidget() is window.model_views and window.model_views.currentWidget() is graph
    names = list(graph.items_by_name)
    assert "layer1.0–1" in names and "conv1" in names and "fc" in names  # two BasicBlocks folded into one
    shown = blocks(window.ws.tree_rows, est.per_module)
    assert sum(b.parameters for b in shown) == 11_689_512  # torchvision's count, every parameter in a block
    layer4 = graph.items_by_name["layer4.0–1"]
    assert layer4.block.bytes_at_peak == sum(r.bytes_at_peak for r in est.per_module if r.name.startswith("layer4."))
    # A click on a folded block shows its sub-blocks, summed over its members; another hides them.
    graph.show()
    center = graph.mapFromScene(layer4.sceneBoundingRect().center())
    qtbot.mouseClick(graph.viewport(), Qt.MouseButton.LeftButton, pos=center)
    assert "layer4.0–1.conv1 ×2" in [i.block.label for i in graph.items_by_name.values()]
    window.grab().save(str(_shots() / "block_graph.png"))
    layer4 = graph.items_by_name["layer4.0–1"]
    center = graph.mapFromScene(layer4.sceneBoundingRect().center())
    qtbot.mouseClick(graph.viewport(), Qt.MouseButton.LeftButton, pos=center)
    assert "layer4.0–1.conv1" not in graph.items_by_name


def test_when_the_re_traced_advice_fails_the_quick_answers_still_reach_the_report(qtbot, window, tmp_path,
                                                                                   monkeypatch):
    import engine.planning.planner

    real = engine.planning.planner.recommend

    def failing(*args, quick=False, **kw):
        if not quick:
            raise engine.planning.planner.UserError("a re-trace failed")
        return real(*args, quick=quick, **kw)

    monkeypatch.setattr(engine.planning.planner, "recommend", failing)
    window.auto_plan = True
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    qtbot.waitUntil(lambda: not window.session.is_busy("plan") and window.recommendations is not None,
                    timeout=120000)
    step = window.results.estimate.config  # the quick answers: formulas, sharding, another optimizer (reused trace)
    assert window.recommendations and all(r.analytic or r.config.world_size > 1 or r.config.with_(
        optimizer=step.optimizer, fused=step.fused) == step for r in window.recommendations)
    assert "a re-trace failed" in window.results.plan.note.text()
