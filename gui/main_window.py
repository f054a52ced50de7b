"""The main window: it builds the widgets (the builder and model views, the tabs, the configuration and results
docks, the status bar), wires them to the parts that own the work, opens models and keeps the window's settings.

The parts: gui.workspace holds the open model, its configuration and the estimate / plan / measured
orchestration (no widget); gui.estimate_view draws its answers; gui.actions is the table of actions and menus;
gui.files the open/save dialogs, recent files and autosave; gui.exports the report and code; gui.real_runs
profile, calibrate and memory snapshots; gui.tabs the monitor and fleet tabs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QUndoStack
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QStackedWidget,
    QTabWidget,
)

from engine import __version__
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.jobs.calls import SourceSpec
from engine.models.sources import model_catalogue
from engine.planning.planner import MaxBatchResult, Recommendation
from engine.results.types import Estimate
from engine.sketch.document import Sketch, list_templates

from . import actions
from .block_graph import BlockGraph
from .builder import BuilderWidget
from .builder.document import SketchDocument
from .config_panel import ConfigPanel
from .config_undo import ConfigHistory
from .estimate_view import EMPTY_SKETCH_HINT, EstimateView, ModuleTree
from .exports import Exports
from .files import Files
from .real_runs import RealRuns
from .results import ResultsPanel
from .session import EngineSession
from .snapshot_link import SnapshotLink
from .stored_settings import stored_config
from .tabs import BUILDER, MainTabs
from .workspace import ModelKind, Workspace, is_hf_config

if TYPE_CHECKING:
    from .monitor.panel import MonitorPanel

__all__ = ["EMPTY_SKETCH_HINT", "MainWindow", "about_text", "app_main_window"]

APP_NAME = "VRAMScope"
DEFAULT_SKETCHES = ("lenet", "mlp", "resnet18")  # the first that exists opens on start


def about_text() -> str:
    """What the app claims for its figures, as the README does: traced tensors exact, the GPU's additions modelled."""
    return (f"<b>{APP_NAME} {__version__}</b><br>Will this fit on my GPU?<br><br>"
            "The tensors a PyTorch training step (or inference pass) allocates are traced on fake tensors, with no "
            "GPU: the peak of live tensor bytes is exact. What a GPU adds on top — the caching allocator's reserve, "
            "the CUDA context and library workspaces, hence nvidia-smi's figure — is modelled, and so is the fit "
            "verdict. “Profile on this machine” measures the real step to compare.<br><br>"
            "Also: a live monitor of NVIDIA GPUs, and PDF memory reports.")


def _model_family(name: str) -> str | None:
    return next((m.family for m in model_catalogue() if m.name == name), None)


def _dock(window: QMainWindow, title: str, name: str, widget: ConfigPanel | ResultsPanel) -> QDockWidget:
    dock = QDockWidget(title, window)
    dock.setObjectName(name)
    dock.setWidget(widget)
    window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
    return dock


