"""The window's actions and menus as one table: each row is a menu item (menu, name, text, slot, shortcut, tip,
where its shortcut works, the signals that enable it), a separator, or a submenu filled each time it opens;
`build` makes the actions in a loop and the menus in the table's order. An action in two menus is one action
(its name appears twice). Every shortcut is a window action, so it works with the menu bar hidden."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol

from PySide6.QtCore import Qt, SignalInstance
from PySide6.QtGui import QAction, QKeySequence, QUndoStack
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMenu

from engine.models.sources import model_catalogue
from engine.sketch.document import list_templates

from .builder import BuilderWidget
from .exports import Exports
from .files import Files, call_with
from .real_runs import RealRuns
from .snapshot_link import SnapshotLink
from .tabs import BUILDER, MONITOR, MainTabs
from .workspace import Workspace

Shortcut = str | QKeySequence.StandardKey
K = QKeySequence.StandardKey


class Host(Protocol):
    """What the table's slots reach: the window and the parts it is made of."""

    ws: Workspace
    files: Files
    exports: Exports
    runs: RealRuns
    tabs: MainTabs
    snapshots: SnapshotLink
    builder: BuilderWidget
    config_dock: QDockWidget
    results_dock: QDockWidget

    def new_sketch(self) -> None: ...
    def open_template(self, name: str) -> bool: ...
    def open_model(self, ref: str) -> bool: ...
    def open_path(self, path: str) -> bool: ...
    def undo_stack(self) -> QUndoStack: ...
    def close(self) -> bool: ...
    def about(self) -> None: ...


Slot = Callable[[Host], object]
Where = Literal["window", "canvas", "canvas_focus"]
"""window: anywhere in the window; canvas: only with the canvas on screen (never an unseen edit); canvas_focus: as
canvas, and only with the focus in the builder (canvas, palette, inspector): Delete in the results' table, the
config panel or the Monitor tab must not delete the canvas's selection unseen."""


@dataclass(frozen=True)
class Item:
    menu: str
    name: str = "-"  # "-": a separator
    text: str = ""
    slot: Slot | None = None
    shortcut: Shortcut | None = None
    tip: str = ""
    where: Where = "window"
    enabled_by: Callable[[Host], tuple[SignalInstance, ...]] = lambda _h: ()  # each carries "enabled now"
    starts_enabled: bool = True
    role: QAction.MenuRole | None = None
    make: Callable[[Host, QMainWindow], QAction] | None = None  # one that exists elsewhere (undo stack, dock)
    on_window: bool = True  # a window action (its shortcut works with the menu bar hidden); not a dock's toggle
    fill: Callable[[Host, QMenu], None] | None = None  # a submenu, filled each time it opens


def redo_shortcuts() -> list[QKeySequence]:
    """Ctrl+Shift+Z and Ctrl+Y on every platform, plus the platform's own, each bound once: a key bound twice on
    one action is an 'ambiguous shortcut' that Qt ignores (Linux's own redo is Ctrl+Shift+Z)."""
    keys: list[QKeySequence] = []
    for k in (QKeySequence("Ctrl+Shift+Z"), QKeySequence("Ctrl+Y"),
              *QKeySequence.keyBindings(QKeySequence.StandardKey.Redo)):
        if not k.isEmpty() and k not in keys:
            keys.append(k)
    return keys


def _history_action(h: Host, window: QMainWindow, prefix: str, redo: bool) -> QAction:
    """Undo or Redo of the window's history, as QUndoStack.createUndoAction's (its text names the command, it is
    enabled when there is one), acting only with the Builder tab on screen: Ctrl+Z on the Monitor tab must not take
    back a canvas or configuration edit unseen."""
    stack = h.undo_stack()
    a = QAction(prefix, window)
    if redo:
        can, text, enabled_changed, text_changed, act = (stack.canRedo, stack.redoText, stack.canRedoChanged,
                                                         stack.redoTextChanged, stack.redo)
    else:
        can, text, enabled_changed, text_changed, act = (stack.canUndo, stack.undoText, stack.canUndoChanged,
                                                         stack.undoTextChanged, stack.undo)

    def follow(command: str) -> None:
        a.setText(f"{prefix} {command}" if command else prefix)

    def on_builder(_checked: bool = False) -> None:
        if h.tabs.currentIndex() == BUILDER:
            act()

    enabled_changed.connect(a.setEnabled)
    text_changed.connect(follow)
    a.setEnabled(can())
    follow(text())
    a.triggered.connect(on_builder)
    return a


