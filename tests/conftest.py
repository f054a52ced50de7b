"""Session-wide test set-up: no display, user folders of each test process's own, and a clean Qt tear-down."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# Property tests draw the same examples on every run and every worker (no example database shared between xdist
# workers, no random seed): a failure is reproducible, and a pass is not luck.
hypothesis_settings.register_profile("vramscope", derandomize=True, database=None)
hypothesis_settings.load_profile("vramscope")

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch (OpenMP) thread per xdist worker: `-n auto` already starts one worker per core, and the
    # workers' threads spinning against each other cost CPU (17 % more for the same tests, measured). Set before
    # torch is imported; the engine processes and subprocesses a test starts inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _own_user_folders() -> Path:
    """Give this test process (each pytest-xdist worker is one) a home of its own, before Qt or the app reads it:
    HOME and the XDG config, data and state folders (QSettings(), the autosave folder under Qt's AppDataLocation,
    anything a subprocess keeps under ~) and VRAMScope's data folder (the user's GPU calibration profiles must not
    change what the tests see). So workers running side by side, earlier runs and the user's own settings never
    meet. Caches (fontconfig, torch, Hugging Face) stay where they were: safe to share, slow to rebuild."""
    root = Path(tempfile.mkdtemp(prefix="vramscope-test-home-"))
    owner = os.getpid()
    # Removed when this process ends; a forked child that ends normally must not remove its parent's folders.
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(root, ignore_errors=True))
    os.environ.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    for var, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                     ("XDG_STATE_HOME", "state")):
        (root / sub).mkdir()
        os.environ[var] = str(root / sub)
    # A data folder given by whoever runs the tests is kept; one a parent test process (xdist's controller, whose
    # environment the workers inherit) set for itself is not.
    given, parent = os.environ.get("VRAMSCOPE_DATA_DIR"), os.environ.get("VRAMSCOPE_TEST_HOME")
    if not given or (parent and Path(given) == Path(parent) / "vramscope-data"):
        os.environ["VRAMSCOPE_DATA_DIR"] = str(root / "vramscope-data")
        (root / "vramscope-data").mkdir()
    os.environ["VRAMSCOPE_TEST_HOME"] = str(root)
    return root


TEST_HOME = _own_user_folders()


@pytest.fixture(autouse=True)
def _first_fold_rung():
    """Each test's traces start folding at the first rung (engine.trace.tracer remembers the rung that folded a kind
    of stack: a test must not see where an earlier test's trace of the same stack folded)."""
    from engine.trace.tracer import forget_fold_rungs

    forget_fold_rungs()


@pytest.fixture
def window(qtbot, tmp_path):
    """The app's main window, shown and active (its window shortcuts fire), closed after the test; a test module
    that needs another window defines its own `window`."""
    from tests.app_windows import open_window

    w = open_window(qtbot, tmp_path, exposed=True)
    yield w
    w.close()


@pytest.fixture
def monitor_panel(qtbot):
    """Makes MonitorPanels (its keywords: source=, autostart=, …) and shuts each down after the test."""
    from gui.monitor import MonitorPanel

    made = []

    def make(**kw):
        p = MonitorPanel(**kw)
        qtbot.addWidget(p)
        made.append(p)
        return p

    yield make
    for p in made:
        p.shutdown()


@pytest.fixture
def fake_nvml(monkeypatch):
    """The process's NVML (engine.core.nvml.GATEWAY) replaced by the tests' one stand-in (tests/fake_nvml.py), with no
    GPU until the test gives it some (`fake_nvml.gpus = three_gpus()`); the catalogue's cached answer for this
    machine's GPUs is forgotten before and after, so nothing a test scripted outlives it."""
    from engine.config import gpus
    from engine.core import nvml
    from tests.fake_nvml import FakeNvml

    fake = FakeNvml([])
    monkeypatch.setattr(nvml, "GATEWAY", nvml.Nvml(fake))
    gpus.local_gpu_names.cache_clear()
    yield fake
    gpus.local_gpu_names.cache_clear()


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