class MainWindow(QMainWindow):
    """The app. `estimateReady(est)` after each traced estimate shown; `estimateFailed(msg)` on an engine error;
    `analyticReady(res)` after the instant figures of a sketch are shown."""

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

        # ---- document, builder and the read-only model views
        self.document = SketchDocument(self)
        self.builder = BuilderWidget(document=self.document)
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
        self.builder_stack.addWidget(self.model_views)

        # ---- docks, tabs and the status bar
        self.config_panel = ConfigPanel()
        self.ws = Workspace(self.session, self.document, self.config_panel.target_gpu_bytes, self)
        self.config_dock = _dock(self, "Training configuration", "ConfigDock", self.config_panel)
        self.results = ResultsPanel()
        self.results_dock = _dock(self, "Results", "ResultsDock", self.results)
        self.tabs = MainTabs(self, self.builder_stack, [self.config_dock, self.results_dock], self.ws,
                             self.settings)
        self.setCentralWidget(self.tabs)
        say = self.statusBar().showMessage
        self.snapshots = SnapshotLink(self.session, self.results, self.ws.open_model_spec, say)
        self.splitDockWidget(self.config_dock, self.results_dock, Qt.Orientation.Horizontal)
        self.resizeDocks([self.config_dock, self.results_dock], [300, 1000], Qt.Orientation.Horizontal)
        self.resizeDocks([self.results_dock], [340], Qt.Orientation.Vertical)
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

        # ---- the parts, and the wiring
        self.view = EstimateView(self.ws, self.results, self.builder, self.module_tree, self.block_graph,
                                 self.snapshots, self.statusBar(), self.status_label, self)
        self.files = Files(self, self.settings, self.ws, self.config_panel, self.statusBar(),
                           lambda: self.confirm_close, self.open_path)
        self.exports = Exports(self.ws, self.snapshots, self.results, self.files, self.statusBar(),
                               self.tabs.gpu_snapshot)
        self.runs = RealRuns(self.ws, self.snapshots, self.results, self.config_panel, self.files,
                             self.statusBar())
        self.ws.opened.connect(self._opened)
        self.ws.estimateReady.connect(self.estimateReady)
        self.ws.estimateFailed.connect(self.estimateFailed)
        self.ws.analyticReady.connect(self.analyticReady)
        self.session.busyChanged.connect(self.status_busy.setVisible)
        self.builder.sketchChanged.connect(self._on_sketch_changed)
        self.builder.message.connect(lambda text: say(text, 6000))  # a refused edit's reason
        self.config_panel.configChanged.connect(self.ws.set_config)
        self.config_history = ConfigHistory(self.config_panel, self.undo_stack(), self)  # its edits: Ctrl+Z
        self.results.moduleSelected.connect(lambda _name: self.tabs.setCurrentIndex(BUILDER))
        self.results.profileRequested.connect(self.runs.profile)
        self.results.stopRequested.connect(self.runs.stop_profile)
        self.document.dirtyChanged.connect(lambda _dirty: self._update_title())
        self.document.pathChanged.connect(lambda _path: self._update_title())
        self.document.refused.connect(lambda msg: say(msg, 6000))

        self.acts, menus = actions.build(self, self)
        a = self.acts
        self.act_undo, self.act_redo, self.act_stop, self.act_profile = a["undo"], a["redo"], a["stop"], a["profile"]
        self.act_calibrate, self.act_export_report = a["calibrate"], a["export_report"]
        self.act_open_snapshot, self.act_close_snapshot = a["open_snapshot"], a["close_snapshot"]
        self.template_menu, self.recent_menu = menus["template_menu"], menus["recent_menu"]
        try:
            self.ws.cfg = self.config_panel.config()
        except UserError:
            self.ws.cfg = TrainConfig()
        if restore_state:
            self._restore_settings()
        if not self.settings.value("window/geometry"):
            self.resize(1360, 900)
            # The config dock as wide as its fields ask (the window's layout would give it its minimum, which
            # scrolls them sideways); once shown, when the dock area has its size.
            QTimer.singleShot(0, self._fit_config_dock)
        self._update_title()

    def _fit_config_dock(self) -> None:
        frame = self.config_dock.width() - self.config_panel.width()  # the dock's own border
        want = self.config_panel.sizeHint().width() + max(frame, 0) + 8  # + the separator's few pixels
        # Both side-by-side docks, else Qt reads the one size as a share of the row.
        self.resizeDocks([self.config_dock, self.results_dock], [want, max(self.width() - want, 1)],
                         Qt.Orientation.Horizontal)

    # -----------------------------------------------------------------------------------------------------------
    # settings

    def _restore_settings(self) -> None:
        geo = self.settings.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        self.tabs.restore_states()
        cfg = stored_config(self.settings.value("config"))  # None for any value it cannot take: the defaults stay
        if cfg is not None:
            self.config_panel.set_config(cfg)
            self.ws.cfg = self.config_panel.config()

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.tabs.save_states()
        if self.ws.cfg is not None:
            self.settings.setValue("config", json.dumps(self.ws.cfg.to_json()))
        self.settings.sync()

    # -----------------------------------------------------------------------------------------------------------
    # the workspace's state, as the app and its tests read it

    @property
    def estimate(self) -> Estimate | None:
        return self.ws.estimate

    @property
    def recommendations(self) -> list[Recommendation] | None:
        return self.ws.recommendations

    @property
    def max_batch(self) -> MaxBatchResult | None:
        return self.ws.max_batch

    @property
    def model_kind(self) -> ModelKind:
        return self.ws.model_kind

    @property
    def auto_plan(self) -> bool:
        """Whether the planner (max batch, recommendations) runs after each traced estimate."""
        return self.ws.auto_plan

    @auto_plan.setter
    def auto_plan(self, on: bool) -> None:
        self.ws.auto_plan = on

    @property
    def monitor(self) -> MonitorPanel | None:
        return self.tabs.monitor

    def display_name(self) -> str:
        return self.ws.display_name()

    def is_dirty(self) -> bool:
        return self.ws.is_dirty()

    def _update_title(self) -> None:
        ro = " (read-only)" if self.ws.model_kind != "sketch" else ""
        # The mark is written into the title itself (setWindowModified would need a "[*]" placeholder, which
        # windowTitle() then returns verbatim).
        self.setWindowTitle(f"{self.display_name()}{'*' if self.is_dirty() else ''}{ro} — {APP_NAME}")

    def undo_stack(self) -> QUndoStack:
        return self.document.undo_stack()

    def current_sketch(self) -> Sketch | None:
        return self.ws.current_sketch()

    def config(self) -> TrainConfig:
        return self.ws.config()

    def target_bytes(self) -> int | None:
        return self.ws.target_bytes()

    def source_spec(self) -> SourceSpec | None:
        return self.ws.source_spec()

    def request_estimate(self, immediate: bool = False) -> None:
        self.ws.request_estimate(immediate)

    def _on_sketch_changed(self, _sketch: Sketch) -> None:
        if self.ws.model_kind == "sketch":
            self._update_title()
            self.ws.sketch_edited()

    # -----------------------------------------------------------------------------------------------------------
    # opening models

    def show_sketch(self, sketch: Sketch, read_only: bool = False) -> None:
        self.ws.open_sketch()
        self.builder_stack.setCurrentIndex(0)
        self.builder.set_sketch(sketch, read_only=read_only)
        self.config_panel.set_input_fields(seq_len=False, image_size=False)
        if sketch.training:  # saved with its training configuration: batch size, optimizer, precision, target
            self.config_panel.set_config(TrainConfig.from_json(sketch.training))
            self.ws.cfg = self.config_panel.config()
        self.document.set_training(self.config().to_json(), saved=not self.document.is_dirty())
        self.ws.model_opened()

    def _opened(self) -> None:
        """A different model is open (the workspace's `opened`): the title, the builder's tab, the snapshot."""
        self._update_title()
        self.tabs.setCurrentIndex(BUILDER)
        self.snapshots.model_opened()  # one shown alone goes beside this model; one of the model before closes

    def open_default(self) -> bool:
        """Open the first default sketch template that exists (the app's start page)."""
        names = [name for name, _path in list_templates()]
        for name in DEFAULT_SKETCHES:
            if name in names:
                return self.open_template(name)
        if names:
            return self.open_template(names[0])
        # No sketch templates in this build: a small built-in model keeps the window useful.
        return self.open_model("resnet18")

    def new_sketch(self) -> None:
        if not self.files.maybe_save():
            return
        self.files.guard(self.document.new)
        self.show_sketch(self.document.sketch)

    def open_template(self, name: str) -> bool:
        if not self.files.maybe_save():
            return False
        if not self.files.guard(lambda: self.document.new(template=name)):
            return False
        self.show_sketch(self.document.sketch)
        return True

    def open_model(self, ref: str) -> bool:
        """A built-in model or `file.py:function`, read-only: its module tree instead of the canvas."""
        if not self.files.maybe_save():
            return False
        self.ws.open_ref(ref)
        self.document.forget_history()  # the hidden sketch's edits and the last model's settings: not undone here
        self.builder_stack.setCurrentIndex(1)
        self.view.clear_model_views()
        fam = _model_family(ref)
        self.config_panel.set_input_fields(seq_len=fam in (None, "text", "speech"), image_size=fam in (None, "vision"))
        self.ws.model_opened()
        return True

    def open_path(self, path: str) -> bool:
        """A sketch .json (editable), or `file.py:function` or a Hugging Face config.json (read-only)."""
        if ".py:" in path or is_hf_config(path):
            return self.open_model(path)
        if not self.files.maybe_save():
            return False
        if not self.files.guard(lambda: self.document.open(path)):
            self.files.remove_recent(path)  # a file that does not open is not offered again
            return False
        self.files.add_recent(path)
        self.show_sketch(self.document.sketch)
        return True

    # -----------------------------------------------------------------------------------------------------------
    # what the parts do, as the app and its tests ask for it

    def recent_files(self) -> list[str]:
        return self.files.recent_files()

    def save(self) -> bool:
        return self.files.save()

    def save_as(self, path: str) -> bool:
        return self.files.save_as(path)

    def export_report(self, path: str, full: bool = False) -> int:
        return self.exports.report(path, full=full)

    def export_code_dialog(self) -> None:
        self.exports.code_dialog()

    def export_code(self, path: str) -> bool:
        return self.exports.code(path)

    def profile(self) -> None:
        self.runs.profile()

    def open_snapshot_dialog(self) -> None:
        self.runs.open_snapshot_dialog()

    def open_snapshot(self, path: str) -> int:
        return self.runs.open_snapshot(path)

    def about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", about_text())

    # -----------------------------------------------------------------------------------------------------------
    # close

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if not self.files.maybe_save():
            event.ignore()
            return
        self.save_settings()
        self.session.shutdown()
        self.tabs.shutdown()
        self.files.closed()
        event.accept()

    def end_session(self) -> None:
        """The system asks the app to end (SIGTERM, SIGINT, SIGHUP): close without a question, the engine's
        worker processes with it; unsaved work stays in its autosave, offered back at the next start."""
        self.files.end_session()
        self.confirm_close = False
        self.close()


def app_main_window() -> MainWindow | None:
    for w in QApplication.topLevelWidgets():
        if isinstance(w, MainWindow):
            return w
    return None