def _undo(h: Host, window: QMainWindow) -> QAction:
    return _history_action(h, window, "&Undo", redo=False)


def _redo(h: Host, window: QMainWindow) -> QAction:
    a = _history_action(h, window, "&Redo", redo=True)
    a.setShortcuts(redo_shortcuts())
    return a


def fill_template_menu(h: Host, m: QMenu) -> None:
    m.clear()
    sketches = [name for name, _path in list_templates()]
    if sketches:
        m.addSection("Editable sketches")
        for name in sketches:
            m.addAction(name, call_with(h.open_template, name))
    models = [(mo.name, mo.description) for mo in model_catalogue()]
    if models:
        m.addSection("Built-in models (read-only)")
        for name, desc in models:
            m.addAction(name, call_with(h.open_model, name)).setStatusTip(desc)
    if not sketches and not models:
        m.addAction("(no templates available)").setEnabled(False)


def _fill_recent_menu(h: Host, m: QMenu) -> None:
    h.files.fill_recent_menu(m)


SNAPSHOT_TIP = "Open a real run's PyTorch memory snapshot (.pickle or .pickle.gz)"
CALIBRATE_TIP = ("Measure this machine's GPU and the model's kernels; later estimates for it use the "
                 "measurements")

TABLE: tuple[Item, ...] = (
    Item("&File", "new", "&New sketch", lambda h: h.new_sketch(), K.New, "Start an empty sketch"),
    Item("&File", "open", "&Open…", lambda h: h.files.open_dialog(), K.Open,
         "Open a sketch (.json) or a model file.py:function"),
    Item("&File", "open_snapshot", "Open memory &snapshot…", lambda h: h.runs.open_snapshot_dialog(),
         "Ctrl+Shift+O", SNAPSHOT_TIP),
    Item("&File", "close_snapshot", "C&lose snapshot", lambda h: h.runs.close_snapshot(), None,
         "Drop the open snapshot from every view and the report", enabled_by=lambda h: (h.snapshots.opened,),
         starts_enabled=False),
    Item("&File", "template_menu", "Open &template", fill=fill_template_menu),
    Item("&File", "recent_menu", "Open &recent", fill=_fill_recent_menu),
    Item("&File"),
    Item("&File", "save", "&Save", lambda h: h.files.save(), K.Save),
    Item("&File", "save_as", "Save &As…", lambda h: h.files.save_as_dialog(), K.SaveAs),
    Item("&File"),
    Item("&File", "export_report", "Export &report…", lambda h: h.exports.report_dialog(), "Ctrl+E",
         "Write a PDF memory report of the current estimate, with the planner's quick answers"),
    Item("&File", "export_report_full", "Export report with &full plan…", lambda h: h.exports.report_dialog(full=True),
         "Ctrl+Alt+E", "Write the PDF report once the whole plan (re-traced answers, largest batch) has come"),
    Item("&File", "export_code", "Export PyTorch &code…", lambda h: h.exports.code_dialog(), "Ctrl+Shift+E",
         "Write the sketch as a readable nn.Module file"),
    Item("&File"),
    # K.Quit has no key on Windows (nor offscreen)
    Item("&File", "quit", "&Quit", lambda h: h.close(), "Ctrl+Q", role=QAction.MenuRole.QuitRole),
    Item("&Edit", "undo", shortcut=K.Undo, make=_undo),
    Item("&Edit", "redo", make=_redo),
    Item("&Edit"),
    Item("&Edit", "copy", "&Copy", lambda h: h.builder.copy(), K.Copy, where="canvas_focus"),
    Item("&Edit", "paste", "&Paste", lambda h: h.builder.paste(), K.Paste, where="canvas_focus"),
    Item("&Edit", "duplicate", "D&uplicate", lambda h: h.builder.duplicate(), "Ctrl+D", where="canvas_focus"),
    Item("&Edit", "delete", "&Delete", lambda h: h.builder.delete_selected(), K.Delete, where="canvas_focus"),
    Item("&View", "zoom_fit", "&Zoom to fit", lambda h: h.builder.zoom_to_fit(), "Ctrl+0", where="canvas"),
    Item("&View", "layout", "&Auto layout", lambda h: h.builder.auto_layout(), "Ctrl+L", where="canvas"),
    Item("&View"),
    Item("&View", "config_dock", make=lambda h, _w: h.config_dock.toggleViewAction(), on_window=False),
    Item("&View", "results_dock", make=lambda h, _w: h.results_dock.toggleViewAction(), on_window=False),
    Item("&View", "show_builder", "Show &builder", lambda h: h.tabs.setCurrentIndex(BUILDER), "Ctrl+1"),
    Item("&View", "show_monitor", "Show &monitor", lambda h: h.tabs.setCurrentIndex(MONITOR), "Ctrl+2"),
    Item("&Run", "estimate", "&Estimate now", lambda h: h.ws.request_estimate(immediate=True), "F5"),
    Item("&Run", "profile", "&Profile on this machine", lambda h: h.runs.profile(), "Ctrl+R",
         "Run the configured step for real here (GPU if present, else CPU)",
         enabled_by=lambda h: (h.runs.canProfile,)),
    Item("&Run", "calibrate", "&Calibrate this GPU", lambda h: h.runs.calibrate_gpu(), None, CALIBRATE_TIP),
    Item("&Run", "stop", "S&top profiling", lambda h: h.runs.stop_profile(), "Ctrl+.",
         enabled_by=lambda h: (h.runs.canStop, h.snapshots.reading), starts_enabled=False),
    Item("&Monitor", "show_monitor"),
    Item("&Monitor", "add_prometheus", "Add &Prometheus server…", lambda h: h.tabs.add_prometheus_server()),
    Item("&Help", "about", "&About VRAMScope", lambda h: h.about(), role=QAction.MenuRole.AboutRole),
)


