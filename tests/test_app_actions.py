"""gui.actions: the table builds the menus and shortcuts the window had when it built them by hand (issue 25), the
canvas's edit keys are the builder's and edit only a sketch on screen. (Profile and Stop following a run:
tests/test_app_window.py; Close snapshot following the snapshot: tests/test_app_snapshot_lifecycle.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtGui import QAction, QKeySequence  # noqa: E402
from PySide6.QtWidgets import QMenu  # noqa: E402

from gui.actions import TABLE, redo_shortcuts  # noqa: E402
from tests.app_windows import open_window  # noqa: E402

# The menus as the hand-built window had them (items with their shortcuts; "-" a separator, "▸" a submenu; Redo's
# keys are the platform's, read once the application exists), and the export with the full plan (issue 24).
MENUS = {
    "&File": ["&New sketch Ctrl+N", "&Open… Ctrl+O", "Open memory &snapshot… Ctrl+Shift+O", "C&lose snapshot",
              "▸ Open &template", "▸ Open &recent", "-", "&Save Ctrl+S", "Save &As… Ctrl+Shift+S", "-",
              "Export &report… Ctrl+E", "Export report with &full plan… Ctrl+Alt+E",
              "Export PyTorch &code… Ctrl+Shift+E", "-", "&Quit Ctrl+Q"],
    "&Edit": ["&Undo Ctrl+Z", "&Redo", "-", "&Copy Ctrl+C", "&Paste Ctrl+V", "D&uplicate Ctrl+D", "&Delete Del"],
    "&View": ["&Zoom to fit Ctrl+0", "&Auto layout Ctrl+L", "-", "Training configuration", "Results",
              "Show &builder Ctrl+1", "Show &monitor Ctrl+2"],
    "&Run": ["&Estimate now F5", "&Profile on this machine Ctrl+R", "&Calibrate this GPU", "S&top profiling Ctrl+."],
    "&Monitor": ["Show &monitor Ctrl+2", "Add &Prometheus server…"],
    "&Help": ["&About VRAMScope"],
}


def _item(a: QAction) -> str:
    if a.isSeparator():
        return "-"
    if a.menu() is not None:
        return f"▸ {a.text()}"
    keys = ", ".join(k.toString() for k in a.shortcuts())
    return f"{a.text()} {keys}".strip()


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path)
    yield w
    w.close()


def test_the_table_builds_the_menus_the_window_had(window):
    bar = window.menuBar()
    menus = {a.text(): [_item(b) for b in a.menu().actions()] for a in bar.actions() if isinstance(a.menu(), QMenu)}
    redo = "&Redo " + ", ".join(k.toString() for k in redo_shortcuts())
    assert redo.startswith("&Redo Ctrl+Shift+Z, Ctrl+Y")
    assert menus == {**MENUS, "&Edit": [redo if i == "&Redo" else i for i in MENUS["&Edit"]]}
    # One action in two menus is one action; each name of the table is one action.
    view, monitor = (next(a.menu() for a in bar.actions() if a.text() == t) for t in ("&View", "&Monitor"))
    assert view.actions()[-1] is monitor.actions()[0]
    names = [i.name for i in TABLE if i.name != "-" and i.fill is None]
    assert set(window.acts) == set(names)


def test_every_shortcut_is_bound_once(window):
    keys = [k.toString() for a in window.actions() + window.builder.actions() for k in a.shortcuts()]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert QKeySequence("Ctrl+E").toString() in keys


def test_the_canvas_keys_are_the_builders_and_apply_only_to_a_sketch_on_screen(qtbot, window):
    acts = window.acts
    for name in ("copy", "paste", "duplicate", "delete"):
        assert acts[name] in window.builder.actions() and acts[name] not in window.actions()
    with qtbot.waitSignal(window.estimateReady, timeout=60000):
        assert window.open_template("mlp")
    sketch = window.current_sketch()
    nodes = set(sketch.nodes)
    window.builder.select_node("fc1")
    window.tabs.setCurrentIndex(1)  # the Monitor tab: the canvas is not on screen
    qtbot.waitUntil(lambda: not window.builder.isVisible(), timeout=5000)
    acts["delete"].trigger()
    assert set(window.current_sketch().nodes) == nodes  # no unseen edit
    window.tabs.setCurrentIndex(0)
    qtbot.waitUntil(window.builder.isVisible, timeout=5000)
    window.builder.select_node("fc1")
    acts["delete"].trigger()
    assert set(window.current_sketch().nodes) == nodes - {"fc1"}
