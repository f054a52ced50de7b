"""What a walkthrough of the app under Xvfb with real mouse and keys found, each held with real events: edits that
happened unseen (Delete on the Monitor tab deleted the canvas's selection), a wheel that changed the
configuration while scrolling the panel, and the like."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QWheelEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.sketch.analytic import AnalyticResult  # noqa: E402
from tests.app_windows import held_until, press  # noqa: E402


def _lora_mlp(qtbot, window):
    """The MLP template's estimate with LoRA on all its Linear layers, chosen in the config panel."""
    panel = window.config_panel
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    panel.lora_targets.setText("all-linear")
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        panel.peft.setCurrentIndex(panel.peft.findData("lora"))
    return blocker.args[0]


def _wheel_down(widget, notches: int = 1) -> None:
    """A mouse wheel turned `notches` clicks down over the middle of `widget`, as the window system sends it."""
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    ev = QWheelEvent(pos, widget.mapToGlobal(pos), QPoint(), QPoint(0, -120 * notches), Qt.MouseButton.NoButton,
                     Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, ev)


def test_builder_keys_edit_only_the_canvas_the_user_sees(qtbot, window):
    assert window.open_template("mlp")
    sketch = window.current_sketch
    n = len(sketch().nodes)
    canvas = window.builder.canvas()
    victim = next(nid for nid, node in sketch().nodes.items() if node.type == "Linear")
    window.builder.select_node(victim)
    undo_count = window.undo_stack().count()

    # On the Monitor tab (Ctrl+2), Delete, Ctrl+D, Ctrl+V and Ctrl+L change nothing on the hidden canvas.
    press(qtbot, window, "Ctrl+2")
    assert window.tabs.currentIndex() == 1
    for key in ("Del", "Ctrl+D", "Ctrl+V", "Ctrl+L"):
        press(qtbot, QApplication.focusWidget() or window, key)
    assert len(sketch().nodes) == n and victim in sketch().nodes
    assert window.undo_stack().count() == undo_count

    # Back on the builder, with the focus in the results' layer table: Delete there is not the canvas's Delete.
    press(qtbot, window, "Ctrl+1")
    table = window.results.layers.view
    table.setFocus()
    press(qtbot, table, "Del")
    assert victim in sketch().nodes and window.undo_stack().count() == undo_count

    # On the canvas the same key deletes the selected layer, as the Edit menu says.
    canvas.setFocus()
    press(qtbot, canvas, "Del")
    assert victim not in sketch().nodes and len(sketch().nodes) == n - 1


def test_wheel_over_the_config_panel_scrolls_it_and_changes_no_field(qtbot, window):
    panel = window.config_panel
    panel.resize(panel.width(), 200)  # a short dock: the fields scroll
    window.config_dock.setMinimumHeight(0)
    window.resizeDocks([window.config_dock], [200], Qt.Orientation.Vertical)
    qtbot.waitUntil(lambda: panel._scroll.verticalScrollBar().maximum() > 0)
    bar = panel._scroll.verticalScrollBar()
    before = (panel.precision.currentIndex(), panel.optimizer.currentIndex(), panel.batch.value())
    _wheel_down(panel.precision, 2)
    _wheel_down(panel.batch, 2)  # (its text ignores the wheel, which goes on to the spin box)
    assert (panel.precision.currentIndex(), panel.optimizer.currentIndex(), panel.batch.value()) == before
    assert bar.value() > 0, "the wheel did not scroll the panel"

    # Once the user has clicked into a field, the wheel steps it as usual.
    qtbot.mouseClick(panel.batch.lineEdit(), Qt.MouseButton.LeftButton)
    assert panel.batch.hasFocus()
    _wheel_down(panel.batch)
    assert panel.batch.value() == before[2] - 1


