"""The builder's open document: the engine Sketch, its file, its undo stack, the dirty mark, autosave and
recovery after a crash. Saving goes through the engine (atomic); nothing here computes memory.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QLockFile, QObject, QStandardPaths, QTimer, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack
from PySide6.QtWidgets import QWidget

from engine.core.atomic_write import replace_atomically
from engine.core.bounded_read import read_text
from engine.core.errors import UserError
from engine.sketch.document import MAX_SKETCH_BYTES, Sketch, parse_json

from .commands import SketchCommand

AUTOSAVE_PREFIX = "autosave-"
AUTOSAVE_FORMAT = "vramscope-autosave"
AUTOSAVE_DELAY_S = 3.0  # the autosave follows the last edit this closely (a crash loses seconds, not a minute)
AUTOSAVE_MAX_WAIT_S = 30.0  # …and is never put off longer than this by edits that keep coming


def default_autosave_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    if not base:
        base = str(Path(tempfile.gettempdir()) / "vramscope")
    return Path(base) / "autosave"


def _new_sketch() -> Sketch:
    return Sketch()


def sketch_to_obj(sketch: Sketch) -> dict[str, Any]:
    return sketch.to_json()


def sketch_from_obj(obj: object) -> Sketch:
    try:
        return Sketch.from_json(obj)
    except (TypeError, AttributeError):
        return Sketch.from_json(json.dumps(obj))


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, text)


def read_autosave(path: Path) -> tuple[Sketch, dict[str, Any]]:
    """(sketch, payload) of an autosave file; UserError (naming the file) when it cannot be read."""
    try:
        payload = parse_json(read_text(path, max_bytes=MAX_SKETCH_BYTES, what="autosave file"), str(path))
        if not isinstance(payload, dict) or payload.get("format") != AUTOSAVE_FORMAT:
            raise ValueError("not an autosave")
        if payload.get("version") != 1:
            raise ValueError(f"autosave version {payload.get('version')!r} is not one this VRAMScope reads")
        sketch = sketch_from_obj(payload["sketch"])
    except UserError as err:
        raise UserError(f"the autosave cannot be read ({err}); it was left in place", where=str(path)) from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise UserError(f"the autosave cannot be read ({err}); it was left in place", where=str(path)) from None
    return sketch, payload


def original_path(payload: dict[str, Any]) -> Path | None:
    """The file an autosave says its sketch came from, when that is a plausible path; None otherwise."""
    original = payload.get("original_path")
    if not isinstance(original, str) or not original or "\0" in original or len(original) > 4096:
        return None
    return Path(original)


class OffSketchCommand(QUndoCommand):
    """An undoable edit that shares the document's undo stack (one Ctrl+Z history for the window) but changes no
    part of the sketch: the training configuration's (gui.config_undo). Undoing or redoing one does not redraw the
    canvas, and it is unsaved work only through what it changes: the configuration, which the document compares
    with its file's (`set_training`)."""


