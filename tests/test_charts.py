"""The timeline and donut charts (gui/charts) on the offscreen platform, from real estimator output."""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QIODevice, QPoint, QRectF  # noqa: E402
from PySide6.QtGui import QColor, QImage, QPainter, QPalette, QPdfWriter  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402
from engine.results.types import ALL_CATEGORIES  # noqa: E402

# torchvision's published parameter count of ResNet-18
RESNET18_PARAMS = 11_689_512


@pytest.fixture(scope="module")
def est():
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate

    # The CUDA target on a CPU-only machine: fake CUDA tensors, plus the predicted reserved timeline.
    return estimate(resolve_source("resnet18"), TrainConfig(device="cuda", gpu="T4", batch_size=2))


def _count(img: QImage, color: QColor, tol: int = 24, step: int = 1) -> int:
    """Pixels within `tol` (sum of channel differences) of `color`."""
    import numpy as np

    img = img.convertToFormat(QImage.Format.Format_RGB32)
    a = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine() // 4, 4)[:, : img.width()]
    a = a[::step, ::step].astype(int)  # BGRA in memory
    d = abs(a[..., 2] - color.red()) + abs(a[..., 1] - color.green()) + abs(a[..., 0] - color.blue())
    return int((d <= tol).sum())


def test_one_distinct_colour_per_category_in_both_palettes():
    from render.colors import CATEGORY_COLORS, CATEGORY_COLORS_DARK, category_color

    for table in (CATEGORY_COLORS, CATEGORY_COLORS_DARK):
        assert set(table) == set(ALL_CATEGORIES)
        assert len({v.lower() for v in table.values()}) == len(ALL_CATEGORIES)
    for c in ALL_CATEGORIES:
        # on a dark background the same hue is drawn lighter
        assert category_color(c, dark=True).lightnessF() >= category_color(c).lightnessF()


def test_timeline_draws_categories_peak_and_reserved(qtbot, est):
    from gui.charts import TimelineChart
    from render.colors import LIGHT

    assert est.parameters == RESNET18_PARAMS and est.gpu is not None and est.gpu.reserved_timeline
    chart = TimelineChart()
    qtbot.addWidget(chart)
    chart.setPalette(QPalette(QColor("#F0F0F0")))  # a light system palette
    chart.resize(900, 360)
    chart.set_estimate(est)
    img = chart.grab().toImage()
    for cat in ("parameters", "gradients", "optimizer_state", "activations"):
        assert _count(img, LIGHT.category(cat)) > 50, cat
    assert _count(img, LIGHT.color("peak"), tol=10, step=1) > 10
    with_reserved = img
    chart.set_reserved(False)
    without = chart.grab().toImage()
    assert with_reserved != without  # the dashed reserved line is drawn only when asked
    chart.set_measured(replace(est, source="profiler-cuda"))
    assert chart.grab().toImage() != without
    chart.set_estimate(None)
    empty = chart.grab().toImage()
    assert _count(empty, LIGHT.category("activations")) == 0


def test_timeline_dark_palette(qtbot, est):
    from gui.charts import TimelineChart
    from render.colors import DARK

    chart = TimelineChart()
    qtbot.addWidget(chart)
    pal = QPalette()
    pal.setColor(QPalette.ColorRole.Window, QColor("#202020"))
    pal.setColor(QPalette.ColorRole.WindowText, QColor("#EEEEEE"))
    chart.setPalette(pal)
    chart.resize(600, 300)
    chart.set_estimate(est)
    img = chart.grab().toImage()
    assert chart.theme() is DARK
    assert img.pixelColor(2, 2).lightnessF() < 0.2
    assert _count(img, DARK.category("activations")) > 50


def test_hover_names_the_op_and_module_at_the_peak(qtbot, est):
    from gui.charts import TimelineChart

    chart = TimelineChart()
    qtbot.addWidget(chart)
    # wide enough that every event has its own pixels, so the pixel over the peak maps to the peak event
    last = max(p.index for p in est.timeline)
    chart.resize(3 * last + 300, 320)
    chart.set_estimate(est)
    chart.show()
    qtbot.waitExposed(chart)
    chart.grab()
    g = chart._geometry
    x = g.plot.left() + (est.peak_index + 0.5 - g.x0) / (g.x1 - g.x0) * g.plot.width()
    y = g.plot.center().y()
    # the first move after showing only enters the widget: make it elsewhere
    QTest.mouseMove(chart, QPoint(int(g.plot.left()) + 2, int(y)))
    QTest.mouseMove(chart, QPoint(int(g.plot.left()) + 4, int(y)))
    with qtbot.waitSignal(chart.pointHovered, timeout=2000) as blocker:
        QTest.mouseMove(chart, QPoint(int(x), int(y)))
    text = blocker.args[0]
    assert est.peak_op in text
    assert (est.peak_module or "(top level)") in text
    assert format_bytes(est.peak_bytes) in text
    assert est.peak_phase in text


