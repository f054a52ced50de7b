"""The main window as the app's tests open it (a settings file of its own, no question on close, no automatic
planner), key sequences typed as a user types them, and an engine job held back until another answer has come."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QSettings
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QWidget

from engine.results.types import Estimate
from gui.main_window import MainWindow

T = TypeVar("T")


def open_window(qtbot: Any, tmp_path: Path, *, processes: bool = False, exposed: bool = False) -> MainWindow:
    """A shown main window; `processes`: the engine in a worker process as the app runs it (else on threads: quick
    to start); `exposed`: active and on screen, for tests whose keys go where the focus is."""
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat), restore_state=False,
                   engine_processes=processes)
    w.confirm_close = False
    w.auto_plan = False  # the planner's extra traces are not what these tests measure
    qtbot.addWidget(w)
    w.show()
    if exposed:
        with qtbot.waitActive(w):  # activation comes later (window-wide shortcuts such as Ctrl+Q wait for it)
            w.activateWindow()
    return w


def press(qtbot: Any, widget: QWidget, seq: str) -> None:
    """The key sequence as the user types it: key presses with modifiers, to the focused widget."""
    combo = QKeySequence(seq)[0]
    qtbot.keyClick(widget, combo.key(), combo.keyboardModifiers())


def open_template(qtbot: Any, window: MainWindow, name: str) -> Estimate:
    """Open a template in `window` and wait for its traced estimate (which this returns)."""
    with qtbot.waitSignal(window.estimateReady, timeout=60000) as blocker:
        assert window.open_template(name)
    est: Estimate = blocker.args[0]
    return est


def held_until(event: threading.Event, job: Callable[..., T]) -> Callable[..., T]:
    """`job` (an engine.jobs.calls function, monkeypatched in its place) run only once `event` is set: the order in
    which two engine jobs on their own threads answer, made certain rather than left to the machine's load."""
    def held(*args: Any, **kwargs: Any) -> T:
        assert event.wait(60), "what the held engine job waits for never came"
        return job(*args, **kwargs)
    return held
