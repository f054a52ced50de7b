"""The app as a new user meets it (issue 13): the standard keys, the docks per tab, what each view says about
the figures it shows. Driven with real key and mouse events on the offscreen platform."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtGui import QKeySequence  # noqa: E402


@pytest.fixture
def window(qtbot, tmp_path):
    from gui.main_window import MainWindow

    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat), restore_state=False,
                   engine_processes=False)
    w.confirm_close = False
    w.auto_plan = False
    qtbot.addWidget(w)
    w.show()
    w.activateWindow()
    qtbot.waitExposed(w)
    yield w
    w.close()


def _press(qtbot, widget, seq: str) -> None:
    """The key sequence as the user types it: key presses with modifiers, to the focused widget."""
    combo = QKeySequence(seq)[0]
    qtbot.keyClick(widget, combo.key(), combo.keyboardModifiers())


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
        _press(qtbot, canvas, "Ctrl+Z")
        assert len(window.current_sketch().nodes) == n_nodes, "Ctrl+Z did not undo"
        _press(qtbot, canvas, redo)
        assert len(window.current_sketch().nodes) == n_nodes + 1, f"{redo} did not redo"
    assert stack.canUndo()