def test_largest_batch_is_searched_against_the_memory_the_gauge_uses(qtbot, window):
    """The Plan tab's largest batch and the gauge's verdict compare nvidia-smi's figure with the same budget: the
    card's usable memory (its total less the driver's reserve), as the CLI's max-batch does. The search used the
    card's total (80.00 GiB against the gauge's 79.36 GiB), so it could offer a batch the gauge said did not fit."""
    window.auto_plan = True
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        assert window.open_template("mlp")
    spec = blocker.args[0].config.gpu_spec
    assert spec is not None and spec.usable_bytes < spec.memory_bytes
    qtbot.waitUntil(lambda: window.max_batch is not None, timeout=180000)
    result = window.max_batch
    assert result.budget_bytes == spec.usable_bytes
    assert window.target_bytes() == spec.usable_bytes  # what the summary's gauge shows as usable
    from engine.core.units import format_bytes

    assert f"in {format_bytes(spec.usable_bytes)}" in window.results.plan.max_batch.text()


def test_report_of_a_lora_run_says_so_and_counts_the_margin_from_usable_memory(qtbot, window, tmp_path,
                                                                               monkeypatch):
    """Ctrl+E on a LoRA estimate: the report's configuration names the fine-tuning (it read as full fine-tuning,
    only the trainable count hinted otherwise), and its verdict names the usable memory its margin is counted from
    (it said "Fits on A100 80GB (80.00 GiB) with 78.27 GiB to spare" of a 1.09 GiB step)."""
    pypdf = pytest.importorskip("pypdf")
    from PySide6.QtWidgets import QFileDialog

    from engine.core.units import format_bytes

    est = _lora_mlp(qtbot, window)
    assert est.config.peft == "lora" and est.gpu is not None and est.gpu.margin_bytes is not None
    out = tmp_path / "lora.pdf"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), "PDF (*.pdf)"))
    window.builder.canvas().setFocus()
    press(qtbot, window.builder.canvas(), "Ctrl+E")
    qtbot.waitUntil(lambda: out.exists() and not window.session.is_busy("report"), timeout=120000)
    text = " ".join(" ".join(page.extract_text() for page in pypdf.PdfReader(str(out)).pages).split())
    assert "Fine-tuning LoRA, rank 16, alpha 32, on all-linear" in text
    usable = est.gpu.nvidia_smi_bytes + est.gpu.margin_bytes
    assert usable == est.config.gpu_spec.usable_bytes
    assert f"Fits on {est.gpu.gpu_name} ({format_bytes(usable)} usable) with {format_bytes(est.gpu.margin_bytes)}" \
        " to spare" in text


def test_timeline_legend_of_a_lora_step_names_the_categories_as_the_summary_does(qtbot, window, tmp_path):
    """The summary of a LoRA step lists "Base weights" and "Adapter opt. state"; the Timeline tab's legend said
    "Parameters", "Gradients" and "Optimizer state" for the same bytes. The legend is read back from the chart
    drawn as SVG (its text stays text there)."""
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    from render.timeline import paint_timeline

    est = _lora_mlp(qtbot, window)
    tabs = window.results.tabs
    bar = tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(tabs.indexOf(window.results.timeline)).center())
    chart = window.results.timeline
    assert tabs.currentWidget() is chart and chart.estimate() is est
    summary_names = {w.text() for w in window.results.summary.findChildren(type(window.results.summary.peak))}
    assert {"Base weights", "Adapter opt. state"} <= summary_names

    svg = tmp_path / "timeline.svg"
    gen = QSvgGenerator()
    gen.setFileName(str(svg))
    gen.setSize(chart.size())
    painter = QPainter(gen)
    paint_timeline(painter, QRectF(chart.rect()), est, data=chart._data)
    painter.end()
    drawn = svg.read_text(encoding="utf-8")
    assert "Base weights" in drawn and "Adapter opt. state" in drawn and "Adapter gradients" in drawn
    assert ">Parameters<" not in drawn and ">Optimizer state<" not in drawn


