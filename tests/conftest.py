"""Session-wide test set-up: no display, and a clean Qt tear-down."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# The user's own GPU calibration profiles must not change what the tests see: an empty data folder of their own.
if "VRAMSCOPE_DATA_DIR" not in os.environ:
    import tempfile

    os.environ["VRAMSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix="vramscope-test-data-")


@pytest.fixture(scope="session", autouse=True)
def _clear_clipboard_at_exit():
    # PySide6 6.11: QMimeData handed to the clipboard is destroyed twice at interpreter exit (a segfault after
    # every test passed) unless the clipboard is emptied while Qt still runs. The app does the same on quit.
    yield
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError:
        return
    app = QApplication.instance()
    if app is not None:
        app.clipboard().clear()
