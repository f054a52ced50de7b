"""The training settings are part of the sketch file: changing one in the panel is unsaved work (the title's mark,
the question on Ctrl+Q), and putting it back, or saving, is not."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from engine.sketch.document import Sketch  # noqa: E402
from tests.app_windows import open_window, press  # noqa: E402


def _type_batch(qtbot, window, text: str) -> None:
    box = window.config_panel.batch
    qtbot.mouseClick(box.lineEdit(), Qt.MouseButton.LeftButton)
    box.selectAll()
    qtbot.keyClicks(box, text)


def test_a_batch_size_change_is_unsaved_work_and_ctrl_q_asks_before_losing_it(qtbot, tmp_path, monkeypatch):
    window = open_window(qtbot, tmp_path, exposed=True)
    path = tmp_path / "net.json"
    assert window.open_template("mlp") and window.save_as(str(path))
    assert window.config().batch_size == 32 and not window.windowTitle().startswith("net.json*")
    asked: list[str] = []

    def question(parent, title, text, buttons, default):
        asked.append(text)
        return QMessageBox.StandardButton.Cancel

    monkeypatch.setattr(QMessageBox, "question", question)
    window.confirm_close = True
    _type_batch(qtbot, window, "64")
    press(qtbot, window, "Ctrl+Q")  # at once: the panel's debounce has not run yet
    assert asked == ["Save the changes to net.json?"]
    assert window.isVisible()  # cancelled: the window and the change stay
    assert window.windowTitle().startswith("net.json*") and window.config().batch_size == 64
    # Back to what the file holds: nothing to save, nothing asked.
    _type_batch(qtbot, window, "32")
    window.config_panel.flush()
    assert window.windowTitle().startswith("net.json —")
    # Saved with the change: the file holds it, the mark goes, and Ctrl+Q closes without a question.
    _type_batch(qtbot, window, "48")
    press(qtbot, window, "Ctrl+S")
    assert Sketch.load(path).training["batch_size"] == 48
    assert window.windowTitle().startswith("net.json —")
    press(qtbot, window, "Ctrl+Q")
    assert asked == ["Save the changes to net.json?"] and not window.isVisible()


def test_opening_a_sketch_is_not_a_change(qtbot, tmp_path):
    window = open_window(qtbot, tmp_path)
    window.config_panel.batch.setValue(5)  # the panel's leftover setting from the last model
    window.config_panel.flush()
    assert window.open_template("mlp")  # a template saved without a training setup takes the panel's
    assert "*" not in window.windowTitle() and not window.is_dirty()
    window.close()
