"""The training configuration's edits are undoable (gui.config_undo): each user's change of a field is one command on
the window's undo stack, named for what it did; Ctrl+Z / Ctrl+Shift+Z / Ctrl+Y put the panel back and the engine is
asked for the restored configuration; a spin box's run of steps, or a typed number, is one command; opening a model
is not a command and leaves nothing of the model before to undo; undoing back to the saved file is clean again.
Driven with real key and mouse events on the offscreen platform; the figures are the engine's own estimates."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QUndoStack, QWheelEvent  # noqa: E402
from PySide6.QtWidgets import (  # noqa: E402
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QSpinBox,
)

from engine.sketch.document import Sketch  # noqa: E402
from gui.config_panel import ConfigPanel  # noqa: E402
from gui.config_undo import ConfigHistory  # noqa: E402
from tests.app_windows import open_template, press  # noqa: E402


def _estimate_after(qtbot, window, action):
    """Run `action` (an edit, an undo key) and return the traced estimate the window shows next."""
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        action()
    return blocker.args[0]


def _type(qtbot, box: QAbstractSpinBox, text: str) -> None:
    """Click into the spin box, select its number and type `text`, as a user replaces a value."""
    qtbot.mouseClick(box.lineEdit(), Qt.MouseButton.LeftButton)
    box.selectAll()
    qtbot.keyClicks(box, text)


def _wheel_up(widget) -> None:
    """One notch of the mouse wheel over the middle of `widget`, as the window system sends it."""
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    QApplication.sendEvent(widget, QWheelEvent(pos, widget.mapToGlobal(pos), QPoint(), QPoint(0, 120),
                                                Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                                                Qt.ScrollPhase.NoScrollPhase, False))


def _undo_text(window) -> str:
    return window.act_undo.text().replace("&", "")


def test_a_typed_batch_size_is_undone_and_redone_and_the_engine_follows(qtbot, window):
    first = open_template(qtbot, window, "mlp")
    box, stack = window.config_panel.batch, window.undo_stack()
    assert first.config.batch_size == 32 and not stack.canUndo()
    est64 = _estimate_after(qtbot, window, lambda: (_type(qtbot, box, "64"), press(qtbot, box, "Tab")))
    assert est64.config.batch_size == 64 and est64.peak_bytes > first.peak_bytes
    assert stack.count() == 1, "the digits of one typed number are one command"
    assert _undo_text(window) == "Undo Set batch size to 64"

    after_tab = window.focusWidget()  # the next field the Tab went to
    assert after_tab is not box and after_tab.parent() is not box
    back = _estimate_after(qtbot, window, lambda: press(qtbot, after_tab, "Ctrl+Z"))
    assert box.value() == 32 and window.config().batch_size == 32
    assert back.config.batch_size == 32 and back.peak_bytes == first.peak_bytes
    assert window.act_redo.text().replace("&", "") == "Redo Set batch size to 64"
    again = _estimate_after(qtbot, window, lambda: press(qtbot, after_tab, "Ctrl+Shift+Z"))
    assert box.value() == 64 and again.config.batch_size == 64 and again.peak_bytes == est64.peak_bytes
    assert stack.count() == 1, "undo and redo record nothing themselves"


def test_ctrl_z_typed_in_the_field_itself_is_the_window_s_undo(qtbot, window):
    open_template(qtbot, window, "mlp")
    n = len(window.current_sketch().nodes)
    window.builder.add_layer("ReLU")
    box = window.config_panel.batch
    _type(qtbot, box, "7")
    window.config_panel.flush()
    assert window.config().batch_size == 7
    press(qtbot, box, "Ctrl+Z")  # still typing in the batch size: the field's own text undo does not take it
    assert box.value() == 32 and window.undo_stack().index() == 1
    press(qtbot, box, "Ctrl+Z")  # the window's history, not the field's: the canvas's edit before it
    assert len(window.current_sketch().nodes) == n
    press(qtbot, box, "Ctrl+Y")
    press(qtbot, box, "Ctrl+Y")
    assert box.value() == 7 and len(window.current_sketch().nodes) == n + 1


def test_a_run_of_spin_steps_is_one_command_and_a_new_run_another(qtbot, window):
    open_template(qtbot, window, "mlp")
    box, stack = window.config_panel.batch, window.undo_stack()
    box.setFocus()
    for _ in range(2):
        qtbot.keyClick(box, Qt.Key.Key_Up)
    _wheel_up(box)  # the wheel over the focused box steps it too
    assert box.value() == 35 and stack.count() == 1
    assert _undo_text(window) == "Undo Set batch size to 35"
    press(qtbot, box, "Tab")  # the field's editing finished: the next step starts another command
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Down)
    assert box.value() == 34 and stack.count() == 2
    stack.undo()
    assert box.value() == 35
    back = _estimate_after(qtbot, window, stack.undo)  # the whole run of three steps, in one
    assert box.value() == 32 and back.config.batch_size == 32
    # Steps that come back to where they started leave nothing to undo.
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Up)
    qtbot.keyClick(box, Qt.Key.Key_Down)
    assert box.value() == 32 and stack.index() == 0


def test_ticking_checkpointing_is_undone(qtbot, window):
    open_template(qtbot, window, "mlp")
    tick = window.config_panel.checkpointing
    tick.setFocus()
    on = _estimate_after(qtbot, window, lambda: qtbot.keyClick(tick, Qt.Key.Key_Space))
    assert tick.isChecked() and on.config.checkpointing
    assert _undo_text(window) == "Undo Tick activation checkpointing"
    off = _estimate_after(qtbot, window, window.act_undo.trigger)
    assert not tick.isChecked() and not off.config.checkpointing
    assert window.act_redo.text().replace("&", "") == "Redo Tick activation checkpointing"


def test_a_precision_chosen_from_its_combo_box_is_undone_and_redone(qtbot, window):
    first = open_template(qtbot, window, "mlp")
    combo = window.config_panel.precision
    assert first.config.precision == "fp32"
    combo.setFocus()
    fp16 = _estimate_after(qtbot, window, lambda: qtbot.keyClick(combo, Qt.Key.Key_Down))
    assert fp16.config.precision == "fp16" and _undo_text(window) == "Undo Set precision to FP16 (pure)"
    assert fp16.peak_bytes < first.peak_bytes  # half the bytes per element: the engine saw the change
    back = _estimate_after(qtbot, window, lambda: press(qtbot, combo, "Ctrl+Z"))
    assert combo.currentData() == "fp32" and back.config.precision == "fp32" and back.peak_bytes == first.peak_bytes
    redone = _estimate_after(qtbot, window, lambda: press(qtbot, combo, "Ctrl+Shift+Z"))
    assert combo.currentData() == "fp16" and redone.peak_bytes == fp16.peak_bytes


def test_config_and_canvas_edits_share_one_history_in_the_order_made(qtbot, window):
    open_template(qtbot, window, "mlp")
    stack, panel = window.undo_stack(), window.config_panel
    n = len(window.current_sketch().nodes)
    redraws: list[object] = []
    window.document.changed.connect(redraws.append)
    window.builder.add_layer("ReLU")
    panel.optimizer.setCurrentIndex(panel.optimizer.findData("sgd"))
    assert [stack.text(i) for i in range(stack.count())][-1] == "Set optimizer to SGD"
    del redraws[:]
    stack.undo()  # the optimizer first; the canvas is not redrawn for a setting
    assert panel.optimizer.currentData() == "adam" and len(window.current_sketch().nodes) == n + 1
    assert redraws == []
    stack.undo()
    assert len(window.current_sketch().nodes) == n and redraws


def test_opening_a_model_leaves_nothing_of_the_one_before_to_undo(qtbot, window, tmp_path):
    open_template(qtbot, window, "mlp")
    panel, stack = window.config_panel, window.undo_stack()
    panel.batch.setValue(64)
    window.builder.add_layer("ReLU")
    assert stack.count() == 2
    open_template(qtbot, window, "lenet")  # a template stores no training setup: the panel's stays, as it is
    assert not stack.canUndo() and not window.act_undo.isEnabled()
    press(qtbot, window, "Ctrl+Z")
    assert panel.batch.value() == 64

    # A sketch saved with its configuration: set from the file, not an edit.
    path = tmp_path / "stored.json"
    panel.batch.setValue(48)
    panel.precision.setCurrentIndex(panel.precision.findData("bf16"))
    assert window.save_as(str(path)) and Sketch.load(path).training["batch_size"] == 48
    panel.batch.setValue(8)
    assert window.open_path(str(path))
    assert panel.batch.value() == 48 and not stack.canUndo()

    # A built-in (read-only) model: the sketch's history, hidden now, is not undone unseen either.
    panel.batch.setValue(16)
    window.builder.add_layer("ReLU")
    assert window.open_model("resnet18")
    assert not stack.canUndo()
    panel.batch.setValue(4)  # its own settings' edits are undoable
    assert _undo_text(window) == "Undo Set batch size to 4"
    stack.undo()
    assert panel.batch.value() == 16


def test_undoing_back_to_the_saved_file_is_clean_again(qtbot, window, tmp_path):
    open_template(qtbot, window, "mlp")
    path = tmp_path / "net.json"
    assert window.save_as(str(path))
    box, stack = window.config_panel.batch, window.undo_stack()
    # Ticked and unticked again: two commands, and the file's configuration, so nothing to save.
    tick = window.config_panel.checkpointing
    tick.setFocus()
    qtbot.keyClick(tick, Qt.Key.Key_Space)
    qtbot.keyClick(tick, Qt.Key.Key_Space)
    window.config_panel.flush()
    assert stack.count() == 2 and not stack.isClean()
    assert not window.is_dirty() and window.windowTitle().startswith("net.json —")
    stack.undo()
    stack.undo()
    _type(qtbot, box, "64")
    press(qtbot, box, "Tab")
    window.config_panel.flush()
    assert window.windowTitle().startswith("net.json*") and window.is_dirty()
    press(qtbot, window.focusWidget(), "Ctrl+Z")
    assert stack.isClean()
    qtbot.waitUntil(lambda: window.windowTitle().startswith("net.json —"), timeout=5000)  # after the debounce
    assert not window.is_dirty()
    press(qtbot, window.focusWidget(), "Ctrl+Y")
    window.config_panel.flush()
    assert window.windowTitle().startswith("net.json*")
    stack.undo()
    window.config_panel.flush()
    assert stack.isClean() and not window.is_dirty()
    # A canvas edit, then a setting: undoing only the setting leaves the sketch's edit unsaved.
    window.builder.add_layer("ReLU")
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_Up)
    stack.undo()
    window.config_panel.flush()
    assert box.value() == 32 and window.is_dirty() and window.windowTitle().startswith("net.json*")
    stack.undo()
    assert stack.isClean() and not window.is_dirty()


# ---- the panel alone: every field is recorded and restored

@pytest.fixture
def recorded(qtbot):
    panel = ConfigPanel()
    qtbot.addWidget(panel)
    stack = QUndoStack(panel)
    ConfigHistory(panel, stack, panel)
    return panel, stack


def test_every_field_of_the_panel_is_one_the_history_knows(recorded):
    panel, _stack = recorded
    spin_edits = {box.lineEdit() for box in panel.findChildren(QAbstractSpinBox)}
    shown = [*panel.findChildren(QCheckBox), *panel.findChildren(QComboBox), *panel.findChildren(QAbstractSpinBox),
             *(e for e in panel.findChildren(QLineEdit) if e not in spin_edits)]
    assert set(shown) == set(panel.fields().values())


def _another(field) -> None:
    """Give the field a value other than the one it shows, as the user's edit sets it."""
    if isinstance(field, QCheckBox):
        field.toggle()
    elif isinstance(field, QComboBox):
        field.setCurrentIndex((field.currentIndex() + 1) % field.count())
    elif isinstance(field, QLineEdit):
        field.setText(field.text() + "x")
    elif isinstance(field, QDoubleSpinBox):
        field.setValue(0.5 if field.value() != 0.5 else 0.25)
    else:
        assert isinstance(field, QSpinBox)
        field.setValue(field.value() + 1 if field.value() < field.maximum() else field.value() - 1)