class SketchDocument(QObject):
    """One sketch being edited.

    Signals: changed(sketch) after every edit, undo, redo and replacement; dirtyChanged(bool);
    pathChanged(str) ('' when untitled); refused(str) when the engine refuses an edit (the reason);
    replaced(sketch) when a whole new sketch is shown (new, open, recover, set_sketch), before `changed`.
    `prepare` (optional callable) sees every such sketch first — the builder tidies overlapping cards there.
    """

    # Autosave names of documents alive in this process: never offered for recovery.
    _live_names: set[str] = set()

    changed = Signal(object)
    replaced = Signal(object)
    dirtyChanged = Signal(bool)
    pathChanged = Signal(str)
    refused = Signal(str)

    def __init__(self, parent: QObject | None = None, *, autosave_dir: str | Path | None = None,
                 autosave_interval_s: float = AUTOSAVE_DELAY_S):
        super().__init__(parent)
        self.prepare: Callable[[Sketch], object] | None = None
        self._sketch = _new_sketch()
        self._path: Path | None = None
        self._read_only = False
        self._forced_dirty = False  # a recovered sketch is unsaved although its undo stack is clean
        self._saved_training: dict[str, Any] | None = None  # the training configuration its file holds
        # the file a recovered autosave says it came from: offered in Save As, never written without the user
        self._recovered_from: Path | None = None
        self._last_dirty = False
        self._index = 0  # the undo stack's index as last seen: which commands an index change undid or redid
        self._forgetting = False  # the history is being dropped: its index and clean changes are not edits
        self._stack = QUndoStack(self)
        self._stack.indexChanged.connect(self._on_index_changed)
        self._stack.cleanChanged.connect(self._on_clean_changed)
        self._autosave_dir = Path(autosave_dir) if autosave_dir else default_autosave_dir()
        self._autosave_name = f"{AUTOSAVE_PREFIX}{int(time.time())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._lock: QLockFile | None = None
        self._autosaved_index: int | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._autosave_tick)
        self._delay_s = 0.0
        self._unsaved_since: float | None = None  # monotonic time of the first edit the autosave lacks
        self.set_autosave_interval(autosave_interval_s)

    # ---- state -------------------------------------------------------------------------------------
    @property
    def sketch(self) -> Sketch:
        return self._sketch

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def suggested_path(self) -> Path | None:
        """Where Save As starts: the document's file, else the file a recovered autosave came from."""
        return self._path or self._recovered_from

    @property
    def read_only(self) -> bool:
        return self._read_only

    def undo_stack(self) -> QUndoStack:
        return self._stack

    def is_dirty(self) -> bool:
        return self._forced_dirty or self._sketch_unsaved() or self._sketch.training != self._saved_training

    def _sketch_unsaved(self) -> bool:
        """Whether the sketch's edits since the file was saved are not all undone: a sketch edit lies between the
        history's clean point and now (configuration edits count by what they change: `training`)."""
        stack = self._stack
        if stack.isClean():
            return False
        clean = stack.cleanIndex()
        if clean < 0:  # the saved point left the history (undone past, then something else done)
            return True
        return self._moves_sketch(clean, stack.index())

    def _moves_sketch(self, a: int, b: int) -> bool:
        """Whether the commands between history indices `a` and `b` include one that edits the sketch."""
        lo, hi = sorted((a, b))
        return any(not isinstance(self._stack.command(i), OffSketchCommand) for i in range(lo, hi))

    def display_name(self) -> str:
        if self._path is not None:
            return self._path.name
        name = self._sketch.name
        return "Untitled" if name in ("", "untitled") else name

    def _on_clean_changed(self, _clean: bool) -> None:
        if self._forgetting:
            return
        try:
            self._emit_dirty()
        except RuntimeError:
            pass  # the stack is being destroyed with its document (application exit)

    def _emit_dirty(self) -> None:
        d = self.is_dirty()
        if d != self._last_dirty:
            self._last_dirty = d
            self.dirtyChanged.emit(d)

    def _on_index_changed(self, index: int) -> None:
        if self._forgetting:
            return
        before, self._index = self._index, index
        if before == index:  # no command done or undone: the top one took a merge
            before = max(index - 1, 0)
        if self._moves_sketch(before, index):  # a configuration's edit does not redraw the canvas
            self.changed.emit(self._sketch)
        self._emit_dirty()
        self._schedule_autosave()

    def _schedule_autosave(self) -> None:
        """Debounced: the autosave runs `delay` after the last edit, or at once once edits have kept it waiting
        AUTOSAVE_MAX_WAIT_S."""
        if self._delay_s <= 0:
            return
        now = time.monotonic()
        if self._unsaved_since is None:
            self._unsaved_since = now
        wait = min(self._delay_s, max(0.0, self._unsaved_since + AUTOSAVE_MAX_WAIT_S - now))
        self._timer.start(int(wait * 1000))

    def _set_path(self, path: Path | None) -> None:
        if path != self._path:
            self._path = path
            self.pathChanged.emit(str(path) if path else "")

    # ---- editing -----------------------------------------------------------------------------------
    def push(self, command: SketchCommand) -> bool:
        """Run `command` once and put it on the undo stack; False (and `refused`) when the engine says no."""
        if self._read_only:
            self.refused.emit("This model is read-only; open a template or a sketch to edit it.")
            return False
        try:
            command.first_run()
        except UserError as err:
            self.refused.emit(str(err))
            return False
        self._stack.push(command)
        return True

    def set_sketch(self, sketch: Sketch, path: str | Path | None = None, read_only: bool = False) -> None:
        """Start over with `sketch`: the undo history is dropped and the document is clean."""
        if self.prepare is not None:
            self.prepare(sketch)
        self._sketch = sketch
        self._read_only = bool(read_only)
        self._forced_dirty = False
        self._saved_training = sketch.training
        self._forget_history()
        self._autosaved_index = None
        self._recovered_from = None
        self._set_path(Path(path) if path else None)
        self._emit_dirty()
        self.replaced.emit(self._sketch)
        self.changed.emit(self._sketch)

    def _forget_history(self) -> None:
        # The stack's signals go out (the window's Undo and Redo actions follow them: blocked, they went on
        # offering the dropped history's last edit); this document's own answers to them are left out.
        self._forgetting = True
        try:
            self._stack.clear()
            self._stack.setClean()
        finally:
            self._forgetting = False
        self._index = 0

    def forget_history(self) -> None:
        """Another model is open in the window (a read-only one, shown instead of this sketch): nothing of the
        history, the sketch's edits or the configuration's, is offered to undo there."""
        self._forget_history()
        self._emit_dirty()

    def set_training(self, training: dict[str, Any], *, saved: bool = False) -> None:
        """The training configuration (TrainConfig.to_json) the file stores with the sketch: one that differs from
        the file's is unsaved work, as an edit is; `saved`: what the file holds (a sketch saved without one)."""
        if training == self._sketch.training and not saved:
            return
        self._sketch.training = dict(training)
        if saved:
            self._saved_training = self._sketch.training
        self._autosaved_index = None  # the autosave lacks it
        self._emit_dirty()
        self._schedule_autosave()

    def set_read_only(self, read_only: bool) -> None:
        if bool(read_only) != self._read_only:
            self._read_only = bool(read_only)
            self.changed.emit(self._sketch)

    # ---- files -------------------------------------------------------------------------------------
    def new(self, template: str | None = None) -> None:
        """An empty sketch, or a copy of a built-in template (untitled either way)."""
        if template:
            from engine.sketch.document import load_template

            self.set_sketch(load_template(template))
        else:
            self.set_sketch(_new_sketch())

    def open(self, path: str | Path) -> None:
        """Load a sketch file; raises UserError (naming the file, node and field) when it is not valid."""
        from engine.sketch.document import Sketch

        p = Path(path)
        sketch = Sketch.load(p)
        self.set_sketch(sketch, path=p)

    def save(self) -> Path:
        if self._path is None:
            raise UserError("this sketch has no file yet; use Save As")
        return self.save_as(self._path)

    def save_as(self, path: str | Path) -> Path:
        p = Path(path)
        if self._sketch.name in ("", "untitled") or (self._path is not None and self._sketch.name == self._path.stem):
            self._sketch.name = p.stem  # its name follows its file: the report's title, the exported class
        self._sketch.save(p)  # atomic in the engine: temp file + os.replace
        self._set_path(p)
        self._forced_dirty = False
        self._saved_training = self._sketch.training
        self._stack.setClean()
        self._emit_dirty()
        self.discard_autosave()
        return p

    # ---- autosave and recovery ---------------------------------------------------------------------
    def set_autosave_interval(self, seconds: float) -> None:
        """The delay between the last edit and its autosave; 0 turns autosave off."""
        self._timer.stop()
        self._delay_s = float(seconds) if seconds and seconds > 0 else 0.0

    def autosave_dir(self) -> Path:
        return self._autosave_dir

    def autosave_path(self) -> Path:
        return self._autosave_dir / f"{self._autosave_name}.json"

    def _lock_path_for(self, autosave: Path) -> Path:
        return autosave.with_suffix(".lock")

    def _autosave_tick(self) -> None:
        self._unsaved_since = None
        if self.is_dirty() and self._autosaved_index != self._stack.index():
            try:
                self.autosave_now()
            except OSError:
                pass  # a full disk must not interrupt editing; the next tick tries again

    def autosave_now(self) -> Path:
        """Write the sketch (even when clean) to this document's autosave file, atomically."""
        self._autosave_dir.mkdir(parents=True, exist_ok=True)
        SketchDocument._live_names.add(self._autosave_name)
        if self._lock is None:
            # The lock tells a later run whether this file's owner is still alive (not a crash leftover).
            self._lock = QLockFile(str(self._lock_path_for(self.autosave_path())))
            self._lock.setStaleLockTime(0)
            self._lock.tryLock(0)
        payload = {
            "format": AUTOSAVE_FORMAT,
            "version": 1,
            "original_path": str(self.suggested_path) if self.suggested_path else None,
            "saved_at": time.time(),
            "sketch": sketch_to_obj(self._sketch),
        }
        _atomic_write_text(self.autosave_path(), json.dumps(payload))
        self._autosaved_index = self._stack.index()
        return self.autosave_path()

    def discard_autosave(self) -> None:
        """Remove this document's autosave (after a save or on a clean exit)."""
        try:
            self.autosave_path().unlink()
        except OSError:
            pass
        if self._lock is not None:
            self._lock.unlock()
            self._lock = None
        SketchDocument._live_names.discard(self._autosave_name)
        self._autosaved_index = None

    def find_recoverable(self) -> list[Path]:
        """Autosaves left by runs that ended without closing their document (a crash), newest first."""
        d = self._autosave_dir
        if not d.is_dir():
            return []
        out = []
        for f in d.glob(f"{AUTOSAVE_PREFIX}*.json"):
            if f.stem in SketchDocument._live_names:
                continue
            lock_path = self._lock_path_for(f)
            if lock_path.exists():
                probe = QLockFile(str(lock_path))
                probe.setStaleLockTime(0)
                info = probe.getLockInfo()  # (pid, host, app) in PySide6; older bindings put ok first
                pid = next((v for v in info if isinstance(v, int) and not isinstance(v, bool)), None)
                alive = not probe.tryLock(0)
                # Our own pid in a file no live document here owns can only be a leftover (pid reuse).
                if alive and pid != os.getpid():
                    continue
                probe.unlock()
            out.append(f)
        out.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        return out

    def recover_autosave(self, autosave: str | Path | None = None) -> bool:
        """Load the newest recoverable autosave (or `autosave`) as an unsaved document; False if none."""
        if autosave is None:
            found = self.find_recoverable()
            if not found:
                return False
            autosave = found[0]
        a = Path(autosave)
        sketch, payload = read_autosave(a)
        # untitled: the autosave's own word for where it came from is only where Save As starts (a forged one
        # would otherwise make the next Ctrl+S overwrite whatever file it names)
        self.set_sketch(sketch)
        self._recovered_from = original_path(payload)
        self._forced_dirty = True
        self._emit_dirty()
        # Keep the recovered work safe under our own name before dropping the leftover.
        try:
            self.autosave_now()
        except OSError:
            return True
        for f in (a, self._lock_path_for(a)):
            try:
                f.unlink()
            except OSError:
                pass
        return True

    def discard_recoverable(self) -> None:
        """The user declined recovery: remove the leftovers so they are not offered again."""
        for a in self.find_recoverable():
            for f in (a, self._lock_path_for(a)):
                try:
                    f.unlink()
                except OSError:
                    pass

    def recoverable_choices(self) -> list[tuple[Path, str]]:
        """Every recoverable autosave that can be read, newest first, with a label (name and time). One that
        cannot be read (damaged, or written by another version) is skipped, not in the way of older ones, and
        left in place."""
        out = []
        for a in self.find_recoverable():
            try:
                sketch, payload = read_autosave(a)
            except UserError:
                continue
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.stat().st_mtime))
            original = original_path(payload)
            name = original.name if original is not None else (sketch.name or "Untitled")
            out.append((a, f"{name} ({len(sketch.nodes)} layers), autosaved {when}"))
        return out

    def offer_recovery(self, parent: QWidget | None = None) -> bool:
        """Ask the user (a dialog) whether to recover work left by a crash; True when recovered. With several
        autosaves the user picks one; the others stay and are offered at the next start."""
        from PySide6.QtWidgets import QInputDialog, QMessageBox

        choices = self.recoverable_choices()
        if not choices:
            return False
        if len(choices) == 1:
            answer = QMessageBox.question(
                parent,
                "Recover unsaved work",
                f"VRAMScope did not close normally. Recover {choices[0][1]}?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                QMessageBox.StandardButton.Yes,
            )
            if answer == QMessageBox.StandardButton.Yes:
                return self.recover_autosave(choices[0][0])
        else:
            labels = [label for _, label in choices]
            label, ok = QInputDialog.getItem(
                parent, "Recover unsaved work",
                f"VRAMScope did not close normally; {len(choices)} sketches were autosaved. Recover which? "
                "(The others are offered again at the next start.)",
                labels, 0, False)
            if ok and label in labels:
                return self.recover_autosave(choices[labels.index(label)][0])
        for a, _ in choices:  # declined: these are not offered again (an unreadable one stays, untouched)
            for f in (a, self._lock_path_for(a)):
                try:
                    f.unlink()
                except OSError:
                    pass
        return False