def test_engine_messages_name_the_panels_fields_not_the_clis_options(qtbot, window):
    """Choosing Generation for a sketch that is no language model said "--mode generate needs a causal language
    model …": a GUI user has a Mode field, no --mode option."""
    panel = window.config_panel
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    panel.mode.setFocus()
    with qtbot.waitSignal(window.estimateFailed, timeout=60000) as blocker:
        for _ in range(2):  # Training step → Inference → Generation (KV cache), as the arrow keys step a combo box
            qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    assert panel.mode.currentData() == "generate"
    shown = window.results.summary.error.text()
    assert "--mode" not in blocker.args[0] and "--mode" not in shown
    assert shown.startswith("Mode “Generation (KV cache)” needs a causal language model")
    assert window.statusBar().currentMessage() == shown


def test_window_shrinks_to_a_small_screen_and_the_config_fields_scroll_rather_than_clip(qtbot, window):
    """The window could not be narrower than 1181 px (the config panel's full width beside the results'), so on a
    1024-px screen or a tiled half it was cut off at the right. Now it narrows to fit 1024 px; the fields scroll
    sideways there, and at the size the app opens with (1360 × 900) nothing scrolls sideways, in any mode."""
    panel = window.config_panel
    hbar = panel._scroll.horizontalScrollBar()
    assert window.minimumSizeHint().width() <= 1024
    # At first start (1360 × 900, no saved layout) the config dock is as wide as its fields ask, in every mode (the
    # generation row is the widest); the window's own layout gave the dock its minimum, scrolling them sideways.
    assert window.width() == 1360
    qtbot.waitUntil(lambda: window.config_dock.width() >= panel.sizeHint().width())
    panel.mode.setFocus()
    for _ in range(3):
        qtbot.wait(50)
        assert hbar.maximum() == 0, f"fields scroll sideways at first start in {panel.mode.currentText()}"
        qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024)
    dock = window.config_dock
    assert dock.geometry().right() <= window.width() and window.results_dock.geometry().right() <= window.width()
    viewport = panel._scroll.viewport()
    if hbar.maximum() > 0:  # narrower than the fields: they scroll to the last one's right edge
        hbar.setValue(hbar.maximum())
    right = panel.weights.mapTo(viewport, panel.weights.rect().topRight()).x()
    assert right <= viewport.width()


@pytest.mark.parametrize("analytic_after_failure", [False, True])
@pytest.mark.parametrize("inference_lands_first", [False, True])
def test_a_failed_edit_shows_the_last_good_figures_everywhere_not_analytic_ones_refining_forever(
        qtbot, window, monkeypatch, inference_lands_first, analytic_after_failure):
    """After an edit that does not build (Generation for a sketch that is no language model), the banner said "these
    figures are of the last version that built" while the summary showed the edit's analytic peak, titled
    "analytic, refining…" for a trace that had failed, beside the last good timeline and status-bar peak.

    The edit's analytic and traced jobs run on threads of their own, so either may answer first: the analytic
    figures before the failure (the usual order), or after it (on a loaded machine; CI's failure, the summary then
    showed the edit's analytic 2.26 MiB, the Inference figure, over Training's 10.32 MiB). Each order is made
    certain by holding the other job back. The last good version is Training's, or Inference's when the user
    stopped there first and it built (two Down keys at once are one edit: the panel's debounce)."""
    from engine.core.units import format_bytes
    from engine.jobs import calls as jobs
    from gui.estimate_view import node_figures

    panel = window.config_panel
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        assert window.open_template("mlp")
    good = blocker.args[0]
    panel.mode.setFocus()
    if inference_lands_first:
        with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
            qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
        good = blocker.args[0]
        assert good.config.mode == "inference"
    failed, analytic = threading.Event(), threading.Event()
    answers: list[AnalyticResult] = []  # the Generation edit's analytic answer, however it was shown
    window.estimateFailed.connect(lambda _message: failed.set())
    window.analyticReady.connect(lambda res: (answers.append(res), analytic.set()))
    window.ws.nodeFigures.connect(answers.append)
    if analytic_after_failure:
        monkeypatch.setattr(jobs, "analytic", held_until(failed, jobs.analytic))
    else:
        monkeypatch.setattr(jobs, "estimate", held_until(analytic, jobs.estimate))
    with qtbot.waitSignal(window.estimateFailed, timeout=60000):
        for _ in range(1 if inference_lands_first else 2):  # … → Generation (KV cache)
            qtbot.keyClick(panel.mode, Qt.Key.Key_Down)
    qtbot.waitUntil(lambda: not window.session.is_busy(), timeout=60000)  # the edit's analytic answer has come too
    assert len(answers) == 1 and answers[0].config.mode == "generate"
    assert analytic.is_set() is not analytic_after_failure  # a late one is no instant figure of the summary's
    assert window.estimate is good
    summary = window.results.summary
    assert window.results.freshness == "stale" and window.results.banner.isVisible()
    assert summary.peak.text() == format_bytes(good.peak_bytes)
    assert "refining" not in summary.title.text().lower()
    assert window.results.timeline.estimate() is good
    assert window.status_label.text() == f"peak {format_bytes(good.peak_bytes)} (last version that built)"
    assert summary.error.text().startswith("Mode “Generation (KV cache)”")
    assert window.builder._results == node_figures(answers[0].nodes)  # the canvas: the edit's figures, either way


