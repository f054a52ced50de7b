"""The main window: menus and shortcuts, files (open, save, recent, export), the builder / monitor tabs and the
configuration and results docks. Engine work goes through gui.session (one typed callback per job; the session
drops stale answers): analytic figures at once after an edit, the traced estimate after a short debounce.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QUndoStack
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QFrame,
    QHeaderView,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QStackedWidget,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QWidget,
)

from engine import __version__
from engine.analytic import AnalyticResult, NodeFigures
from engine.bounded_read import read_json
from engine.codegen import export
from engine.config import TrainConfig
from engine.errors import UserError
from engine.hf_source import looks_like_hf_config
from engine.jobs import SourceSpec
from engine.module_groups import blocks
from engine.planner import MaxBatchResult, Recommendation
from engine.progress import CancelToken, Progress
from engine.results import Estimate
from engine.sketch import Sketch, list_templates
from engine.sources import model_catalogue
from engine.units import format_bytes
from report import build_report
from report.content import ReportContent

from .block_graph import BlockGraph
from .builder import BuilderWidget
from .builder.canvas import NodeResults
from .builder.document import SketchDocument
from .config_panel import ConfigPanel, in_panel_terms
from .results import ResultsPanel
from .results.formatting import format_count
from .session import EngineSession, JobCallbacks
from .snapshot_link import SnapshotLink
from .stored_settings import stored_config

if TYPE_CHECKING:  # the monitor's modules (and pyqtgraph) load when first used, not at start-up
    from .monitor.fleet_panel import FleetPanel
    from .monitor.panel import MonitorPanel

log = logging.getLogger(__name__)

APP_NAME = "VRAMScope"
MAX_RECENT = 8
SKETCH_FILTER = "VRAMScope sketches (*.json);;All files (*)"
# Built-in models too large for a canvas: they open read-only with their module tree.
READ_ONLY_MODELS = ("resnet50", "vit-b16", "bert-base", "gpt2", "gpt2-medium", "llama-7b", "llama-13b", "unet",
                    "lstm-lm")
DEFAULT_SKETCHES = ("lenet", "mlp", "resnet18")  # the first that exists opens on start


def about_text() -> str:
    """What the app claims for its figures, as the README does: traced tensors exact, the GPU's additions modelled."""
    return (f"<b>{APP_NAME} {__version__}</b><br>Will this fit on my GPU?<br><br>"
            "The tensors a PyTorch training step (or inference pass) allocates are traced on fake tensors, with no "
            "GPU: the peak of live tensor bytes is exact. What a GPU adds on top — the caching allocator's reserve, "
            "the CUDA context and library workspaces, hence nvidia-smi's figure — is modelled, and so is the fit "
            "verdict. “Profile on this machine” measures the real step to compare.<br><br>"
            "Also: a live monitor of NVIDIA GPUs, and PDF memory reports.")


def redo_shortcuts() -> list[QKeySequence]:
    """Ctrl+Shift+Z and Ctrl+Y on every platform, plus the platform's own, each bound once: a key bound twice on
    one action is an 'ambiguous shortcut' that Qt ignores (Linux's own redo is Ctrl+Shift+Z)."""
    keys: list[QKeySequence] = []
    for k in (QKeySequence("Ctrl+Shift+Z"), QKeySequence("Ctrl+Y"),
              *QKeySequence.keyBindings(QKeySequence.StandardKey.Redo)):
        if not k.isEmpty() and k not in keys:
            keys.append(k)
    return keys


EMPTY_SKETCH_HINT = ("An empty sketch: drag an Input from the palette on the left onto the canvas, then layers "
                     "(each joins the one above it), then an Output. The figures come as soon as it builds.")

SNAPSHOT_FILTER = "PyTorch memory snapshots (*.pickle *.pickle.gz *.pkl *.gz)"


def sketch_templates() -> list[str]:
    return [name for name, _path in list_templates()]


def builtin_models() -> list[tuple[str, str]]:
    """(name, description) of the models the engine knows by name: templates and Hugging Face configurations."""
    return [(m.name, m.description) for m in model_catalogue()]


def _model_family(name: str) -> str | None:
    return next((m.family for m in model_catalogue() if m.name == name), None)


def is_hf_config(path: str) -> bool:
    """A Hugging Face config.json (it has a model_type), or a folder holding one: opened read-only, as the CLI's
    `estimate path/config.json` takes it (the sketch loader refused it as 'not a VRAMScope sketch')."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    try:  # bounded: a huge, deep or binary file is not one, and the sketch loader names what is wrong with it
        data = read_json(p, what="Hugging Face config")
    except UserError:
        return False
    return looks_like_hf_config(data)


def _snapshot(sketch: Sketch) -> dict[str, Any]:
    """A copy of the sketch's state taken on the GUI thread, so the engine never reads a sketch mid-edit."""
    snapshot: dict[str, Any] = json.loads(json.dumps(sketch.to_json()))
    return snapshot


# ---------------------------------------------------------------------------------------------------------------

