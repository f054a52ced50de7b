"""The app's own files as an attacker or a crash leaves them: autosaves that name other files, settings of
any type, sketches and autosaves that are pipes or devices. The work is kept, nothing else is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox  # noqa: E402

from engine.sketch.document import load_template  # noqa: E402
from tests.app_windows import open_window, press  # noqa: E402


def _autosave(folder: Path, original: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sketch = load_template("mlp")
    sketch.name = "recovered-work"
    p = folder / "autosave-1-1-aaaaaa.json"
    p.write_text(json.dumps({"format": "vramscope-autosave", "version": 1, "original_path": original,
                             "saved_at": 1.0, "sketch": sketch.to_json()}))
    return p


@pytest.fixture
def autosave_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "autosave"
    monkeypatch.setattr("gui.builder.document.default_autosave_dir", lambda: folder)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    return folder


def test_ctrl_s_after_recovery_never_writes_the_file_the_autosave_names(qtbot, tmp_path, autosave_dir, monkeypatch):
    decoy = tmp_path / "etc" / "passwd"  # stands in for a system file the autosave was forged to name
    decoy.parent.mkdir()
    decoy.write_text("root:x:0:0:root:/root:/bin/bash\n")
    _autosave(autosave_dir, str(decoy))
    w = open_window(qtbot, tmp_path, exposed=True)
    assert w.document.offer_recovery(w)  # as the app does at start (gui/app.py)
    w.show_sketch(w.document.sketch)
    assert w.document.is_dirty() and w.document.path is None
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=5000)  # the keys go to it
    asked: list[str] = []

    def save_dialog(parent: object, title: str, start: str, *rest: object) -> tuple[str, str]:
        asked.append(start)
        return "", ""  # the user looks at where it would go, and cancels

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    press(qtbot, w, "Ctrl+S")
    assert asked == [str(decoy)]  # offered in Save As, for the user to choose or not
    assert decoy.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert w.document.is_dirty() and "recovered-work" in w.windowTitle()  # the work is kept
    chosen = tmp_path / "mine.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(chosen), ""))
    press(qtbot, w, "Ctrl+S")
    assert chosen.is_file() and decoy.read_text().startswith("root:x") and not w.document.is_dirty()


@pytest.mark.parametrize("original", [5, ["/etc/passwd"], {"a": 1}, True, "", "a\0b"])
def test_an_autosave_whose_original_path_is_not_a_path_is_recovered_untitled(qtbot, tmp_path, autosave_dir,
                                                                             original):
    _autosave(autosave_dir, original)
    w = open_window(qtbot, tmp_path)
    assert w.document.recoverable_choices()[0][1].startswith("recovered-work")
    assert w.document.offer_recovery(w)
    assert w.document.path is None and w.document.suggested_path is None and len(w.document.sketch.nodes) > 1


@pytest.mark.parametrize("value", [5, [1, 2], "not json", "[" * 100_000 + "]" * 100_000, '{"batch_size": "x"}',
                                   '{"batch_size": [1], "optimizer": {"a": 1}}', "[]", "9" * 5000, True])
def test_any_stored_config_starts_the_app_with_the_defaults(qtbot, tmp_path, value):
    from PySide6.QtCore import QSettings

    from gui.main_window import MainWindow

    path = str(tmp_path / "settings.ini")
    stored = QSettings(path, QSettings.Format.IniFormat)
    stored.setValue("config", value)
    stored.sync()
    w = MainWindow(QSettings(path, QSettings.Format.IniFormat), engine_processes=False)  # restores its settings
    w.confirm_close = False
    qtbot.addWidget(w)
    w.show()
    fresh = MainWindow(QSettings(str(tmp_path / "fresh.ini"), QSettings.Format.IniFormat), engine_processes=False)
    qtbot.addWidget(fresh)
    assert w.config() == fresh.config()  # the defaults


def test_a_fifo_autosave_is_skipped_and_never_blocks_the_start(qtbot, tmp_path, autosave_dir):
    import os
    import threading

    good = _autosave(autosave_dir, None)
    pipe = autosave_dir / "autosave-9-9-ffffff.json"
    os.mkfifo(pipe)  # reading it would block the GUI thread until something writes to it
    done = threading.Event()

    def unblock() -> None:  # should the app read it, it reads an autosave (and the test fails) instead of hanging
        while not done.wait(1):
            fd = os.open(pipe, os.O_RDWR | os.O_NONBLOCK)
            os.write(fd, good.read_bytes())
            os.close(fd)
    threading.Thread(target=unblock, daemon=True).start()
    try:
        w = open_window(qtbot, tmp_path)
        assert [p for p, _ in w.document.recoverable_choices()] == [good]
    finally:
        done.set()