def test_each_field_s_change_is_one_named_command_and_undo_restores_it(recorded):
    panel, stack = recorded
    for name, field in panel.fields().items():
        before = panel.field_value(name)
        count = stack.count()
        _another(field)
        after = panel.field_value(name)
        assert after != before and stack.count() == count + 1, name
        text = stack.text(stack.count() - 1)
        assert text.split(" ")[0] in ("Set", "Tick", "Untick", "Clear") and panel.field_label(name) in text, text
        stack.undo()
        assert panel.field_value(name) == before and stack.count() == count + 1, name
        stack.redo()
        assert panel.field_value(name) == after, name
        if isinstance(field, (QAbstractSpinBox, QLineEdit)):
            field.editingFinished.emit()  # the next field's edit is apart from this one's anyway


def test_a_configuration_set_from_a_file_is_not_an_edit(recorded):
    panel, stack = recorded
    cfg = panel.config()
    panel.batch.setValue(9)
    assert stack.count() == 1
    panel.set_config(cfg)
    assert stack.count() == 1 and panel.batch.value() == 32
    panel.batch.setValue(10)  # the next edit starts from what the file set, not from 9
    assert stack.count() == 2
    stack.undo()
    assert panel.batch.value() == 32


def test_undo_and_redo_act_only_on_the_builder_tab(qtbot, window):
    """Ctrl+Z on the Monitor tab would take back an edit the user cannot see (the canvas and the configuration are
    off screen there): it does nothing until the Builder tab is back."""
    from gui.tabs import BUILDER, MONITOR

    open_template(qtbot, window, "mlp")
    box, stack = window.config_panel.batch, window.undo_stack()
    _estimate_after(qtbot, window, lambda: (_type(qtbot, box, "48"), press(qtbot, box, "Tab")))
    window.tabs.setCurrentIndex(MONITOR)
    press(qtbot, window, "Ctrl+Z")
    window.act_undo.trigger()
    assert box.value() == 48 and stack.index() == 1 and window.act_undo.isEnabled()
    window.tabs.setCurrentIndex(BUILDER)
    back = _estimate_after(qtbot, window, window.act_undo.trigger)
    assert box.value() == 32 and back.config.batch_size == 32 and stack.index() == 0
    window.tabs.setCurrentIndex(MONITOR)
    window.act_redo.trigger()
    assert box.value() == 32 and stack.index() == 0
    window.tabs.setCurrentIndex(BUILDER)
    _estimate_after(qtbot, window, lambda: press(qtbot, window, "Ctrl+Shift+Z"))
    assert box.value() == 48 and stack.index() == 1