def test_timeline_downsampling_keeps_the_peak(est):
    import numpy as np

    from render.timeline import TimelineData

    data = TimelineData(est)
    assert data.total.max() == est.peak_bytes  # the timeline's stacked total reaches the engine's peak
    keep = data.keep(120)
    assert len(keep) <= 2 * 120 + 2
    assert int(np.argmax(data.total)) in set(keep.tolist())


def test_donut_slices_and_hover(qtbot, est):
    from gui.charts import DonutChart
    from render.colors import LIGHT
    from render.donut import donut_slices

    slices, whole = donut_slices(est.breakdown_at_peak)
    assert whole == est.peak_bytes
    chart = DonutChart()
    qtbot.addWidget(chart)
    chart.setPalette(QPalette(QColor("#F0F0F0")))
    chart.resize(460, 240)
    chart.set_breakdown(est.breakdown_at_peak)
    chart.show()
    qtbot.waitExposed(chart)
    img = chart.grab().toImage()
    assert _count(img, LIGHT.category("parameters")) > 50
    # hover the middle of the parameters slice
    start, span = next((s, sp) for name, s, sp in chart._angles if name == "parameters")
    mid = math.radians(start + span / 2)
    c = chart._ring.center()
    r = chart._ring.width() / 2 * 0.85
    pos = QPoint(int(c.x() + r * math.cos(mid)), int(c.y() - r * math.sin(mid)))
    QTest.mouseMove(chart, QPoint(1, 1))  # the first move after showing only enters the widget
    QTest.mouseMove(chart, QPoint(2, 2))
    with qtbot.waitSignal(chart.sliceHovered, timeout=2000) as blocker:
        QTest.mouseMove(chart, pos)
    # fp32: 4 bytes per parameter
    assert blocker.args[0].startswith(f"Parameters: {format_bytes(4 * RESNET18_PARAMS)}")
    share = 4 * RESNET18_PARAMS / est.peak_bytes
    assert f"{100 * share:.1f} %" in blocker.args[0]


def test_render_to_pdf_is_vector_and_searchable(qtbot, est):
    pypdf = pytest.importorskip("pypdf")
    from gui.charts import DonutChart, TimelineChart
    from render.colors import LIGHT

    tl, dn = TimelineChart(), DonutChart()
    qtbot.addWidget(tl)
    qtbot.addWidget(dn)
    tl.set_estimate(est)
    dn.set_breakdown(est.breakdown_at_peak)
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QPdfWriter(buf)
    writer.setResolution(300)
    p = QPainter(writer)
    w = writer.width()
    tl.render_to(p, QRectF(0, 0, w, w * 0.45), LIGHT)
    dn.render_to(p, QRectF(0, w * 0.5, w, w * 0.3), LIGHT)
    p.end()
    buf.close()
    import io

    reader = pypdf.PdfReader(io.BytesIO(bytes(buf.data())))
    page = reader.pages[0]
    text = re.sub(r"\s+", " ", page.extract_text())
    assert f"Peak {format_bytes(est.peak_bytes)}" in text
    assert "Optimizer state" in text and "Activations" in text
    assert format_bytes(4 * RESNET18_PARAMS) in text  # the donut legend's parameters row
    assert not page["/Resources"].get("/XObject")  # no raster anywhere: paths and text only


def _timeline_pdf_text(est) -> str:
    import io

    pypdf = pytest.importorskip("pypdf")
    from render.colors import LIGHT
    from render.timeline import paint_timeline

    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QPdfWriter(buf)
    writer.setResolution(150)
    p = QPainter(writer)
    paint_timeline(p, QRectF(0, 0, writer.width(), writer.width() * 0.45), est, theme=LIGHT)
    p.end()
    buf.close()
    return re.sub(r"\s+", " ", pypdf.PdfReader(io.BytesIO(bytes(buf.data()))).pages[0].extract_text())


