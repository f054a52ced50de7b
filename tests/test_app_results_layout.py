"""The results' rough edges, measured on the widgets: the Layers table's Module column as wide as its names and
resizable by hand; the Plan table veiled, not painted dark, while a sketch does not build; a one-line banner one
line tall in a tall dock; the donut's centre figure and caption inside its hole; the view selector read whole."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QEvent, QPoint, QPointF, QRectF, Qt  # noqa: E402
from PySide6.QtGui import QFontMetricsF, QImage, QMouseEvent, QPainter  # noqa: E402
from PySide6.QtWidgets import QApplication, QStyle, QStyleOptionComboBox  # noqa: E402

from engine.config.train_config import TrainConfig  # noqa: E402
from engine.core.units import format_bytes  # noqa: E402
from gui.builder import commands as C  # noqa: E402
from tests.app_windows import open_template, press  # noqa: E402


def _drag(qtbot, widget, start: QPoint, dx: int) -> None:
    """A press, a move with the button held and a release, as a mouse drags."""
    qtbot.mousePress(widget, Qt.MouseButton.LeftButton, pos=start)
    end = QPointF(start.x() + dx, start.y())
    move = QMouseEvent(QEvent.Type.MouseMove, end, widget.mapToGlobal(end), Qt.MouseButton.NoButton,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, move)
    qtbot.mouseRelease(widget, Qt.MouseButton.LeftButton, pos=end.toPoint())


def test_the_module_column_holds_its_names_and_the_user_resizes_it(qtbot):
    from engine.models.sources import resolve_source
    from engine.planning.estimator import estimate
    from gui.results import LayerTable

    est = estimate(resolve_source("resnet18"), TrainConfig(device="cpu", batch_size=2))
    table = LayerTable()
    qtbot.addWidget(table)
    table.resize(480, 300)  # the Layers tab of a narrow results dock
    table.show()
    qtbot.waitExposed(table)
    table.set_rows(est.per_module)
    hh = table.view.horizontalHeader()
    longest = max((r.name for r in est.per_module), key=len)  # 'layer1.0.downsample.0'-like
    assert hh.sectionSize(0) >= table.view.fontMetrics().horizontalAdvance(longest)  # was about 80 px: "lay…"
    before = hh.sectionSize(0)
    edge = QPoint(hh.sectionViewportPosition(0) + before - 2, hh.height() // 2)
    _drag(qtbot, hh.viewport(), edge, -60)
    assert hh.sectionSize(0) == pytest.approx(before - 60, abs=3)
    edge = QPoint(hh.sectionViewportPosition(0) + hh.sectionSize(0) - 2, hh.height() // 2)
    _drag(qtbot, hh.viewport(), edge, 150)
    assert hh.sectionSize(0) == pytest.approx(before + 90, abs=3)


def test_the_plan_table_of_a_sketch_that_does_not_build_is_veiled_not_dark(qtbot, window):
    window.auto_plan = True
    open_template(qtbot, window, "mlp")
    qtbot.waitUntil(lambda: window.recommendations is not None and window.max_batch is not None, timeout=120000)
    r = window.results
    bar = r.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(r.tabs.indexOf(r.plan)).center())
    assert r.tabs.currentWidget() is r.plan and r.plan.table.rowCount() > 0
    with qtbot.waitSignal(window.estimateFailed, timeout=60000):
        window.document.push(C.SetFieldCommand(window.document, "fc2", "in_features", 100))
    assert r.freshness == "stale"
    qtbot.wait(100)
    shot = window.grab().toImage()
    vp = r.plan.table.viewport()
    origin = vp.mapTo(window, QPoint(0, 0)) * shot.devicePixelRatio()
    light = [shot.pixelColor(origin.x() + x, origin.y() + y).lightness()
             for x in range(2, vp.width() - 2, 5) for y in range(2, vp.height() - 2, 5)]
    assert sorted(light)[len(light) // 2] >= 200  # rows on white, dimmed: was a dark grey (about 100)
    assert r.tabs_veil.isVisible() and r.tabs_veil.geometry() == r.tabs.rect()
    window.builder.canvas().setFocus()
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        press(qtbot, window, "Ctrl+Z")
    assert r.freshness == "current" and not r.tabs_veil.isVisible()


def test_a_one_line_banner_is_one_line_tall_in_a_tall_dock(qtbot, window):
    open_template(qtbot, window, "mlp")
    window.resize(1920, 1080)
    window.resizeDocks([window.results_dock], [600], Qt.Orientation.Vertical)
    r = window.results
    r.set_stale("These figures are of the last version that built.")
    qtbot.waitUntil(lambda: r.banner.isVisible(), timeout=2000)
    qtbot.wait(100)
    b = r.banner
    margins = b.contentsMargins()
    one_line = b.fontMetrics().lineSpacing() + margins.top() + margins.bottom()
    assert b.height() == b.heightForWidth(b.width()) <= one_line + 2  # was 254 px
    assert r.splitter.height() >= r.height() - b.height() - 2  # the figures have the rest


class _RecordingPainter(QPainter):
    """Paints as QPainter does, noting each text with the font it was drawn in."""

    def __init__(self, device: QImage):
        super().__init__(device)
        self.texts: list[tuple[str, QFontMetricsF]] = []

    def drawText(self, *args: object) -> None:  # noqa: N802 (Qt naming)
        self.texts.append((str(args[-1]), QFontMetricsF(self.font(), self.device())))
        super().drawText(*args)  # type: ignore[call-overload]


def test_the_donut_centre_and_the_view_selector_are_read_whole(qtbot, window):
    est = open_template(qtbot, window, "mlp")
    r = window.results
    bar = r.tabs.tabBar()
    breakdown_tab = bar.tabRect(r.tabs.indexOf(r.donut.parentWidget())).center()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=breakdown_tab)
    combo = r.breakdown_view
    combo.setFocus()
    qtbot.keyClick(combo, Qt.Key.Key_Down)  # the nvidia-smi view
    assert combo.currentData() == "smi"
    opt = QStyleOptionComboBox()
    combo.initStyleOption(opt)
    field = combo.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                         QStyle.SubControl.SC_ComboBoxEditField, combo)
    for i in range(combo.count()):
        assert combo.fontMetrics().horizontalAdvance(combo.itemText(i)) <= field.width(), combo.itemText(i)
    # The centre's lines, painted as the donut in the window paints them, each inside the hole at its height.
    from render.donut import paint_donut

    smi = format_bytes(est.gpu.nvidia_smi_bytes)
    image = QImage(r.donut.size(), QImage.Format.Format_ARGB32)  # kept: the painter's device
    painter = _RecordingPainter(image)
    ring, _ = paint_donut(painter, QRectF(r.donut.rect()), r.donut.breakdown(), est.gpu.nvidia_smi_bytes,
                          caption="in nvidia-smi")
    painter.end()
    radius = ring.width() / 2 * (1 - 2 * 0.22)  # the hole: the ring less its thickness (22 % of the diameter)
    centre = {text: fm for text, fm in painter.texts if text in (smi, "in nvidia-smi")}
    assert set(centre) == {smi, "in nvidia-smi"}  # drawn whole, not elided
    for text, fm in centre.items():
        chord = 2 * math.sqrt(radius ** 2 - fm.height() ** 2)
        assert fm.horizontalAdvance(text) <= chord, (text, fm.horizontalAdvance(text), chord)
