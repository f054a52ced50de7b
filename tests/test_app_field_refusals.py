"""A number typed past a field's range is refused where it is typed, and the refusal stays said: the batch field
kept 999,999,999 of 99,999,999,999,999 and the message went with the next estimate."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from tests.app_windows import open_window  # noqa: E402


def test_a_batch_past_the_fields_range_is_refused_and_stays_said(qtbot, tmp_path):
    window = open_window(qtbot, tmp_path, exposed=True)
    assert window.open_template("mlp")
    panel = window.config_panel
    box, msg = panel.batch, panel.message
    qtbot.mouseClick(box.lineEdit(), Qt.MouseButton.LeftButton)
    box.selectAll()
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as sent:
        qtbot.keyClicks(box, "99,999,999,999,999")
    assert box.value() == 999_999_999 and sent.args[0].batch_size == 999_999_999
    # After the debounced edit went out, the refusal is still there, saying what the field kept.
    assert msg.isVisible()
    assert msg.text() == ("Batch size: 9,999,999,999 is refused; it can be at most 2,147,483,647, so it stays "
                          "999,999,999.")
    # The next edit the field takes clears it.
    box.selectAll()
    with qtbot.waitSignal(panel.configChanged, timeout=5000) as sent:
        qtbot.keyClicks(box, "64")
    assert sent.args[0].batch_size == 64 and not msg.isVisible()
    window.close()