def test_a_reserve_far_above_the_tensors_does_not_set_the_scale(est):
    """A tiny model's reserve (a 20 MiB segment for a few MiB of tensors) is clipped, its maximum in the legend;
    a reserve close to the tensors (ResNet-18 on a T4) sets the scale as usual."""
    from engine.models.sources import SketchSource
    from engine.planning.estimator import estimate
    from engine.sketch.document import load_template
    from render.timeline import RESERVED_OFF_SCALE

    tiny = estimate(SketchSource(load_template("lenet")), TrainConfig(batch_size=4, gpu="T4"))
    r_max = max(tiny.gpu.reserved_timeline)
    assert r_max > RESERVED_OFF_SCALE * tiny.peak_bytes
    text = _timeline_pdf_text(tiny)
    assert f"up to {format_bytes(r_max)}, above the scale" in text
    assert max(est.gpu.reserved_timeline) <= RESERVED_OFF_SCALE * est.peak_bytes
    text = _timeline_pdf_text(est)
    assert "Reserved (predicted)" in text and "above the scale" not in text


def test_the_timeline_counts_the_events_along_x(est):
    from render.timeline import event_label

    last = est.phases[-1].end + 1
    text = _timeline_pdf_text(est)
    # Between the y axis's last byte label and the caption: the event counts, round, evenly spaced, within the step.
    ticks = [int(t) for t in text.split(" allocation events")[0].rsplit("MiB ", 1)[1].split()]
    steps = {b - a for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(ticks) >= 3 and ticks[0] == 0 and len(steps) == 1
    assert ticks[-1] <= last < ticks[-1] + 2 * steps.pop()
    assert [event_label(v) for v in (1400, 25_000, 1_500_000)] == ["1400", "25k", "1.5M"]


def test_the_timeline_zooms_pans_and_comes_back_with_the_mouse_and_keys(qtbot, est):
    from PySide6.QtCore import QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    from gui.charts import TimelineChart

    chart = TimelineChart()
    qtbot.addWidget(chart)
    chart.resize(900, 320)
    chart.show()
    qtbot.waitExposed(chart)
    chart.set_estimate(est)
    chart.grab()  # paints once: the geometry the mouse works against
    full = chart._geometry.full
    plot = chart._geometry.plot
    at = QPointF(plot.left() + plot.width() * 0.25, plot.center().y())

    def wheel(notches: int) -> None:
        ev = QWheelEvent(at, chart.mapToGlobal(at), QPoint(0, 0), QPoint(0, 120 * notches), Qt.MouseButton.NoButton,
                         Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
        QApplication.sendEvent(chart, ev)
        chart.grab()

    anchor = full[0] + 0.25 * (full[1] - full[0])
    wheel(3)  # zoom in where the mouse is
    v0, v1 = chart.view()
    assert v1 - v0 == pytest.approx((full[1] - full[0]) * 0.8**3, rel=1e-6)
    assert v0 + 0.25 * (v1 - v0) == pytest.approx(anchor, rel=1e-6)  # the event under the mouse stays put
    # Drag to the left: later events come into view.
    qtbot.mousePress(chart, Qt.MouseButton.LeftButton, pos=at.toPoint())
    qtbot.mouseMove(chart, pos=(at - QPointF(200, 0)).toPoint())
    qtbot.mouseRelease(chart, Qt.MouseButton.LeftButton, pos=(at - QPointF(200, 0)).toPoint())
    w0, w1 = chart.view()
    assert w0 > v0 and w1 - w0 == pytest.approx(v1 - v0)
    img = chart.grab().toImage()
    assert not img.isNull()
    img.save(str(_shots() / "timeline_zoomed.png"))
    chart.setFocus()
    qtbot.keyClick(chart, Qt.Key.Key_Minus)
    assert chart.view()[1] - chart.view()[0] > w1 - w0
    qtbot.mouseDClick(chart, Qt.MouseButton.LeftButton, pos=at.toPoint())
    assert chart.view() is None  # the whole step again
    wheel(-2)
    assert chart.view() is None  # never wider than the step


def _shots():
    from pathlib import Path

    d = Path(os.environ.get("VRAMSCOPE_SHOTS", "/tmp/vramscope-shots"))
    d.mkdir(parents=True, exist_ok=True)
    return d
