"""The configuration panel's debounce (issue 24, edit → numbers): a spin box stepped (its arrow keys, buttons or
wheel) has its value whole at once and goes out after the short step debounce; a number typed digit by digit waits
the full one, so "4", "40", "409" do not each ask for an estimate."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from gui.config_panel import DEBOUNCE_MS, STEP_DEBOUNCE_MS, ConfigPanel  # noqa: E402


@pytest.fixture
def panel(qtbot):
    p = ConfigPanel()
    qtbot.addWidget(p)
    p.show()
    return p


def test_a_step_goes_out_after_the_short_debounce_and_a_typed_number_after_the_full_one(qtbot, panel):
    assert STEP_DEBOUNCE_MS < DEBOUNCE_MS
    box = panel.batch
    box.setFocus()
    start = box.value()
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as blocker:
        qtbot.keyClick(box, Qt.Key.Key_Up)
        assert panel._timer.isActive() and panel._timer.interval() == STEP_DEBOUNCE_MS
    assert blocker.args[0].batch_size == start + 1
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, "48")
    assert box.value() == 48 and panel._timer.interval() == DEBOUNCE_MS  # typed: the full debounce
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as blocker:
        pass
    assert blocker.args[0].batch_size == 48
    emitted: list[int] = []
    panel.configChanged.connect(lambda cfg: emitted.append(cfg.batch_size))
    qtbot.keyClick(box, Qt.Key.Key_Up)
    qtbot.keyClick(box, Qt.Key.Key_Up)  # a burst of steps is still one edit
    qtbot.waitUntil(lambda: emitted == [50], timeout=5000)
    qtbot.wait(2 * STEP_DEBOUNCE_MS)
    assert emitted == [50]
