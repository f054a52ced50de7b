"""The training configuration's edits on the window's undo stack: each change of a configuration field (batch size,
precision, checkpointing, …) is one command, undone and redone with the canvas's edits by Edit ▸ Undo / Redo.

The stack is the sketch document's (gui.builder.document): one history, in the order the user worked. A command
holds one field's value before and after; undoing it shows the old value in the panel as a user's edit is shown
(the panel's debounce, then the engine) but records nothing (gui.config_panel.restore_field). Consecutive steps of
one spin box (arrow keys, wheel, its buttons) merge into one command, and so do the digits of one typed number or
the characters of one typed text, until the field's editing finishes (Enter, the focus leaving it) or something
else is done; a run that comes back to where it started leaves no command. A configuration set from a file, a
template or the settings is not an edit (the panel's `loaded`); opening another model drops the history (as the
document does for a sketch it opens).

In a field with a text cursor the window's undo keys go to this history, not to the field's own text undo: Ctrl+Z
typed in the batch size takes back the batch size, as Edit ▸ Undo does.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QKeyEvent, QKeySequence, QUndoCommand, QUndoStack
from PySide6.QtWidgets import QAbstractSpinBox, QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

from .actions import redo_shortcuts
from .builder.document import OffSketchCommand
from .config_panel import ConfigPanel, Field, FieldValue

CONFIG_EDIT_ID = 2001  # QUndoCommand.id of every configuration edit (mergeWith decides which ones merge)
STEP, TYPED = "step", "typed"  # the runs that merge: a spin box's steps, a field's typed characters
# A spin box's special value ("model default" in the field) as an undo command says it.
_SPECIAL = {"seq_len": "the model's default", "image_size": "the model's default", "lora_alpha": "twice the rank",
            "prompt_len": "the sequence length", "top_k": "the model's default", "top_p": "the model's default"}


def _shown(name: str, field: QSpinBox | QDoubleSpinBox) -> str:
    if field.specialValueText() and field.value() == field.minimum():
        return _SPECIAL.get(name, field.specialValueText())
    return field.textFromValue(field.value())  # type: ignore[arg-type]  # (int or float: the box's own)


def describe(panel: ConfigPanel, name: str) -> str:
    """The command's text for the field as it shows now: "Set batch size to 64", "Tick activation checkpointing",
    "Set precision to AMP BF16", "Clear LoRA targets"."""
    field, label = panel.fields()[name], panel.field_label(name)
    if isinstance(field, QCheckBox):
        return f"{'Tick' if field.isChecked() else 'Untick'} {label}"
    if isinstance(field, QComboBox):
        return f"Set {label} to {field.currentText()}"
    if isinstance(field, QLineEdit):
        text = field.text().strip()
        return f"Set {label} to “{text}”" if text else f"Clear {label}"
    return f"Set {label} to {_shown(name, field)}"


class ConfigEdit(OffSketchCommand):
    """One field's change: `name` from `before` to `after`. `run` (STEP or TYPED) merges the next edit of the same
    field and kind while `open`; None (a tick, a combo box's choice) never merges."""

    def __init__(self, history: ConfigHistory, name: str, before: FieldValue, after: FieldValue, text: str,
                 run: str | None):
        super().__init__(text)
        self.history, self.name, self.before, self.after, self.run = history, name, before, after, run
        self.open = run is not None
        self._done = True  # the panel already shows `after`: the stack's first redo has nothing to do

    def id(self) -> int:  # noqa: A003 - Qt override
        return CONFIG_EDIT_ID

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt override
        if not (self.open and isinstance(other, ConfigEdit) and other.name == self.name and other.run == self.run):
            return False
        self.after = other.after
        self.setText(other.text())
        self.setObsolete(self.after == self.before)  # back where the run started: the stack drops it
        return True

    def redo(self) -> None:
        if self._done:
            self._done = False
            return
        self.open = False
        self.history.show(self.name, self.after)

    def undo(self) -> None:
        self.open = False
        self.history.show(self.name, self.before)


class ConfigHistory(QObject):
    """Records the panel's edits on `stack` (the window's undo stack) and shows its undos and redos."""

    def __init__(self, panel: ConfigPanel, stack: QUndoStack, parent: QObject | None = None):
        super().__init__(parent)
        self.panel, self.stack = panel, stack
        self._values = self._read()  # each field's value as the last command (or configuration) left it
        self._keys = [QKeySequence(QKeySequence.StandardKey.Undo), *redo_shortcuts()]
        panel.fieldEdited.connect(self._edited)
        panel.loaded.connect(self._loaded)
        for name, field in panel.fields().items():
            if isinstance(field, (QAbstractSpinBox, QLineEdit)):
                field.editingFinished.connect(partial(self._finished, name))
                field.installEventFilter(self)

    def _read(self) -> dict[str, FieldValue]:
        return {name: self.panel.field_value(name) for name in self.panel.fields()}

    def _loaded(self) -> None:
        """A configuration was set (a file's, a template's): the next edit starts from it."""
        self._values = self._read()
        top = self._top()
        if top is not None:
            top.open = False

    def _edited(self, name: str, stepped: bool) -> None:
        before, after = self._values[name], self.panel.field_value(name)
        if before == after:
            return
        self._values[name] = after
        field: Field = self.panel.fields()[name]
        run = (STEP if stepped else TYPED) if isinstance(field, (QAbstractSpinBox, QLineEdit)) else None
        self.stack.push(ConfigEdit(self, name, before, after, describe(self.panel, name), run))

    def _finished(self, name: str) -> None:
        """The field's editing finished (Enter, the focus left it): its next edit is a new command."""
        top = self._top()
        if top is not None and top.name == name:
            top.open = False

    def _top(self) -> ConfigEdit | None:
        top = self.stack.command(self.stack.index() - 1)
        return top if isinstance(top, ConfigEdit) else None

    def show(self, name: str, value: FieldValue) -> None:
        """An undo or redo: the field shows `value` again."""
        self._values[name] = value
        self.panel.restore_field(name, value)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        # A field's text cursor would take the window's undo keys for its own text undo (it accepts their
        # ShortcutOverride); left unaccepted, they reach Edit ▸ Undo / Redo.
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent) and \
                QKeySequence(event.keyCombination()) in self._keys:
            event.ignore()
            return True
        return super().eventFilter(watched, event)
