"""Replaying a recording shows what was known at the replayed instant: the alerts raised by then (not those of the
recording's end from its first sample), and the estimate's predicted-peak label inside the memory plot."""

from __future__ import annotations

import pytest

from engine.core.units import GIB
from engine.monitor.recording import ReplaySource
from tests.test_monitor_panel import _record

pytest.importorskip("pytestqt")
from PySide6.QtCore import Qt  # noqa: E402


def test_the_replayed_alerts_are_those_raised_by_the_position(monitor_panel, qtbot, tmp_path):
    path, snaps = _record(tmp_path, fill_gpu0_at=3)  # GPU 0 past 95 % from sample 3; GPU 1 lost at sample 2
    p = monitor_panel(source=ReplaySource(snaps))
    p.show()
    qtbot.waitExposed(p)
    assert p.replay_position == 4 and p.alert_list.count() == len(p.alerts) >= 2
    p.slider.setFocus()
    qtbot.keyClick(p.slider, Qt.Key.Key_Home)  # the first sample: nothing raised yet
    assert p.replay_position == 0
    assert p.alert_list.count() == 0 and p.plots.alert_marks == []
    qtbot.keyClick(p.slider, Qt.Key.Key_Right)
    qtbot.keyClick(p.slider, Qt.Key.Key_Right)  # sample 2: GPU 1 lost, memory still fine
    listed = [p.alert_list.item(i).text() for i in range(p.alert_list.count())]
    assert len(listed) == 1 and "GPU 1" in listed[0]
    assert [a.kind for a in p.plots.alert_marks] == ["lost"]
    qtbot.keyClick(p.slider, Qt.Key.Key_End)
    assert p.replay_position == 4 and p.alert_list.count() == len(p.alerts)
    assert {a.kind for a in p.plots.alert_marks} >= {"lost", "memory"}


@pytest.mark.parametrize("need_gib", [2.0, 33.3, 40.0, 70.0])  # below the curve, at its top, above it
def test_the_predicted_peak_label_is_inside_the_memory_plot(monitor_panel, qtbot, tmp_path, need_gib):
    _, snaps = _record(tmp_path)  # GPU 0 from 29.3 to 33.3 GiB
    p = monitor_panel(source=ReplaySource(snaps))
    p.resize(1200, 800)
    p.show()
    qtbot.waitExposed(p)
    p.set_estimate_overlay("llama-3.1-8b", int(need_gib * GIB))
    p.plots.repaint_from_buffer(force=True)
    plot = p.plots.plots["memory"].getPlotItem()
    label = p.plots._overlay_line.label
    qtbot.waitUntil(lambda: plot.getViewBox().viewRange()[1][1] >= need_gib, timeout=2000)
    qtbot.wait(50)  # the label follows the view's range change
    view = plot.getViewBox().sceneBoundingRect()
    box = label.sceneBoundingRect()
    assert label.isVisible() and "predicted peak" in label.toPlainText()
    assert view.contains(box), (view, box)
    assert not box.intersects(plot.legend.sceneBoundingRect())  # nor under the GPUs' legend