def _action(h: Host, window: QMainWindow, item: Item) -> QAction:
    a = item.make(h, window) if item.make is not None else QAction(item.text, window)
    if item.shortcut is not None:
        a.setShortcut(QKeySequence(item.shortcut))
    if item.tip:
        a.setStatusTip(item.tip)
    if item.role is not None:
        a.setMenuRole(item.role)
    slot = item.slot
    if slot is not None:
        if item.where == "window":
            a.triggered.connect(lambda _checked=False: slot(h))
        else:
            def on_canvas(_checked: bool = False) -> None:
                # Never an unseen edit: the canvas must be on screen (not the Monitor tab, not a read-only model).
                if h.ws.model_kind == "sketch" and h.builder.isVisible():
                    slot(h)

            a.triggered.connect(on_canvas)
    if item.where == "canvas_focus":  # a builder action, not a window one, else every child would match
        a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        h.builder.addAction(a)
    elif item.on_window:
        window.addAction(a)  # shortcuts work even with the menu bar hidden
    if not item.starts_enabled:  # (an undo stack's action keeps its own state)
        a.setEnabled(False)
    for signal in item.enabled_by(h):
        signal.connect(a.setEnabled)
    return a


def build(h: Host, window: QMainWindow) -> tuple[dict[str, QAction], dict[str, QMenu]]:
    """Every action of the table (by name) and its submenus (by name), with the window's menu bar filled."""
    actions: dict[str, QAction] = {}
    submenus: dict[str, QMenu] = {}
    menus: dict[str, QMenu] = {}
    for item in TABLE:
        menu = menus.get(item.menu)
        if menu is None:
            menu = menus[item.menu] = window.menuBar().addMenu(item.menu)
        if item.name == "-":
            menu.addSeparator()
        elif item.fill is not None:
            sub = submenus[item.name] = menu.addMenu(item.text)
            sub.aboutToShow.connect(partial(item.fill, h, sub))
            item.fill(h, sub)
        else:
            if item.name not in actions:
                actions[item.name] = _action(h, window, item)
            menu.addAction(actions[item.name])
    return actions, submenus
