"""The app's open paths given a named pipe or a link to /dev/zero (issue 26): a sketch (File ▸ Open), a memory
snapshot (File ▸ Open memory snapshot) and an autosave (at start) are refused in one line; the GUI thread never
blocks on a pipe nor reads a device without end, and a refused snapshot does not hold up the next one. And a
snapshot job that fails unforeseen says which file and what, in words, never an exception's repr."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from engine.core.errors import UserError  # noqa: E402
from engine.core.failure_text import failure_text  # noqa: E402
from engine.sketch.document import load_template  # noqa: E402
from tests.app_windows import open_window  # noqa: E402

DATA = Path(__file__).parent / "data"
POSIX = os.name == "posix"


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)
    yield w
    w.close()


READ_PIPES: list[Path] = []  # the pipes that something opened for reading (their writer found a reader)


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Path]:
    """A named pipe; should anything open it for reading, a writer comes within a second (so the test does not hang)
    and notes it in READ_PIPES."""
    if not POSIX:
        pytest.skip("named pipes are POSIX")
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(1):
            try:
                fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader: nobody opened it
                continue
            READ_PIPES.append(p)
            os.write(fd, b"{}")
            os.close(fd)

    threading.Thread(target=unblock, daemon=True).start()
    yield p
    done.set()


@pytest.fixture
def zero(tmp_path: Path) -> Path:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    return link


@pytest.mark.parametrize("kind, words", [("pipe", "a named pipe, not a sketch file"),
                                         ("zero", "a device, not a sketch file")])
def test_a_sketch_that_is_a_pipe_or_dev_zero_is_refused_at_once(window, request, kind, words):
    path = request.getfixturevalue(kind)
    assert window.open_path(str(path)) is False
    assert path not in READ_PIPES  # refused by what it is, never opened: a reader would block until a writer came
    message = window.statusBar().currentMessage()
    assert words in message and "\n" not in message


def _snapshot_error(qtbot, window, path: str) -> str:
    with qtbot.waitSignal(window.bridge.error, timeout=60000, check_params_cb=lambda k, j, m: k == "snapshot") as b:
        window.open_snapshot(path)
    return str(b.args[2])


@pytest.mark.parametrize("kind, words", [("pipe", "a named pipe, not a snapshot file"),
                                         ("zero", "a device, not a snapshot file")])
def test_a_snapshot_that_is_a_pipe_or_dev_zero_is_refused_and_the_next_one_opens(qtbot, window, request, kind,
                                                                                  words):
    message = _snapshot_error(qtbot, window, str(request.getfixturevalue(kind)))
    assert words in message
    assert words in window.results.compare.message.text()
    with qtbot.waitSignal(window.bridge.result, timeout=60000, check_params_cb=lambda k, j, v: k == "snapshot"):
        window.open_snapshot(str(DATA / "resnet50-b256-oom-at-4gib.pickle.gz"))
    assert window.snapshots.snap is not None


def test_an_autosave_linked_to_dev_zero_is_skipped_at_start(qtbot, tmp_path, monkeypatch, zero):
    folder = tmp_path / "autosave"
    folder.mkdir()
    monkeypatch.setattr("gui.builder.document.default_autosave_dir", lambda: folder)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    sketch = load_template("mlp")
    good = folder / "autosave-1-1-aaaaaa.json"
    good.write_text(json.dumps({"format": "vramscope-autosave", "version": 1, "original_path": None,
                                "saved_at": 1.0, "sketch": sketch.to_json()}))
    (folder / "autosave-9-9-ffffff.json").symlink_to(zero)
    w = open_window(qtbot, tmp_path)
    try:
        assert [p for p, _ in w.document.recoverable_choices()] == [good]
    finally:
        w.close()


def test_an_unforeseen_snapshot_failure_names_the_file_not_the_exception(qtbot, window, monkeypatch, tmp_path):
    def broken(path, **_):
        raise TypeError(f"'<' not supported between instances of 'str' and 'int' in {object()!r}")

    monkeypatch.setattr("engine.snapshots.reader.open_snapshot", broken)
    path = str(tmp_path / "run.pickle")
    message = _snapshot_error(qtbot, window, path)
    assert message.startswith(f"{path}: a field has the wrong type ('<' not supported between instances of 'str'")
    assert "TypeError" not in message and "0x" not in message and "an object" in message
    assert message in window.results.compare.message.text()


@pytest.mark.parametrize("exc, subject, expected", [
    (KeyError("frames"), "/runs/a.pickle", "/runs/a.pickle: the field 'frames' it needs is missing"),
    (IndexError("list index out of range"), "cfg.json", "cfg.json: a list in it is shorter than its other fields say"),
    (RecursionError("maximum recursion depth exceeded"), "deep.json", "deep.json: it is nested too deeply to read"),
    (ValueError("math domain error"), "gpt2", "gpt2: a field has a value it cannot take (math domain error)"),
    (UserError("is -1, not a size", where="'hidden_size'"), "c.json", "'hidden_size': is -1, not a size"),
    (ZeroDivisionError("division by zero"), None, "the engine stopped: division by zero"),
    (AssertionError(), None, "the engine stopped: an internal check failed (the log has the details)"),
    (KeyError("a\nb\x1b[2J"), "x\ny", r"x\ny: the field 'a\nb\x1b[2J' it needs is missing"),
])
def test_failure_text_is_one_line_naming_the_subject(exc, subject, expected):
    assert failure_text(exc, subject) == expected
