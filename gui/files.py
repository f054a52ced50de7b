"""The window's files: the open dialog, save and save-as (the training configuration goes into the sketch file),
the "save changes?" question, the recent-files list and the folder the dialogs open in (both in QSettings), the
autosave kept or discarded as the window closes, and a file action's error as a one-line message (a box too when
the session is interactive). Opening a model is the window's (gui.main_window); this module hands it a path."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QSettings
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMenu, QMessageBox, QStatusBar, QWidget

from engine.core.errors import UserError

from .builder.document import SketchDocument
from .config_panel import ConfigPanel
from .workspace import Workspace

log = logging.getLogger(__name__)

MAX_RECENT = 8
SKETCH_FILTER = "VRAMScope sketches (*.json);;All files (*)"
OPEN_FILTER = "Sketches, models and Hugging Face configs (*.json *.py);;" + SKETCH_FILTER


def _recent_key(path: str | Path) -> str:
    """A file's entry in the list: its absolute path; a `file.py:function` reference as it was given."""
    return str(Path(path).resolve()) if not str(path).endswith(")") else str(path)


def call_with(fn: Callable[[str], object], arg: str) -> Callable[[], None]:
    """A menu action's slot: `fn(arg)`, whatever the action's signal passes."""

    def call() -> None:
        fn(arg)

    return call


