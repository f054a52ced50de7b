"""The results views: the per-layer table sorts by real figures and names the module of a selected row; the
fits gauge and the estimate-vs-measured errors."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, Qt  # noqa: E402

import engine.sketch.document as sketch_mod  # noqa: E402
from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.units import GIB, format_bytes  # noqa: E402
from gui.results import CompareView, FitGauge, LayerTable, SummaryView  # noqa: E402

# Linear(in→out) holds in·out + out parameters.
FC1, FC2, FC3 = 784 * 512 + 512, 512 * 256 + 256, 256 * 10 + 10


@pytest.fixture(scope="module")
def mlp_estimate():
    from engine.models.sources import SketchSource
    from engine.planning.estimator import estimate

    return estimate(SketchSource(sketch_mod.load_template("mlp")), TrainConfig(batch_size=16, device="cpu"))


def _column(table: LayerTable, col: int) -> list:
    from gui.results.layer_table import SORT_ROLE

    p = table.proxy
    role = Qt.ItemDataRole.DisplayRole if col == 0 else SORT_ROLE  # names as shown
    return [p.data(p.index(r, col), role) for r in range(p.rowCount())]


def test_layer_table_sorts_names_by_their_numbers(qtbot, mlp_estimate):
    from dataclasses import replace

    t = LayerTable()
    qtbot.addWidget(t)
    t.show()
    row = mlp_estimate.per_module[0]
    t.set_rows([replace(row, name=f"layers.{i}.mlp") for i in (10, 2, 1, 11)])
    header = t.view.horizontalHeader()
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton,
                     pos=header.rect().topLeft() + QPoint(header.sectionPosition(0) + 10, 5))
    names = _column(t, 0)
    assert names in (["layers.1.mlp", "layers.2.mlp", "layers.10.mlp", "layers.11.mlp"],
                     ["layers.11.mlp", "layers.10.mlp", "layers.2.mlp", "layers.1.mlp"])


def test_layer_table_sorts_by_parameters_and_share(qtbot, mlp_estimate):
    t = LayerTable()
    qtbot.addWidget(t)
    t.set_rows(mlp_estimate.per_module)
    t.view.sortByColumn(2, Qt.SortOrder.DescendingOrder)
    names = _column(t, 0)
    assert names[:3] == ["fc1", "fc2", "fc3"]
    assert _column(t, 2)[:3] == [FC1, FC2, FC3]
    t.view.sortByColumn(2, Qt.SortOrder.AscendingOrder)
    params = _column(t, 2)
    assert params == sorted(params)
    t.view.sortByColumn(5, Qt.SortOrder.DescendingOrder)
    shares = _column(t, 5)
    assert shares == sorted(shares, reverse=True) and 0 < shares[0] <= 1
    # Display text is formatted, the sort is numeric (1.2 M above 131 k, not by string).
    assert t.proxy.index(0, 5).data().endswith("%")


def test_selecting_a_row_emits_the_module_name(qtbot, mlp_estimate):
    t = LayerTable()
    qtbot.addWidget(t)
    t.set_rows(mlp_estimate.per_module)
    t.view.sortByColumn(2, Qt.SortOrder.DescendingOrder)
    with qtbot.waitSignal(t.moduleSelected, timeout=1000) as blocker:
        t.view.selectRow(1)
    assert blocker.args == ["fc2"]
    # Selecting from the canvas side does not echo back.
    with qtbot.assertNotEmitted(t.moduleSelected):
        t.select_module("fc3")
    assert t.selected_module() == "fc3"


def test_filter_keeps_matching_modules(qtbot, mlp_estimate):
    t = LayerTable()
    qtbot.addWidget(t)
    t.set_rows(mlp_estimate.per_module)
    t.filter.setText("fc")
    assert sorted(_column(t, 0)) == ["fc1", "fc2", "fc3"]


def test_summary_shows_engine_figures(qtbot, mlp_estimate):
    s = SummaryView()
    qtbot.addWidget(s)
    s.set_estimate(mlp_estimate, target_bytes=16 * GIB)
    assert s.peak.text() == format_bytes(mlp_estimate.peak_bytes)
    assert s.params.text() == f"{FC1 + FC2 + FC3:,} parameters"
    assert s.gauge.fits is True
    s.set_error("node 'fc2' (Linear): expects 100 input features, got 512")
    assert s.peak.text() == format_bytes(mlp_estimate.peak_bytes)  # the last figures stay


def test_gauge_verdict_and_margin(qtbot):
    g = FitGauge()
    qtbot.addWidget(g)
    g.set_values(70 * GIB, 80 * GIB)
    assert g.fits is True and "10.00 GiB to spare" in g.text
    g.set_values(90 * GIB, 80 * GIB)
    assert g.fits is False and "10.00 GiB over" in g.text
    g.set_values(1, None)
    assert g.fits is None
    # the engine's verdict is shown as it is: tight with the figure over the card (the live tensors fit, the
    # modelled allocator runs out) never reads "0 B to spare"; "does not fit" says by how much
    g.set_values(90 * GIB, 80 * GIB, verdict="tight")
    assert g.text == "tight — 10.00 GiB over by the figure, the live tensors fit"
    g.set_values(79 * GIB, 80 * GIB, verdict="tight")
    assert g.text == "tight — 1.00 GiB to spare"
    g.set_values(90 * GIB, 80 * GIB, verdict="does not fit")
    assert g.fits is False and g.text == "does not fit — 10.00 GiB over"


def test_compare_view_errors(qtbot, mlp_estimate):
    from dataclasses import replace

    c = CompareView()
    qtbot.addWidget(c)
    c.set_estimate(mlp_estimate)
    measured = replace(mlp_estimate, source="profiler-cpu", peak_bytes=int(mlp_estimate.peak_bytes * 1.25))
    c.set_measured(measured)
    name, est, meas, err = c.rows()[0]
    assert name == "Peak allocated" and est == mlp_estimate.peak_bytes and meas == measured.peak_bytes
    assert err == pytest.approx(-0.2)  # 1/1.25 − 1
    assert c.table.item(0, 3).text() == "-20.0 %"


def test_byte_columns_are_formatted_in_binary_units(qtbot, mlp_estimate):
    t = LayerTable()
    qtbot.addWidget(t)
    t.set_rows(mlp_estimate.per_module)
    rows = {t.model.row_at(r).name: r for r in range(t.model.rowCount())}
    r = rows["fc1"]
    row = t.model.row_at(r)
    for col, attr in ((3, "activation_bytes"), (4, "bytes_at_peak")):
        assert t.model.index(r, col).data() == format_bytes(getattr(row, attr))


def test_plan_view_shows_each_recommendation_whole(qtbot):
    """The planner's own answers for a small model, one row each, their costs wrapped rather than cut off."""
    from engine.models.sources import SketchSource
    from engine.planning.planner import recommend
    from gui.results import PlanView

    cfg = TrainConfig(batch_size=64, device="cpu", optimizer="adam")
    recs = recommend(SketchSource(sketch_mod.load_template("mlp")), cfg)
    assert recs and all(r.saves_bytes > 0 for r in recs)
    view = PlanView()
    qtbot.addWidget(view)
    view.resize(520, 400)
    view.show()
    view.set_recommendations(recs)
    rows = view.rows()
    assert [r[0] for r in rows] == [r.title for r in recs]
    assert [r[1] for r in rows] == [format_bytes(r.saves_bytes) for r in recs]
    assert [r[2] for r in rows] == [format_bytes(r.new_peak_bytes) for r in recs]
    assert [r[3] for r in rows] == [r.cost for r in recs]
    qtbot.wait(50)
    line = view.table.fontMetrics().height()
    longest = max(range(len(recs)), key=lambda i: len(recs[i].cost))
    assert view.table.rowHeight(longest) >= 2 * line  # a long cost wraps onto more lines at this width
    view.set_recommendations([])
    assert view.table.rowCount() == 0 and "No recommendations" in view.note.text()