def test_first_file_dialogs_open_in_the_home_folder_not_where_the_app_was_started(qtbot, window, tmp_path,
                                                                                   monkeypatch):
    """A newcomer's first Save As (and Open, Export) opened in the folder the app was started from: from a
    checkout, VRAMScope's own source tree. With no folder used yet, they open in the user's home."""
    from PySide6.QtWidgets import QFileDialog

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)  # somewhere else, as a checkout is
    asked: list[str] = []

    def dialog(parent, caption, start, filt):
        asked.append(start)
        return "", ""  # the user cancels

    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", dialog)
    assert window.open_template("mlp")
    canvas = window.builder.canvas()
    canvas.setFocus()
    press(qtbot, canvas, "Ctrl+Shift+S")  # Save As…
    press(qtbot, canvas, "Ctrl+O")  # Open…
    press(qtbot, canvas, "Ctrl+Shift+E")  # Export PyTorch code…
    assert len(asked) == 3
    assert asked[0] == str(home / "MLP.json") and asked[1] == str(home) and asked[2] == str(home / "MLP.py")


def test_a_new_sketch_says_what_to_do_instead_of_an_error(qtbot, window):
    """Ctrl+N showed an empty canvas beside a red "sketch 'untitled' has no Input node" and "No figures: Untitled
    does not build": the newcomer's first sight was an error. Emptying a sketch by hand says the same as new."""
    from gui.main_window import EMPTY_SKETCH_HINT

    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    canvas = window.builder.canvas()
    canvas.setFocus()
    press(qtbot, canvas, "Ctrl+N")
    qtbot.wait(300)  # anything the engine would say has come
    results = window.results
    assert not window.current_sketch().nodes
    assert results.banner.text() == EMPTY_SKETCH_HINT and results.summary.error.text() == ""
    assert "does not build" not in window.statusBar().currentMessage()
    assert window.estimate is None and results.summary.peak.text() == "—"

    # The first layer dropped goes on to the engine, which says what is still missing.
    with qtbot.waitSignal(window.estimateFailed, timeout=60000) as blocker:
        window.builder.add_layer("Input")
    assert blocker.args[0] and results.banner.text() != EMPTY_SKETCH_HINT