class ModuleTree(QTreeWidget):
    """A read-only model's module tree: name, type, own parameters and parameters below."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setHeaderLabels(["Module", "Type", "Parameters (own)", "Parameters (total)"])
        self.setAlternatingRowColors(True)
        self.setUniformRowHeights(True)
        hh = self.header()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2, 3):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self._items: dict[str, QTreeWidgetItem] = {}

    def set_rows(self, title: str, rows: list[tuple[str, str, int, int]]) -> None:
        """rows: (dotted name, type, own parameters, total parameters), parents before children."""
        self.clear()
        self._items = {}
        for name, typ, own, total in rows:
            parent_name = name.rpartition(".")[0] if name else None
            parent = self._items.get(parent_name) if parent_name is not None else None
            label = name.rpartition(".")[2] if name else title
            cells = [label, typ, format_count(own) if own else "", format_count(total)]
            item = QTreeWidgetItem(parent, cells) if parent is not None else QTreeWidgetItem(self, cells)
            item.setData(0, Qt.ItemDataRole.UserRole, name)
            for c in (2, 3):
                item.setTextAlignment(c, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(0, name or title)
            self._items[name] = item
        root = self._items.get("")
        if root is not None:
            root.setExpanded(True)

    def select_module(self, name: str) -> None:
        item = self._items.get(name)
        if item is not None:
            self.setCurrentItem(item)
            self.scrollToItem(item)


# ---------------------------------------------------------------------------------------------------------------

class MainWindow(QMainWindow):
    """The app. `estimateReady(est)` after each traced estimate shown; `estimateFailed(msg)` on an engine error."""

    estimateReady = Signal(object)
    estimateFailed = Signal(str)
    analyticReady = Signal(object)

    def __init__(self, settings: QSettings | None = None, *, restore_state: bool = True,
                 engine_processes: bool | None = None):
        super().__init__()
        self.setObjectName("MainWindow")
        self.settings = settings or QSettings()
        self.session = EngineSession(self, processes=engine_processes)
        self.bridge = self.session.bridge
        self.bridge.warm_up()  # the engine process imports torch while the window opens
        self.confirm_close = True  # tests and --screenshot turn the "save changes?" question off
        self._keep_autosave = False  # an ended session (end_session) leaves unsaved work to recover
        self._report_waiting: str | None = None  # a report to write once the planner has answered
        self._quick_recommendations: list[Recommendation] | None = None
        self._plan_failed = ""  # the re-traced plan's error, when it failed
        self.auto_plan = True  # ask the planner (max batch, recommendations) after each traced estimate
        self.model_kind = "sketch"  # "sketch" | "template" | "file"
        self.model_ref = ""  # template name or file ref for read-only models
        self.estimate: Estimate | None = None  # the traced estimate shown (None while only analytic figures are)
        self.measured: Estimate | None = None
        self.measured_against: Estimate | None = None
        self.recommendations: list[Recommendation] | None = None  # the planner's answers for the estimate on screen
        self.max_batch: MaxBatchResult | None = None
        self.max_batch_none: str | None = None  # why no batch fits, when the search found none
        self._cfg: TrainConfig | None = None
        self._last_error = ""

        # ---- document and builder
        self.document = SketchDocument(self)
        self.builder = BuilderWidget(document=self.document)
        self.builder.sketchChanged.connect(self._on_sketch_changed)
        self.builder.selectionChanged.connect(self._on_node_selected)
        self.builder.message.connect(lambda text: self.statusBar().showMessage(text, 6000))  # a refused edit's reason
        self.module_tree = ModuleTree()
        self.builder_stack = QStackedWidget()
        self.builder_stack.setObjectName("BuilderStack")
        self.builder_stack.addWidget(self.builder)
        # A built-in or loaded model: its blocks as a graph (memory on each), and its full module tree.
        self.block_graph = BlockGraph()
        self.model_views = QTabWidget()
        self.model_views.setObjectName("ModelViews")
        self.model_views.setDocumentMode(True)
        self.model_views.addTab(self.block_graph, "Blocks")
        self.model_views.addTab(self.module_tree, "Modules")
        self._tree_rows: list[tuple[str, str, int, int]] = []
        self.builder_stack.addWidget(self.model_views)

        self.monitor: MonitorPanel | None = None
        self.fleet_panels: list[FleetPanel] = []  # Monitor ▸ Add Prometheus server… tabs
        self.monitor_placeholder = QLabel("The GPU monitor opens here.")
        self.monitor_placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.monitor_placeholder.setObjectName("Dim")
        self.tabs = QTabWidget()
        self.tabs.setObjectName("MainTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.builder_stack, "Builder")
        self.tabs.addTab(self.monitor_placeholder, "Monitor")
        self.tabs.currentChanged.connect(self._tab_changed)
        self._tab_states: dict[int, QByteArray] = {}  # each tab's dock layout (QMainWindow.saveState)
        self._shown_tab = 0
        self.setCentralWidget(self.tabs)

        # ---- docks
        self.config_panel = ConfigPanel()
        self.config_dock = QDockWidget("Training configuration", self)
        self.config_dock.setObjectName("ConfigDock")
        self.config_dock.setWidget(self.config_panel)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.config_dock)
        self.results = ResultsPanel()
        self.results_dock = QDockWidget("Results", self)
        self.results_dock.setObjectName("ResultsDock")
        self.results_dock.setWidget(self.results)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.results_dock)
        self.snapshots = SnapshotLink(self.session, self.results, self._open_model_spec, self.statusBar().showMessage)
        self.splitDockWidget(self.config_dock, self.results_dock, Qt.Orientation.Horizontal)
        self.resizeDocks([self.config_dock, self.results_dock], [300, 1000], Qt.Orientation.Horizontal)
        self.resizeDocks([self.results_dock], [340], Qt.Orientation.Vertical)

        # ---- status bar
        self.status_busy = QProgressBar()
        self.status_busy.setObjectName("StatusBusy")
        self.status_busy.setRange(0, 0)
        self.status_busy.setMaximumWidth(120)
        self.status_busy.setMaximumHeight(10)
        self.status_busy.setTextVisible(False)
        self.status_busy.setVisible(False)
        self.status_label = QLabel("")
        self.statusBar().addPermanentWidget(self.status_label)
        self.statusBar().addPermanentWidget(self.status_busy)

        # ---- timers and wiring
        self._estimate_timer = QTimer(self)
        self._estimate_timer.setSingleShot(True)
        self._estimate_timer.setInterval(250)  # edits are debounced; the analytic figures go out at once
        self._estimate_timer.timeout.connect(self._run_traced)

        self.session.busyChanged.connect(self._on_busy)
        self.config_panel.configChanged.connect(self._on_config)
        self.results.moduleSelected.connect(self._on_module_selected)
        self.results.profileRequested.connect(self.profile)
        self.results.stopRequested.connect(self.stop_profile)
        self.document.dirtyChanged.connect(lambda _dirty: self._update_title())
        self.document.pathChanged.connect(lambda _path: self._update_title())
        self.document.refused.connect(lambda msg: self.statusBar().showMessage(msg, 6000))

        self._build_actions()
        self._build_menus()
        try:
            self._cfg = self.config_panel.config()
        except UserError:
            self._cfg = TrainConfig()
        if restore_state:
            self._restore_settings()
        if not self.settings.value("window/geometry"):
            self.resize(1360, 900)
            # The config dock as wide as its fields ask (the window's layout would give it its minimum, which
            # scrolls them sideways); once shown, when the dock area has its size.
            QTimer.singleShot(0, self._fit_config_dock)
        self._update_title()

    # -----------------------------------------------------------------------------------------------------------
    # construction

    def _fit_config_dock(self) -> None:
        frame = self.config_dock.width() - self.config_panel.width()  # the dock's own border
        want = self.config_panel.sizeHint().width() + max(frame, 0) + 8  # + the separator's few pixels
        # Both side-by-side docks, else Qt reads the one size as a share of the row.
        self.resizeDocks([self.config_dock, self.results_dock], [want, max(self.width() - want, 1)],
                         Qt.Orientation.Horizontal)

    def _act(self, text: str, slot: Callable[[], object], shortcut: str | QKeySequence.StandardKey | None = None,
             tip: str = "") -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
        a.triggered.connect(lambda _checked=False: slot())
        self.addAction(a)  # shortcuts work even with the menu bar hidden
        return a

    def _build_actions(self) -> None:
        K = QKeySequence.StandardKey
        self.act_new = self._act("&New sketch", self.new_sketch, K.New, "Start an empty sketch")
        self.act_open = self._act("&Open…", self.open_dialog, K.Open,
                                  "Open a sketch (.json) or a model file.py:function")
        self.act_open_snapshot = self._act("Open memory &snapshot…", self.open_snapshot_dialog, "Ctrl+Shift+O",
                                           "Open a real run's PyTorch memory snapshot (.pickle or .pickle.gz)")
        self.act_close_snapshot = self._act("C&lose snapshot", self.close_snapshot, None,
                                            "Drop the open snapshot from every view and the report")
        self.act_save = self._act("&Save", self.save, K.Save)
        self.act_save_as = self._act("Save &As…", self.save_as_dialog, K.SaveAs)
        self.act_export_report = self._act("Export &report…", self.export_report_dialog, "Ctrl+E",
                                           "Write a PDF memory report of the current estimate")
        self.act_export_code = self._act("Export PyTorch &code…", self.export_code_dialog, "Ctrl+Shift+E",
                                         "Write the sketch as a readable nn.Module file")
        self.act_quit = self._act("&Quit", self.close, "Ctrl+Q")  # K.Quit has none on Windows (nor offscreen)
        self.act_quit.setMenuRole(QAction.MenuRole.QuitRole)
        stack = self.undo_stack()
        self.act_undo = stack.createUndoAction(self, "&Undo")
        self.act_redo = stack.createRedoAction(self, "&Redo")
        for a in (self.act_undo, self.act_redo):
            self.addAction(a)
        self.act_undo.setShortcut(QKeySequence(K.Undo))
        self.act_redo.setShortcuts(redo_shortcuts())
        b = self.builder
        self.act_delete = self._builder_act("&Delete", b.delete_selected, K.Delete)
        self.act_copy = self._builder_act("&Copy", b.copy, K.Copy)
        self.act_paste = self._builder_act("&Paste", b.paste, K.Paste)
        self.act_duplicate = self._builder_act("D&uplicate", b.duplicate, "Ctrl+D")
        self.act_zoom_fit = self._builder_act("&Zoom to fit", b.zoom_to_fit, "Ctrl+0")
        self.act_layout = self._builder_act("&Auto layout", b.auto_layout, "Ctrl+L")
        for a in (self.act_delete, self.act_copy, self.act_paste, self.act_duplicate):
            # Only while the focus is in the builder (canvas, palette, inspector): Delete in the results' table,
            # the config panel or the Monitor tab must not delete the canvas's selection unseen. Not a window
            # action, else the window's children (all of them) would match the context.
            self.removeAction(a)
            a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.builder.addAction(a)
        self.act_estimate = self._act("&Estimate now", lambda: self.request_estimate(immediate=True), "F5")
        self.act_profile = self._act("&Profile on this machine", self.profile, "Ctrl+R",
                                     "Run the configured step for real here (GPU if present, else CPU)")
        self.act_calibrate = self._act("&Calibrate this GPU", self.calibrate_gpu, None,
                                       "Measure this machine's GPU and the model's kernels; later estimates for it "
                                       "use the measurements")
        self.act_stop = self._act("S&top profiling", self.stop_profile, "Ctrl+.")
        self.act_stop.setEnabled(False)
        for sig, act in ((self.snapshots.opened, self.act_close_snapshot), (self.snapshots.reading, self.act_stop)):
            act.setEnabled(False)
            sig.connect(act.setEnabled)
        self.snapshots.opened.connect(self._snapshot_opened)
        self.act_about = self._act("&About VRAMScope", self.about)
        self.act_about.setMenuRole(QAction.MenuRole.AboutRole)

    def _builder_act(self, text: str, method: Callable[[], object],
                     shortcut: QKeySequence.StandardKey | str) -> QAction:
        def run() -> None:
            # Never an unseen edit: the canvas must be on screen (not the Monitor tab, not a read-only model).
            if self.model_kind == "sketch" and self.builder.isVisible():
                method()

        return self._act(text, run, shortcut)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        f = mb.addMenu("&File")
        f.addAction(self.act_new)
        f.addAction(self.act_open)
        f.addAction(self.act_open_snapshot)
        f.addAction(self.act_close_snapshot)
        self.template_menu = f.addMenu("Open &template")
        self.template_menu.aboutToShow.connect(self._fill_template_menu)
        self._fill_template_menu()
        self.recent_menu = f.addMenu("Open &recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self._fill_recent_menu()
        f.addSeparator()
        f.addAction(self.act_save)
        f.addAction(self.act_save_as)
        f.addSeparator()
        f.addAction(self.act_export_report)
        f.addAction(self.act_export_code)
        f.addSeparator()
        f.addAction(self.act_quit)

        e = mb.addMenu("&Edit")
        for a in (self.act_undo, self.act_redo, None, self.act_copy, self.act_paste, self.act_duplicate,
                  self.act_delete):
            e.addSeparator() if a is None else e.addAction(a)

        v = mb.addMenu("&View")
        v.addAction(self.act_zoom_fit)
        v.addAction(self.act_layout)
        v.addSeparator()
        v.addAction(self.config_dock.toggleViewAction())
        v.addAction(self.results_dock.toggleViewAction())
        show_builder = self._act("Show &builder", lambda: self.tabs.setCurrentIndex(0), "Ctrl+1")
        show_monitor = self._act("Show &monitor", lambda: self.tabs.setCurrentIndex(1), "Ctrl+2")
        v.addAction(show_builder)
        v.addAction(show_monitor)

        r = mb.addMenu("&Run")
        r.addAction(self.act_estimate)
        r.addAction(self.act_profile)
        r.addAction(self.act_calibrate)
        r.addAction(self.act_stop)

        m = mb.addMenu("&Monitor")
        m.addAction(show_monitor)
        m.addAction(self._act("Add &Prometheus server…", self.add_prometheus_server))

        h = mb.addMenu("&Help")
        h.addAction(self.act_about)

    def _fill_template_menu(self) -> None:
        m = self.template_menu
        m.clear()
        sketches = sketch_templates()
        if sketches:
            m.addSection("Editable sketches")
            for name in sketches:
                m.addAction(name, _call_with(self.open_template, name))
        models = builtin_models()
        if models:
            m.addSection("Built-in models (read-only)")
            for name, desc in models:
                a = m.addAction(name, _call_with(self.open_model, name))
                a.setStatusTip(desc)
        if not sketches and not models:
            a = m.addAction("(no templates available)")
            a.setEnabled(False)

    def _fill_recent_menu(self) -> None:
        m = self.recent_menu
        m.clear()
        files = self.recent_files()
        for p in files:
            m.addAction(Path(p).name, _call_with(self.open_path, p)).setStatusTip(p)
        if files:
            m.addSeparator()
            m.addAction("Clear list", self._clear_recent)
        else:
            m.addAction("(none)").setEnabled(False)

    # -----------------------------------------------------------------------------------------------------------
    # settings

    def recent_files(self) -> list[str]:
        v = self.settings.value("recentFiles", [])
        if isinstance(v, str):  # QSettings gives a list of one as the string alone
            return [v] if v else []
        if not isinstance(v, (list, tuple)):  # None: an empty list, as an ini file keeps it
            return []
        return [str(x) for x in v]

    def _add_recent(self, path: str | Path) -> None:
        p = str(Path(path).resolve()) if not str(path).endswith(")") else str(path)
        files = [f for f in self.recent_files() if f != p]
        files.insert(0, p)
        self.settings.setValue("recentFiles", files[:MAX_RECENT])

    def _remove_recent(self, path: str | Path) -> None:
        p = str(Path(path).resolve()) if not str(path).endswith(")") else str(path)
        self.settings.setValue("recentFiles", [f for f in self.recent_files() if f not in (p, str(path))])

    def _dialog_dir(self, start: str = "") -> str:
        """Where a file dialog opens: the folder of the last file chosen in any of them, else the user's home
        (not the folder the app was started from: for a newcomer, its own source tree)."""
        last = str(self.settings.value("dialogs/lastDir", "") or "")
        if not last or not Path(last).is_dir():
            last = str(Path.home())
        return str(Path(last) / Path(start).name) if start else last

    def _remember_dir(self, path: str) -> None:
        self.settings.setValue("dialogs/lastDir", str(Path(path.split(".py:")[0]).resolve().parent))

    def _clear_recent(self) -> None:
        self.settings.setValue("recentFiles", [])

    def _restore_settings(self) -> None:
        geo = self.settings.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        state = self.settings.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state)
        monitor_state = self.settings.value("window/state/monitor")
        if isinstance(monitor_state, QByteArray) and not monitor_state.isEmpty():
            self._tab_states[1] = monitor_state
        cfg = stored_config(self.settings.value("config"))  # None for any value it cannot take: the defaults stay
        if cfg is not None:
            self.config_panel.set_config(cfg)
            self._cfg = self.config_panel.config()

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self._tab_states[self._shown_tab] = self.saveState()
        self.settings.setValue("window/state", self._tab_states.get(0, self.saveState()))  # opens on the builder
        if 1 in self._tab_states:
            self.settings.setValue("window/state/monitor", self._tab_states[1])
        if self._cfg is not None:
            self.settings.setValue("config", json.dumps(self._cfg.to_json()))
        self.settings.sync()

    # -----------------------------------------------------------------------------------------------------------
    # title and state

    def display_name(self) -> str:
        if self.model_kind != "sketch":
            return self.model_ref
        return self.document.display_name()

    def is_dirty(self) -> bool:
        return self.model_kind == "sketch" and self.document.is_dirty()

    def _update_title(self) -> None:
        dirty = self.is_dirty()
        ro = " (read-only)" if self.model_kind != "sketch" else ""
        # The mark is written into the title itself (setWindowModified would need a "[*]" placeholder, which
        # windowTitle() then returns verbatim).
        self.setWindowTitle(f"{self.display_name()}{'*' if dirty else ''}{ro} — {APP_NAME}")

    def undo_stack(self) -> QUndoStack:
        return self.document.undo_stack()

    def current_sketch(self) -> Sketch | None:
        return self.document.sketch

    def config(self) -> TrainConfig:
        return self._cfg or TrainConfig()

    def target_bytes(self) -> int | None:
        return self.config_panel.target_gpu_bytes()

    # -----------------------------------------------------------------------------------------------------------
    # opening models

    def show_sketch(self, sketch: Sketch, read_only: bool = False) -> None:
        self.model_kind, self.model_ref = "sketch", ""
        self.builder_stack.setCurrentIndex(0)
        self.builder.set_sketch(sketch, read_only=read_only)
        self.config_panel.set_input_fields(seq_len=False, image_size=False)
        if sketch.training:  # saved with its training configuration: batch size, optimizer, precision, target
            self.config_panel.set_config(TrainConfig.from_json(sketch.training))
            self._cfg = self.config_panel.config()
        self.document.set_training(self.config().to_json(), saved=not self.document.is_dirty())
        self._model_opened()

    def _model_opened(self) -> None:
        self.estimate = self.measured = self.measured_against = None
        self.results.compare.set_measured(None)
        self.session.model_opened()
        self._report_waiting = None
        # Nothing of the previous model stays on screen: every view empty until this one's figures come.
        self.results.clear(f"Estimating {self.display_name()}…")
        self.status_label.setText("")
        self._clear_error_message()
        self._update_title()
        self.tabs.setCurrentIndex(0)
        self.snapshots.model_opened()  # one shown alone goes beside this model; one of the model before closes
        self.request_estimate(immediate=True)

    def open_default(self) -> bool:
        """Open the first default sketch template that exists (the app's start page)."""
        names = sketch_templates()
        for name in DEFAULT_SKETCHES:
            if name in names:
                return self.open_template(name)
        if names:
            return self.open_template(names[0])
        # No sketch templates in this build: a small built-in model keeps the window useful.
        return self.open_model("resnet18")

    def new_sketch(self) -> None:
        if not self._maybe_save():
            return
        self._guard(self.document.new)
        self.show_sketch(self.document.sketch)

    def open_template(self, name: str) -> bool:
        if not self._maybe_save():
            return False
        if not self._guard(lambda: self.document.new(template=name)):
            return False
        self.show_sketch(self.document.sketch)
        return True

    def open_model(self, ref: str) -> bool:
        """A built-in model or `file.py:function`, read-only: its module tree instead of the canvas."""
        if not self._maybe_save():
            return False
        kind = "file" if ".py:" in ref or is_hf_config(ref) else "template"
        self.model_kind, self.model_ref = kind, ref
        self.builder_stack.setCurrentIndex(1)
        self.module_tree.clear()
        self._tree_rows = []
        self.block_graph.set_blocks([])
        fam = _model_family(ref)
        self.config_panel.set_input_fields(seq_len=fam in (None, "text", "speech"), image_size=fam in (None, "vision"))
        self.session.module_tree(ref, self.config(), JobCallbacks(self._show_module_tree, self._on_tree_error))
        self._model_opened()
        return True

    def open_path(self, path: str) -> bool:
        """A sketch .json (editable), or `file.py:function` or a Hugging Face config.json (read-only)."""
        if ".py:" in path or is_hf_config(path):
            return self.open_model(path)
        if not self._maybe_save():
            return False
        if not self._guard(lambda: self.document.open(path)):
            self._remove_recent(path)  # a file that does not open is not offered again
            return False
        self._add_recent(path)
        self.show_sketch(self.document.sketch)
        return True

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open sketch or model file", self._dialog_dir(),
                                              "Sketches, models and Hugging Face configs (*.json *.py);;"
                                              + SKETCH_FILTER)
        if not path:
            return
        self._remember_dir(path)
        if path.endswith(".py"):
            from PySide6.QtWidgets import QInputDialog

            fn, ok = QInputDialog.getText(self, "Model function",
                                          "Function returning (model, inputs) for a batch size:", text="build")
            if not ok or not fn.strip():
                return
            path = f"{path}:{fn.strip()}"
        self.open_path(path)

    # -----------------------------------------------------------------------------------------------------------
    # saving

    def save(self) -> bool:
        if self.model_kind != "sketch":
            self.statusBar().showMessage("Built-in models are read-only; open a template to edit a copy.", 5000)
            return False
        if self.document.path is None:
            return self.save_as_dialog()
        self.config_panel.flush()  # the training settings go into the file (_on_config), an edit not left out
        if self._guard(self.document.save):
            self.statusBar().showMessage(f"Saved {self.document.path}", 3000)
            return True
        return False

    def save_as_dialog(self) -> bool:
        if self.model_kind != "sketch":
            return False
        start = str(self.document.suggested_path or self._dialog_dir(self.display_name() + ".json"))
        path, _ = QFileDialog.getSaveFileName(self, "Save sketch as", start, SKETCH_FILTER)
        if not path:
            return False
        self._remember_dir(path)
        if not path.endswith(".json"):
            path += ".json"
        return self.save_as(path)

    def save_as(self, path: str) -> bool:
        self.config_panel.flush()  # the training settings go into the file (_on_config), an edit not left out
        if not self._guard(lambda: self.document.save_as(path)):
            return False
        self._add_recent(path)
        self._update_title()
        self.statusBar().showMessage(f"Saved {path}", 3000)
        return True

    def _maybe_save(self) -> bool:
        """Ask about unsaved changes; False when the user cancels."""
        self.config_panel.flush()  # a training setting typed just now is one of them
        if not self.confirm_close or not self.is_dirty():
            return True
        answer = QMessageBox.question(
            self, "Unsaved changes", f"Save the changes to {self.display_name()}?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Save)
        if answer == QMessageBox.StandardButton.Cancel:
            return False
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return True

    def _guard(self, fn: Callable[[], object]) -> bool:
        """Run a file action; a UserError or OSError becomes a message box, the user's work stays."""
        try:
            fn()
            return True
        except UserError as e:
            self._message("VRAMScope", str(e))
        except OSError as e:
            self._message("VRAMScope", f"{e.filename or ''} {e.strerror or e}".strip())
        except Exception as e:  # noqa: BLE001 — a fault nobody foresaw still ends in a message, the work kept
            log.exception("file action failed")
            self._message("VRAMScope", f"that did not work: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
        return False

    def _message(self, title: str, text: str) -> None:
        self.statusBar().showMessage(text, 8000)
        if self.confirm_close:  # interactive session
            QMessageBox.warning(self, title, text)

    # -----------------------------------------------------------------------------------------------------------
    # live estimate

    def source_spec(self) -> SourceSpec | None:
        """What the engine process needs to rebuild the model: the sketch copied now, or the reference."""
        if self.model_kind == "sketch":
            sketch = self.current_sketch()
            if sketch is None:
                return None
            path = self.document.path
            return ("sketch", _snapshot(sketch), str(path) if path else None)
        return ("ref", self.model_ref) if self.model_ref else None

    def request_estimate(self, immediate: bool = False) -> None:
        """Analytic figures now (sketches), the traced estimate after the debounce (or now)."""
        self.session.edited()
        alone = self.snapshots.estimating()  # shown alone, or closed when the model it was beside is gone
        sketch = self.current_sketch() if self.model_kind == "sketch" else None
        if sketch is not None and not sketch.nodes:
            # A new (or emptied) sketch is where a newcomer starts: say what to do, not "does not build" in red.
            self._estimate_timer.stop()
            for kind in ("estimate", "analytic", "max_batch", "max_context", "plan", "plan_quick"):
                self.session.cancel(kind)  # a trace of the layers just removed must not come back on screen
            self._clear_error_message()
            self.estimate = None  # nothing to export or plan: the figures were of layers no longer there
            if not alone:  # a snapshot opened alone stays on screen
                self.results.clear(EMPTY_SKETCH_HINT)
            self.status_label.setText("")
            return
        if self.estimate is not None and self.results.freshness != "empty":
            self.results.set_stale("These figures are from before the last edit: estimating the edited model…")
            self.status_label.setText(f"peak {format_bytes(self.estimate.peak_bytes)} (previous version)")
        self._run_analytic()
        if immediate:
            self._estimate_timer.stop()
            self._run_traced()
        else:
            self._estimate_timer.start()

    def _run_analytic(self) -> None:
        if self.model_kind != "sketch":
            return
        sketch = self.current_sketch()
        if sketch is None:
            return
        self.session.analytic(_snapshot(sketch), self.config(),
                              JobCallbacks(self._show_analytic, self._on_estimate_error))

    def _run_traced(self) -> None:
        spec = self.source_spec()
        if spec is None:
            return
        self.session.estimate(spec, self.config(), JobCallbacks(self._show_traced, self._on_estimate_error))

    def _run_planner(self, est: Estimate) -> None:
        """Largest batch that fits the target and ranked recommendations, each a job of its own."""
        spec = self.source_spec()
        if spec is None:
            return
        target = est.config.gpu_spec if est.gpu is not None else None
        # The gauge compares what nvidia-smi would show with what a process can allocate on the card (its total
        # less the driver's reserve); so does the search, as the CLI's max-batch does. (The card's total let the
        # search offer a batch the gauge then said did not fit.)
        budget = (target.usable_bytes if target is not None else None) or self.target_bytes()
        figure = "nvidia_smi" if target is not None else "peak"
        plan = self.results.plan
        # Cheap answers first: those that need no new trace come in seconds, before the largest-batch search and
        # the re-traced answers (the engine process runs its jobs one after another, in this order).
        plan.set_recommendations([])
        plan.set_note("")
        self._quick_recommendations = None
        self._plan_failed = ""
        plan.set_progress(-1, "Looking for savings: the quick answers first…")
        self.session.recommend(spec, est, JobCallbacks(self._show_quick_recommendations, self._on_plan_error),
                               quick=True)
        plan.set_max_batch_text(f"Largest batch that fits: {'searching…' if budget else 'choose a target GPU.'}")
        if budget:
            self.session.max_batch(spec, est.config, budget, figure,
                                   JobCallbacks(self._show_max_batch, self._on_max_batch_error,
                                                plan.set_max_batch_progress))
        plan.set_max_context(None, "Longest prompt that fits: searching…" if budget and est.config.generating else "")
        if budget and est.config.generating:  # as the CLI's max-context: the prompt, with the new tokens set
            self.session.max_context(spec, est.config, budget, figure, JobCallbacks(
                plan.set_max_context, lambda m: plan.set_max_context(None, f"Longest prompt that fits: none — {m}")))
        self.session.recommend(spec, est, JobCallbacks(self._show_recommendations, self._on_plan_error,
                                                       lambda f, m: plan.set_progress(f, f"Re-tracing: {m} (%p %)")))

    def _show_quick_recommendations(self, value: list[Recommendation]) -> None:
        self._quick_recommendations = value
        if self.recommendations is None:  # the full answer has not come first
            self.results.plan.set_partial_recommendations(value)
            if self._plan_failed:  # nor will it: these are the plan
                self.recommendations = value
                self.results.plan.set_note(self._plan_failed)
            else:
                self.results.plan.set_progress(-1, "Waiting for the re-traced answers…")

    def _on_plan_error(self, message: str) -> None:
        message = in_panel_terms(message)
        self._plan_failed = message
        self.results.plan.set_note(message)
        self.results.plan.set_progress(None)
        if self.recommendations is None and self._quick_recommendations is not None:
            self.recommendations = self._quick_recommendations  # what the planner did find goes into the report
        self._write_waiting_report()  # without the plan, rather than never

    def _on_config(self, cfg: TrainConfig) -> None:
        self._cfg = cfg
        if self.model_kind == "sketch":
            self.document.set_training(cfg.to_json())  # the file stores it: a change is unsaved work
        self.request_estimate(immediate=True)  # the panel already debounced its edits

    def _on_sketch_changed(self, _sketch: Sketch) -> None:
        if self.model_kind != "sketch":
            return
        self._update_title()
        self.request_estimate()

    # ---- answers from the engine (each job's own callbacks, through the session)

    def _show_blocks(self) -> None:
        """The block graph of a built-in or loaded model, with this estimate's memory when there is one."""
        est = self.estimate
        self.block_graph.set_blocks(blocks(self._tree_rows, est.per_module if est is not None else None))

    def _show_traced(self, est: Estimate) -> None:
        self.estimate = est
        if self.model_kind != "sketch" and self._tree_rows:
            self._show_blocks()
        self.recommendations = self.max_batch = self.max_batch_none = None
        self._clear_error_message()
        self.results.set_error("")
        self.results.set_estimate(est, target_bytes=self.target_bytes())
        self.results.set_current()
        if self.measured is not None:
            self.results.set_measured(self.measured, against=self.measured_against)
        self._node_results_from_estimate(est)
        if self.monitor is not None:
            self.monitor.set_estimate(est)  # "your model needs X" on the memory plot
        self.status_label.setText(f"peak {format_bytes(est.peak_bytes)}")
        if self.auto_plan:
            self._run_planner(est)
        self.estimateReady.emit(est)

    def _show_analytic(self, res: AnalyticResult) -> None:
        """engine.analytic's AnalyticResult: per-node figures on the canvas, totals in the summary."""
        if not res.nodes:
            return  # an empty sketch has no figures (not "0 B, fits"); the traced estimate says what is missing
        if res.nodes:
            self.builder.set_node_results(_node_figures(res.nodes))
        if res.errors:
            # A sketch that does not fit together has no whole-model figures: say why and keep the last good ones
            # (the traced estimate fails the same way), rather than totals of the part that still connects.
            self._show_model_error(res.error_message)
        else:
            self.results.set_analytic(res, target_bytes=self.target_bytes())
        self.analyticReady.emit(res)

    def _show_max_batch(self, value: MaxBatchResult) -> None:
        self.max_batch = value
        self.results.plan.set_max_batch(value, value.budget_bytes)
        self._write_waiting_report()

    def _show_recommendations(self, value: list[Recommendation]) -> None:
        self.results.plan.set_progress(None)  # first: whoever sees the answer sees its wait over
        self.results.plan.set_recommendations(value)
        self.recommendations = value
        self._write_waiting_report()

    def _show_module_tree(self, rows: list[tuple[str, str, int, int]]) -> None:
        self.module_tree.set_rows(self.model_ref, rows)
        self._tree_rows = rows
        self._show_blocks()
        if self.model_kind == "file":
            self._add_recent(self.model_ref)  # it opened: offer it again

    def _show_measured(self, value: tuple[Estimate, Estimate | None]) -> None:
        self.snapshots.close()  # the Measured tab shows this run now
        self.measured, self.measured_against = value
        self.results.set_measured(self.measured, against=self.measured_against)
        self.results.compare.set_running(False)
        self.act_profile.setEnabled(True)
        self.act_stop.setEnabled(False)
        self.results.tabs.setCurrentWidget(self.results.compare)

    def _on_estimate_error(self, message: str) -> None:
        # The user's sketch and the last good figures stay, marked as the last version that built; the message
        # says what to fix.
        message = in_panel_terms(message)
        self._show_model_error(message)
        self.estimateFailed.emit(message)

    def _show_model_error(self, message: str) -> None:
        message = in_panel_terms(message)
        self._last_error = message
        if self.estimate is not None:
            # As the banner says, every view shows the last version that built: the summary too, not the edit's
            # analytic figures "refining…" a trace that failed, beside the last good one's timeline.
            self.results.set_estimate(self.estimate, target_bytes=self.target_bytes())
            self.results.set_stale("These figures are of the last version that built; the edited model does not "
                                   "(the message below says why).")
            self.status_label.setText(f"peak {format_bytes(self.estimate.peak_bytes)} (last version that built)")
        else:
            self.results.clear(f"No figures: {self.display_name()} does not build (the message below says why).")
            self.status_label.setText("")
        self.results.set_error(message)
        self.statusBar().showMessage(message)  # until it is fixed, not for ten seconds

    def _clear_error_message(self) -> None:
        """A fixed error leaves the status bar (another message there stays)."""
        if self._last_error and self.statusBar().currentMessage() == self._last_error:
            self.statusBar().clearMessage()
        self._last_error = ""

    def _on_max_batch_error(self, message: str) -> None:
        self.max_batch_none = in_panel_terms(message.removeprefix("max-batch: "))  # the CLI command's name
        self.results.plan.set_max_batch_error(self.max_batch_none)
        self._write_waiting_report()

    def _on_tree_error(self, message: str) -> None:
        self.module_tree.clear()
        self._tree_rows = []
        self.block_graph.set_blocks([])
        self._show_model_error(message)
        if self.model_kind == "file":
            self._remove_recent(self.model_ref)  # a file that does not open is not offered again

    def _profile_ended(self, message: str = "") -> None:
        self.results.compare.set_running(False, message=message)
        self.act_profile.setEnabled(True)
        self.act_stop.setEnabled(False)

    def _on_profile_progress(self, fraction: float, message: str) -> None:
        self.results.compare.set_running(True, fraction, message)

    def _on_busy(self, busy: bool) -> None:
        estimating = self.session.is_busy("estimate")
        self.results.set_busy(estimating, "estimating…" if estimating else "")
        self.status_busy.setVisible(busy)

    # ---- canvas links

    def _node_results_from_estimate(self, est: Estimate) -> None:
        """Traced per-module figures onto the canvas nodes (a sketch's modules are named by node id)."""
        sketch = self.current_sketch()
        if self.model_kind != "sketch" or sketch is None:
            return
        ids = set(sketch.nodes)
        memory: dict[str, int] = {}
        params: dict[str, int] = {}
        for row in est.per_module:
            nid = _node_for_module(row.name, ids)
            if nid is None:
                continue
            memory[nid] = memory.get(nid, 0) + row.bytes_at_peak
            params[nid] = params.get(nid, 0) + row.parameters
        if memory:
            self.builder.set_node_results({nid: {"memory": memory[nid], "params": params[nid]} for nid in memory})

    def _on_module_selected(self, name: str) -> None:
        sketch = self.current_sketch()
        if self.model_kind == "sketch" and sketch is not None:
            nid = _node_for_module(name, set(sketch.nodes))
            if nid:
                self.builder.select_node(nid)
        else:
            self.module_tree.select_module(name)
        self.tabs.setCurrentIndex(0)

    def _on_node_selected(self, node_id: str) -> None:
        if node_id:
            self.results.layers.select_module(node_id)

    # -----------------------------------------------------------------------------------------------------------
    # profile, export

    def profile(self) -> None:
        self.config_panel.flush()
        spec = self.source_spec()
        if spec is None:
            return
        cfg = self.config()
        self.results.compare.set_running(True, -1, "Running the step for real on this machine…")
        self.results.tabs.setCurrentWidget(self.results.compare)
        self.act_profile.setEnabled(False)
        self.act_stop.setEnabled(True)
        self.session.profile(spec, cfg, JobCallbacks(self._show_measured, self._profile_ended,
                                                     self._on_profile_progress,
                                                     lambda: self._profile_ended("Profiling stopped.")))

    def calibrate_gpu(self) -> None:
        """Run `vramscope calibrate` for this machine's GPU 0 and the current model (engine.calibrate)."""
        from engine.calibrate import NO_GPU, cuda_available

        if not cuda_available():
            self._message("Calibrate this GPU", NO_GPU[0].upper() + NO_GPU[1:] + ".")
            return
        spec, cfg = self.source_spec(), self.config()
        if spec is None:
            return
        self.statusBar().showMessage("Calibrating this GPU…")
        self.session.calibrate(spec, cfg, JobCallbacks(self._calibrated, self._calibrate_failed))

    def _calibrated(self, summary: str) -> None:
        self.statusBar().showMessage(f"Calibrated: {summary}", 10000)
        self.request_estimate(immediate=True)  # the estimate now uses the measurements

    def _calibrate_failed(self, message: str) -> None:
        self.statusBar().clearMessage()
        self._message("Calibrate this GPU", message)

    def stop_profile(self) -> None:
        self.session.cancel("profile")
        self.session.cancel("snapshot")

    def open_snapshot_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open memory snapshot", self._dialog_dir(),
                                              f"{SNAPSHOT_FILTER};;All files (*)")
        if path:
            self._remember_dir(path)
            self.open_snapshot(path)

    def open_snapshot(self, path: str) -> int:
        """Read a memory snapshot (gui.snapshot_link): shown beside the open model, or alone with none."""
        return self.snapshots.open(path)

    def _snapshot_opened(self, opened: bool) -> None:
        if opened:  # the Measured tab and the report show the snapshot now, not an earlier profile run
            self.measured = self.measured_against = None

    def close_snapshot(self) -> None:
        if self.snapshots.close():  # it was shown alone: the model's own figures (or the empty sketch's hint) again
            self.request_estimate(immediate=True)

    def _open_model_spec(self) -> SourceSpec | None:
        """The open model's spec, None when there is none (an empty sketch)."""
        sketch = self.current_sketch()
        return None if self.model_kind == "sketch" and (sketch is None or not sketch.nodes) else self.source_spec()

    def export_report_dialog(self) -> None:
        if self.estimate is None and self.snapshots.alone() is None:
            self._message("Export report", "There is no traced estimate yet; wait for it or fix the model first.")
            return
        start = self._dialog_dir(f"{self.display_name().removesuffix('.json')}-memory.pdf")
        path, _ = QFileDialog.getSaveFileName(self, "Export report", start, "PDF (*.pdf)")
        if path:
            self._remember_dir(path)
            self.export_report(path if path.lower().endswith(".pdf") else path + ".pdf")

    def _write_waiting_report(self) -> None:
        if self._report_waiting and not self.session.planning():
            self.export_report(self._report_waiting)

    def export_report(self, path: str) -> int:
        """Write the PDF report off the GUI thread. While the planner still works on this estimate, the report
        waits for its answers (the app's plan goes into it), and says so; 0 then, else the job's id."""
        if self.session.planning() and self.snapshots.alone() is None:
            self._report_waiting = path
            self.results.tabs.setCurrentWidget(self.results.plan)
            self.statusBar().showMessage("The report will be written with the planner's answers as soon as they "
                                         "come (the Plan tab shows how far it is).")
            return 0
        self._report_waiting = None
        est, (measured, against) = self.snapshots.alone() or self.estimate, self.snapshots.for_report() or (
            self.measured, self.measured_against)
        if est is None:  # the dialog asks only with one on screen, and opening a model drops a waiting report
            self._message("Export report", "There is no traced estimate yet; wait for it or fix the model first.")
            return 0
        kwargs: ReportContent = {"measured": measured, "measured_against": against,
                  "recommendations": self.recommendations,
                  "max_batch": self.max_batch.batch_size if self.max_batch is not None else None,
                  "max_batch_none": self.max_batch_none,
                  "gpu_snapshot": self.monitor.report_snapshot() if self.monitor is not None else None}

        def job(cancel: CancelToken, progress: Progress) -> str:
            build_report(path, est, progress=progress, cancel=cancel, **kwargs)
            return path

        self.statusBar().showMessage("Writing the report…")
        return self.session.submit("report", job, JobCallbacks(
            lambda written: self.statusBar().showMessage(f"Report written: {written}", 8000),
            lambda message: self._message("VRAMScope", message),
            lambda _fraction, message: self.statusBar().showMessage(message or "exporting…", 3000)))

    def export_code_dialog(self) -> None:
        if self.model_kind != "sketch":
            self._message("Export code", "Only sketches export as code; built-in models are already code.")
            return
        start = self._dialog_dir(f"{self.display_name().removesuffix('.json')}.py")
        path, _ = QFileDialog.getSaveFileName(self, "Export PyTorch code", start, "Python (*.py)")
        if path:
            self._remember_dir(path)
            self.export_code(path if path.endswith(".py") else path + ".py")

    def export_code(self, path: str) -> bool:
        """Write the sketch as a readable nn.Module file (atomic, through engine.codegen)."""
        sketch = self.current_sketch()
        if sketch is None:
            return False
        if self._guard(lambda: export(sketch, path)):
            self.statusBar().showMessage(f"PyTorch code written: {path}", 6000)
            return True
        return False

    # -----------------------------------------------------------------------------------------------------------
    # tabs, close

    def _tab_changed(self, index: int) -> None:
        # Each tab keeps its own dock layout: the monitor has the window to itself, the builder gets its
        # configuration and results back as they were.
        self._tab_states[self._shown_tab] = self.saveState()
        self._shown_tab = index
        if index == 1 and self.monitor is None:
            self._load_monitor()
        state = self._tab_states.get(index)
        if state is not None and not state.isEmpty():
            self.restoreState(state)
        elif index == 1:
            self.config_dock.hide()
            self.results_dock.hide()

    def _load_monitor(self) -> None:
        from .monitor import MonitorPanel  # pyqtgraph loads when the tab is first shown, not at start-up

        panel = MonitorPanel()  # without NVML or a GPU it says so itself
        self.monitor = panel
        # In a scroll area: the monitor's minimum height (four readable plots) then counts only on its own tab,
        # instead of growing the window under the builder and its docks.
        room = QScrollArea()
        room.setObjectName("MonitorRoom")
        room.setWidget(panel)
        room.setWidgetResizable(True)
        room.setFrameShape(QFrame.Shape.NoFrame)
        self.tabs.blockSignals(True)
        self.tabs.removeTab(1)
        self.tabs.insertTab(1, room, "Monitor")
        self.tabs.setCurrentIndex(1)
        self.tabs.blockSignals(False)
        if self.estimate is not None:
            panel.set_estimate(self.estimate)

    def add_prometheus_server(self) -> None:
        """Monitor ▸ Add Prometheus server…: a fleet tab reading that server (gui/monitor/fleet_panel.py)."""
        from .monitor.fleet_panel import ask_for_server

        panel = ask_for_server(self.settings, self)
        if panel is None:
            return
        self.fleet_panels.append(panel)
        self.tabs.setCurrentIndex(self.tabs.addTab(panel, f"Fleet · {panel.source.server.split('://')[-1]}"))
        panel.closeRequested.connect(lambda: self._close_fleet(panel))

    def _close_fleet(self, panel: FleetPanel) -> None:
        panel.shutdown()
        self.tabs.removeTab(self.tabs.indexOf(panel))
        self.fleet_panels.remove(panel)
        panel.deleteLater()

    def about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", about_text())

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if not self._maybe_save():
            event.ignore()
            return
        self.save_settings()
        self.session.shutdown()
        if self.monitor is not None:
            self.monitor.shutdown()  # the sampler thread ends with the window
        for panel in list(self.fleet_panels):
            panel.shutdown()
        if not self._keep_autosave:
            self.document.discard_autosave()  # a clean exit leaves nothing to recover
        event.accept()

    def end_session(self) -> None:
        """The system asks the app to end (SIGTERM, SIGINT, SIGHUP): close without a question, the engine's
        worker processes with it; unsaved work stays in its autosave, offered back at the next start."""
        if self.is_dirty():
            self.document.autosave_now()
            self._keep_autosave = True
        self.confirm_close = False
        self.close()


# ---------------------------------------------------------------------------------------------------------------
# mapping between the engine's module names and the sketch's node ids

def _node_for_module(name: str, ids: set[str]) -> str | None:
    """A sketch module path ('layers.conv1', 'conv1.0') → the node id it belongs to, if any."""
    if not name:
        return None
    if name in ids:
        return name
    parts = name.split(".")
    for i in range(len(parts)):
        for j in range(len(parts), i, -1):
            cand = ".".join(parts[i:j])
            if cand in ids:
                return cand
    # nn.ModuleDict keys cannot hold '.', so the engine may have written ids with '_' or '__' instead.
    for p in parts:
        for nid in ids:
            if p == nid.replace(".", "_") or p == nid.replace("-", "_"):
                return nid
    return None


def _call_with(fn: Callable[[str], object], arg: str) -> Callable[[], None]:
    """A menu action's slot: `fn(arg)`, whatever the action's signal passes."""

    def call() -> None:
        fn(arg)

    return call


def _node_figures(nodes: dict[str, NodeFigures]) -> NodeResults:
    """Analytic per-node figures → the builder's {"memory", "shape", "error", "params"} per node id."""
    return {
        nid: {"memory": fig.total_bytes, "shape": fig.output_shape, "error": fig.error, "params": fig.parameters}
        for nid, fig in nodes.items()
    }


def app_main_window() -> MainWindow | None:
    for w in QApplication.topLevelWidgets():
        if isinstance(w, MainWindow):
            return w
    return None