def test_plan_tips_name_the_panels_fields_not_the_clis_options(qtbot):
    """The planner's advice, in the app, names the field to change ("Fine-tuning “LoRA”"), not the CLI's option.
    (LoRA's advice as the planner words it; the planner offers it only for models people fine-tune, not the MLP.)"""
    from engine.planning.planner import Recommendation
    from gui.results import PlanView

    lora = Recommendation("LoRA adapters (rank 16, peft)", "--peft lora: the base frozen, 1,024 adapter parameters "
                          "trained (no gradients or optimizer state for the base)", 1 << 20, 1 << 20, "changes what "
                          "is trained", changes_training=True)
    view = PlanView()
    qtbot.addWidget(view)
    view.set_recommendations([lora])
    tip = view.table.item(0, 0).toolTip()
    assert tip.startswith("Fine-tuning “LoRA”:") and "--peft" not in tip


def test_breakdown_tab_splits_nvidia_smi_for_a_gpu_target(qtbot, mlp_estimate):
    from engine.models.sources import SketchSource
    from engine.planning.estimator import estimate
    from gui.results import ResultsPanel

    gpu_est = estimate(SketchSource(sketch_mod.load_template("mlp")), TrainConfig(batch_size=16, gpu="T4"))
    panel = ResultsPanel()
    qtbot.addWidget(panel)
    panel.set_estimate(gpu_est)
    assert panel.breakdown_view.isEnabled()
    assert panel.donut.breakdown() == gpu_est.breakdown_at_peak  # the allocated peak first
    panel.breakdown_view.setCurrentIndex(panel.breakdown_view.findData("smi"))
    smi = panel.donut.breakdown()
    assert smi == gpu_est.gpu.breakdown_at_live_peak
    assert sum(smi.values()) == gpu_est.gpu.reserved_at_live_peak_bytes + gpu_est.gpu.cuda_context_bytes
    assert smi["cuda_context"] == gpu_est.gpu.cuda_context_bytes and smi["allocator_overhead"] > 0
    # A CPU estimate has no GPU view: the choice goes back to the tensors and cannot be changed.
    panel.set_estimate(mlp_estimate)
    assert not panel.breakdown_view.isEnabled()
    assert panel.donut.breakdown() == mlp_estimate.breakdown_at_peak