class Files(QObject):
    """`interactive()`: whether questions and message boxes may be shown (tests and --screenshot say no);
    `open_path(path)` opens what the dialog or the recent list chose."""

    def __init__(self, window: QWidget, settings: QSettings, ws: Workspace, config_panel: ConfigPanel,
                 status_bar: QStatusBar, interactive: Callable[[], bool], open_path: Callable[[str], bool]):
        super().__init__(window)
        self.window, self.settings, self.ws, self.config_panel = window, settings, ws, config_panel
        self.document: SketchDocument = ws.document
        self.status_bar, self._interactive, self._open_path = status_bar, interactive, open_path
        self.keep_autosave = False  # an ended session (end_session) leaves unsaved work to recover
        ws.treeReady.connect(lambda _rows: self._ref_opened(True))
        ws.treeFailed.connect(lambda _message: self._ref_opened(False))

    # ---- recent files
    def recent_files(self) -> list[str]:
        v = self.settings.value("recentFiles", [])
        if isinstance(v, str):  # QSettings gives a list of one as the string alone
            return [v] if v else []
        if not isinstance(v, (list, tuple)):  # None: an empty list, as an ini file keeps it
            return []
        return [str(x) for x in v]

    def add_recent(self, path: str | Path) -> None:
        p = _recent_key(path)
        files = [f for f in self.recent_files() if f != p]
        files.insert(0, p)
        self.settings.setValue("recentFiles", files[:MAX_RECENT])

    def remove_recent(self, path: str | Path) -> None:
        p = _recent_key(path)
        self.settings.setValue("recentFiles", [f for f in self.recent_files() if f not in (p, str(path))])

    def clear_recent(self) -> None:
        self.settings.setValue("recentFiles", [])

    def fill_recent_menu(self, m: QMenu) -> None:
        m.clear()
        files = self.recent_files()
        for p in files:
            m.addAction(Path(p).name, call_with(self._open_path, p)).setStatusTip(p)
        if files:
            m.addSeparator()
            m.addAction("Clear list", self.clear_recent)
        else:
            m.addAction("(none)").setEnabled(False)

    def _ref_opened(self, ok: bool) -> None:
        if self.ws.model_kind == "file":  # a file that opened is offered again, one that does not is not
            (self.add_recent if ok else self.remove_recent)(self.ws.model_ref)

    # ---- dialogs
    def dialog_dir(self, start: str = "") -> str:
        """Where a file dialog opens: the folder of the last file chosen in any of them, else the user's home
        (not the folder the app was started from: for a newcomer, its own source tree)."""
        last = str(self.settings.value("dialogs/lastDir", "") or "")
        if not last or not Path(last).is_dir():
            last = str(Path.home())
        return str(Path(last) / Path(start).name) if start else last

    def remember_dir(self, path: str) -> None:
        self.settings.setValue("dialogs/lastDir", str(Path(path.split(".py:")[0]).resolve().parent))

    def save_path(self, caption: str, start: str, file_filter: str) -> str:
        """A save dialog's answer ("" when cancelled), opened in dialog_dir(start); the folder is remembered."""
        path, _ = QFileDialog.getSaveFileName(self.window, caption, self.dialog_dir(start), file_filter)
        if path:
            self.remember_dir(path)
        return path

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open sketch or model file", self.dialog_dir(),
                                              OPEN_FILTER)
        if not path:
            return
        self.remember_dir(path)
        if path.endswith(".py"):
            fn, ok = QInputDialog.getText(self.window, "Model function",
                                          "Function returning (model, inputs) for a batch size:", text="build")
            if not ok or not fn.strip():
                return
            path = f"{path}:{fn.strip()}"
        self._open_path(path)

    # ---- saving
    def save(self) -> bool:
        if self.ws.model_kind != "sketch":
            self.status_bar.showMessage("Built-in models are read-only; open a template to edit a copy.", 5000)
            return False
        if self.document.path is None:
            return self.save_as_dialog()
        self.config_panel.flush()  # the training settings go into the file, an edit not left out
        if self.guard(self.document.save):
            self.status_bar.showMessage(f"Saved {self.document.path}", 3000)
            return True
        return False

    def save_as_dialog(self) -> bool:
        if self.ws.model_kind != "sketch":
            return False
        start = str(self.document.suggested_path or self.dialog_dir(self.ws.display_name() + ".json"))
        path, _ = QFileDialog.getSaveFileName(self.window, "Save sketch as", start, SKETCH_FILTER)
        if not path:
            return False
        self.remember_dir(path)
        if not path.endswith(".json"):
            path += ".json"
        return self.save_as(path)

    def save_as(self, path: str) -> bool:
        self.config_panel.flush()  # the training settings go into the file, an edit not left out
        if not self.guard(lambda: self.document.save_as(path)):
            return False
        self.add_recent(path)
        self.status_bar.showMessage(f"Saved {path}", 3000)
        return True

    def maybe_save(self) -> bool:
        """Ask about unsaved changes; False when the user cancels."""
        self.config_panel.flush()  # a training setting typed just now is one of them
        if not self._interactive() or not self.ws.is_dirty():
            return True
        buttons = QMessageBox.StandardButton
        answer = QMessageBox.question(self.window, "Unsaved changes",
                                      f"Save the changes to {self.ws.display_name()}?",
                                      buttons.Save | buttons.Discard | buttons.Cancel, buttons.Save)
        if answer == buttons.Cancel:
            return False
        if answer == buttons.Save:
            return self.save()
        return True

    # ---- autosave as the window closes
    def end_session(self) -> None:
        """The system ends the app: unsaved work stays in its autosave, offered back at the next start."""
        if self.ws.is_dirty():
            self.document.autosave_now()
            self.keep_autosave = True

    def closed(self) -> None:
        if not self.keep_autosave:
            self.document.discard_autosave()  # a clean exit leaves nothing to recover

    # ---- errors a user can cause
    def guard(self, fn: Callable[[], object]) -> bool:
        """Run a file action; a UserError or OSError becomes a message box, the user's work stays."""
        try:
            fn()
            return True
        except UserError as e:
            self.message("VRAMScope", str(e))
        except OSError as e:
            self.message("VRAMScope", f"{e.filename or ''} {e.strerror or e}".strip())
        except Exception as e:  # noqa: BLE001 — a fault nobody foresaw still ends in a message, the work kept
            log.exception("file action failed")
            self.message("VRAMScope", f"that did not work: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
        return False

    def message(self, title: str, text: str) -> None:
        self.status_bar.showMessage(text, 8000)
        if self._interactive():
            QMessageBox.warning(self.window, title, text)