def test_a_hugging_face_config_opens_read_only_as_the_cli_takes_it(qtbot, window, tmp_path, monkeypatch):
    """File ▸ Open on a Hugging Face config.json said "not a VRAMScope sketch": the app offered no way to open
    one, though the CLI's estimate takes it. It opens read-only now, with the parameters transformers builds."""
    import json

    pytest.importorskip("transformers")
    import torch
    from PySide6.QtWidgets import QFileDialog
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": False}
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    cfg_path = folder / "config.json"
    cfg_path.write_text(json.dumps(fields), encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(cfg_path), ""))
    window.config_panel.seq_len.setValue(64)
    window.config_panel.batch.setValue(2)
    window.config_panel.flush()
    with qtbot.waitSignal(window.estimateReady, timeout=120000) as blocker:
        press(qtbot, window, "Ctrl+O")
    est = blocker.args[0]
    assert window.model_kind == "file" and "(read-only)" in window.windowTitle()
    hf = dict(fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf.pop("model_type"), **hf))
    assert est.parameters == sum(p.numel() for p in model.parameters())
    # Offered again under Open recent once its module tree has come: another job, on its own thread here (in the
    # app's engine process it follows the estimate), so it may land after the estimate.
    qtbot.waitUntil(lambda: str(cfg_path.resolve()) in window.recent_files(), timeout=60000)


def test_the_summary_never_cuts_its_parameter_line(qtbot, window):
    """A QLoRA step's "1,237,518,336 parameters, 1,703,936 trainable" ran past the summary's edge ("… traina"): the
    line wraps within the summary at any width the splitter allows."""
    pytest.importorskip("transformers")
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QFontMetrics

    panel = window.config_panel
    panel.batch.setValue(1)
    panel.seq_len.setValue(16)
    panel.peft.setCurrentIndex(panel.peft.findData("qlora"))
    panel.flush()
    with qtbot.waitSignal(window.estimateReady, timeout=120000):
        assert window.open_model("llama-3.2-1b")
    label = window.results.summary.params
    assert "trainable" in label.text()
    scroll = window.results.summary_scroll
    split = scroll.parentWidget()
    split.setSizes([scroll.minimumWidth(), 10_000])  # the splitter dragged as far left as it goes
    qtbot.waitUntil(lambda: scroll.width() <= scroll.minimumWidth() + 2)
    qtbot.wait(50)
    viewport = scroll.viewport()
    right = label.mapTo(viewport, label.rect().topRight()).x()
    assert right <= viewport.width()
    need = QFontMetrics(label.font()).boundingRect(QRect(0, 0, label.width(), 10_000),
                                                   int(Qt.TextFlag.TextWordWrap), label.text())
    assert need.height() <= label.height() and need.width() <= label.width()


def test_measured_table_names_a_lora_steps_categories_and_shows_no_negative_zero(qtbot, window):
    """Ctrl+R (profile on this machine) of LeNet showed "Temporaries at peak … -0.0 %"; of a LoRA step, it named
    the base weights "Parameters" where the summary says "Base weights"."""
    def profile() -> None:
        canvas = window.builder.canvas()
        canvas.setFocus()
        with qtbot.waitSignal(window.bridge.result, timeout=120000,
                              check_params_cb=lambda kind, jid, value: kind == "profile"):
            press(qtbot, canvas, "Ctrl+R")

    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("lenet")
    profile()
    table = window.results.compare.table
    errors = [table.item(r, 3).text() for r in range(table.rowCount())]
    rows = window.results.compare.rows()
    assert rows and len(errors) == len(rows)
    for (name, _e, _m, err), shown in zip(rows, errors, strict=True):
        assert not shown.startswith("-0.0"), f"{name.strip()}: {shown}"
        if err is not None and round(100 * err, 1) == 0:
            assert shown == "+0.0 %"

    panel = window.config_panel
    panel.lora_targets.setText("all-linear")
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        panel.peft.setCurrentIndex(panel.peft.findData("lora"))
    profile()
    names = [r[0].strip() for r in window.results.compare.rows()]
    assert "Base weights at peak" in names and "Parameters at peak" not in names
