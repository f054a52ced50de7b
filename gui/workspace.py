"""The open model, its training configuration and the engine work on them, owning no widget: which model is open
(an editable sketch, a built-in model, a file), the live estimate (the analytic figures at once after an edit, the
traced estimate after a short debounce), the planner's answers for the estimate shown, the module tree of a
read-only model and a profile run's measurement. Engine work goes through gui.session (one typed callback per job,
stale answers dropped there); what comes back is kept here and announced with a signal, which the window's
views (gui.estimate_view, gui.real_runs, gui.exports, gui.files) turn into pixels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QTimer, Signal

from engine.config.train_config import TrainConfig
from engine.core.bounded_read import read_json
from engine.core.errors import UserError
from engine.jobs.calls import SourceSpec
from engine.models.hf_source import looks_like_hf_config
from engine.planning.planner import MaxBatchResult, MaxContextResult, Recommendation
from engine.results.types import Estimate
from engine.sketch.analytic import AnalyticResult
from engine.sketch.document import Sketch

from .builder.document import SketchDocument
from .config_panel import in_panel_terms
from .session import EngineSession, JobCallbacks

ModelKind = Literal["sketch", "template", "file"]
TreeRows = list[tuple[str, str, int, int]]  # (dotted name, type, own parameters, total parameters)
DEBOUNCE_MS = 250  # edits are debounced; the analytic figures go out at once
# What an emptied sketch stops: a trace of the layers just removed must not come back on screen.
ESTIMATE_KINDS = ("estimate", "analytic", "max_batch", "max_context", "plan", "plan_quick")


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


def sketch_copy(sketch: Sketch) -> dict[str, Any]:
    """A copy of the sketch's state taken on the GUI thread, so the engine never reads a sketch mid-edit."""
    copy: dict[str, Any] = json.loads(json.dumps(sketch.to_json()))
    return copy


class Workspace(QObject):
    """The open model and its figures. `target_bytes()` is what a process can allocate on the target GPU the user
    chose (the largest-batch search's budget when the estimate names no GPU); `debounce_ms` how long after an edit
    the traced estimate is asked for (the analytic figures are asked for at once).

    Signals, each after the state it announces is kept here:
    opened(): a different model is open (nothing of the previous one is on screen any more);
    estimating(empty): an edit or a setting asks for new figures (empty: a sketch with no layers, nothing to do);
    analyticReady(AnalyticResult) with per-node figures; nodeFigures(AnalyticResult): an edit's per-node figures
    alone, its analytic answer having come after its traced estimate failed (the last good figures stay, as when it
    comes first); traced(Estimate): the traced estimate to show, before the planner starts on it;
    estimateReady(Estimate): after that; modelFailed(message): the model does not build (panel terms);
    estimateFailed(message): the traced estimate failed;
    planStarted(budget or None, generating); quickPlan(recommendations, the full plan's error or "");
    planReady(recommendations); planFailed(message); planProgress(fraction, message); maxBatchFound(result);
    maxBatchFailed(message); maxBatchProgress(fraction, message); maxContextFound(result, text);
    planSettled(): one of the planner's answers came (a report waiting for them may go);
    treeReady(rows) / treeFailed(message): a read-only model's module tree;
    profileStarted(); measuredReady(); profileProgress(fraction, message); profileEnded(message).
    """

    opened = Signal()
    estimating = Signal(bool)
    analyticReady = Signal(object)
    nodeFigures = Signal(object)
    traced = Signal(object)
    estimateReady = Signal(object)
    modelFailed = Signal(str)
    estimateFailed = Signal(str)
    planStarted = Signal(object, bool)
    quickPlan = Signal(object, str)
    planReady = Signal(object)
    planFailed = Signal(str)
    planProgress = Signal(float, str)
    maxBatchFound = Signal(object)
    maxBatchFailed = Signal(str)
    maxBatchProgress = Signal(float, str)
    maxContextFound = Signal(object, str)
    planSettled = Signal()
    treeReady = Signal(object)
    treeFailed = Signal(str)
    profileStarted = Signal()
    measuredReady = Signal()
    profileProgress = Signal(float, str)
    profileEnded = Signal(str)

    def __init__(self, session: EngineSession, document: SketchDocument, target_bytes: Callable[[], int | None],
                 parent: QObject | None = None, *, debounce_ms: int = DEBOUNCE_MS):
        super().__init__(parent)
        self.session, self.document = session, document
        self._target_bytes = target_bytes
        self.auto_plan = True  # ask the planner (max batch, recommendations) after each traced estimate
        self.model_kind: ModelKind = "sketch"
        self.model_ref = ""  # template name or file ref for read-only models
        self.cfg: TrainConfig | None = None
        self.estimate: Estimate | None = None  # the traced estimate shown (None while only analytic figures are)
        self.measured: Estimate | None = None
        self.measured_against: Estimate | None = None
        self.recommendations: list[Recommendation] | None = None  # the planner's answers for the estimate shown
        self.quick_recommendations: list[Recommendation] | None = None
        self.plan_failed = ""  # the re-traced plan's error, when it failed
        self.max_batch: MaxBatchResult | None = None
        self.max_batch_none: str | None = None  # why no batch fits, when the search found none
        self.tree_rows: TreeRows = []
        self._planned: Estimate | None = None  # the estimate the planner was last asked for, whole or quick
        self._quick_asked: Estimate | None = None
        self._tree_wanted = False  # a read-only model opened: its module tree is asked for after its estimate
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(debounce_ms)
        self._timer.timeout.connect(self._run_traced)

    # ---- the open model
    def config(self) -> TrainConfig:
        return self.cfg or TrainConfig()

    def target_bytes(self) -> int | None:
        return self._target_bytes()

    def current_sketch(self) -> Sketch | None:
        return self.document.sketch

    def display_name(self) -> str:
        return self.document.display_name() if self.model_kind == "sketch" else self.model_ref

    def is_dirty(self) -> bool:
        return self.model_kind == "sketch" and self.document.is_dirty()

    def source_spec(self) -> SourceSpec | None:
        """What the engine process needs to rebuild the model: the sketch copied now, or the reference."""
        if self.model_kind == "sketch":
            sketch = self.current_sketch()
            if sketch is None:
                return None
            path = self.document.path
            return ("sketch", sketch_copy(sketch), str(path) if path else None)
        return ("ref", self.model_ref) if self.model_ref else None

    def open_model_spec(self) -> SourceSpec | None:
        """The open model's spec, None when there is none (an empty sketch)."""
        sketch = self.current_sketch()
        return None if self.model_kind == "sketch" and (sketch is None or not sketch.nodes) else self.source_spec()

    def open_sketch(self) -> None:
        """The document's sketch is the open model now (the caller shows it, then calls model_opened)."""
        self.model_kind, self.model_ref = "sketch", ""

    def open_ref(self, ref: str) -> None:
        """A built-in model or `file.py:function` or a Hugging Face config, read-only: its module tree is asked
        for (treeReady / treeFailed) by model_opened, after its estimate; the caller shows it, then calls
        model_opened."""
        self.model_kind = "file" if ".py:" in ref or is_hf_config(ref) else "template"
        self.model_ref = ref
        self.tree_rows = []
        self._tree_wanted = True

    def model_opened(self) -> None:
        """A different model is open: nothing of the one before stays; its figures are asked for at once, then a
        read-only model's module tree (the engine process runs its jobs in order: the numbers come first; the tree
        asked first held them up by the model's build, 2 s of an 8B QLoRA model's)."""
        self.estimate = self.measured = self.measured_against = None
        self.session.model_opened()
        self.opened.emit()
        self.request_estimate(immediate=True)
        if self._tree_wanted and self.model_kind != "sketch":
            self.session.module_tree(self.model_ref, self.config(), JobCallbacks(self._tree, self._tree_failed))
        self._tree_wanted = False

    def set_config(self, cfg: TrainConfig) -> None:
        """The panel's configuration changed (it debounced its edits): a sketch stores it, figures come now."""
        self.cfg = cfg
        if self.model_kind == "sketch":
            self.document.set_training(cfg.to_json())  # the file stores it: a change is unsaved work
        self.request_estimate(immediate=True)

    def sketch_edited(self) -> None:
        if self.model_kind == "sketch":
            self.request_estimate()

    # ---- the live estimate
    def request_estimate(self, immediate: bool = False) -> None:
        """Analytic figures now (sketches), the traced estimate after the debounce (or now)."""
        self.session.edited()
        sketch = self.current_sketch() if self.model_kind == "sketch" else None
        if sketch is not None and not sketch.nodes:
            self._timer.stop()
            for kind in ESTIMATE_KINDS:
                self.session.cancel(kind)
            self.estimate = None  # nothing to export or plan: the figures were of layers no longer there
            self.estimating.emit(True)
            return
        self.estimating.emit(False)
        self._run_analytic()
        if immediate:
            self._timer.stop()
            self._run_traced()
        else:
            self._timer.start()

    def _run_analytic(self) -> None:
        sketch = self.current_sketch() if self.model_kind == "sketch" else None
        if sketch is not None:
            # An answer after this edit's trace failed (its own thread, slower on a loaded machine) gives the canvas
            # its per-node figures only: the summary keeps the last version that built and the trace's message, as
            # when the answer comes first (it showed as "analytic, refining…" beside "the last version that built").
            self.session.analytic(sketch_copy(sketch), self.config(),
                                  JobCallbacks(self._analytic, self._estimate_failed),
                                  after_failure=self._node_figures)

    def _run_traced(self) -> None:
        spec = self.source_spec()
        if spec is not None:
            self.session.estimate(spec, self.config(), JobCallbacks(self._traced, self._estimate_failed))

    def _analytic(self, res: AnalyticResult) -> None:
        if res.nodes:  # an empty sketch has no figures (not "0 B, fits"); the traced estimate says what is missing
            self.analyticReady.emit(res)

    def _node_figures(self, res: AnalyticResult) -> None:
        if res.nodes:
            self.nodeFigures.emit(res)

    def _traced(self, est: Estimate) -> None:
        self.estimate = est
        self.recommendations = self.max_batch = self.max_batch_none = None
        self.quick_recommendations, self.plan_failed = None, ""  # the answers of the estimate before are not these
        self.traced.emit(est)
        if self.auto_plan:
            self._run_planner(est)
        self.estimateReady.emit(est)

    def _estimate_failed(self, message: str) -> None:
        # The user's sketch and the last good figures stay, marked as the last version that built.
        message = in_panel_terms(message)
        self.modelFailed.emit(message)
        self.estimateFailed.emit(message)

    # ---- the planner
    def plan_asked(self, full: bool) -> bool:
        """Whether the planner was asked for the estimate shown: its whole plan (`full`), or its quick answers."""
        asked = self._planned if full else self._quick_asked
        return self.estimate is not None and asked is self.estimate

    def plan(self) -> None:
        """The whole plan for the estimate shown, now (the planner is off, or a report asks for it)."""
        if self.estimate is not None:
            self._run_planner(self.estimate)

    def quick_plan(self) -> None:
        """Only the planner's cheap answers for the estimate shown (those that need no new trace): quickPlan."""
        spec = self.source_spec()
        if self.estimate is not None and spec is not None:
            self.quick_recommendations = None
            self._ask_quick(spec, self.estimate)

    def _ask_quick(self, spec: SourceSpec, est: Estimate) -> None:
        self._quick_asked = est
        self.session.recommend(spec, est, JobCallbacks(self._show_quick_recommendations, self._plan_error),
                               quick=True)

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
        generating = est.config.generating
        self._planned = est
        self.quick_recommendations = None
        self.plan_failed = ""
        self.planStarted.emit(budget, generating)
        # Cheap answers first: those that need no new trace come in seconds, before the largest-batch search and
        # the re-traced answers (the engine process runs its jobs one after another, in this order).
        self._ask_quick(spec, est)
        if budget:
            self.session.max_batch(spec, est.config, budget, figure,
                                   JobCallbacks(self._max_batch, self._max_batch_error, self.maxBatchProgress.emit))
        if budget and generating:  # as the CLI's max-context: the prompt, with the new tokens set
            self.session.max_context(spec, est.config, budget, figure, JobCallbacks(
                self._max_context, lambda m: self.maxContextFound.emit(None, f"Longest prompt that fits: none — {m}")))
        self.session.recommend(spec, est, JobCallbacks(self._recommendations, self._plan_error,
                                                       self.planProgress.emit))

    def _show_quick_recommendations(self, value: list[Recommendation]) -> None:
        self.quick_recommendations = value
        if self.recommendations is None:  # the full answer has not come first
            if self.plan_failed:  # nor will it: these are the plan
                self.recommendations = value
            self.quickPlan.emit(value, self.plan_failed)

    def _recommendations(self, value: list[Recommendation]) -> None:
        self.planReady.emit(value)
        self.recommendations = value
        self.planSettled.emit()

    def _plan_error(self, message: str) -> None:
        message = in_panel_terms(message)
        self.plan_failed = message
        self.planFailed.emit(message)
        if self.recommendations is None and self.quick_recommendations is not None:
            self.recommendations = self.quick_recommendations  # what the planner did find goes into the report
        self.planSettled.emit()  # a waiting report goes without the plan, rather than never

    def _max_batch(self, value: MaxBatchResult) -> None:
        self.max_batch = value
        self.maxBatchFound.emit(value)
        self.planSettled.emit()

    def _max_batch_error(self, message: str) -> None:
        self.max_batch_none = in_panel_terms(message.removeprefix("max-batch: "))  # the CLI command's name
        self.maxBatchFailed.emit(self.max_batch_none)
        self.planSettled.emit()

    def _max_context(self, value: MaxContextResult) -> None:
        self.maxContextFound.emit(value, "")

    # ---- a read-only model's module tree
    def _tree(self, rows: TreeRows) -> None:
        self.tree_rows = rows
        self.treeReady.emit(rows)

    def _tree_failed(self, message: str) -> None:
        self.tree_rows = []
        self.treeFailed.emit(message)

    # ---- a profile run
    def profile(self) -> bool:
        """Run the configured step for real on this machine; False with no model to run."""
        spec = self.source_spec()
        if spec is None:
            return False
        self.profileStarted.emit()
        self.session.profile(spec, self.config(), JobCallbacks(
            self._measured, self.profileEnded.emit, self.profileProgress.emit,
            lambda: self.profileEnded.emit("Profiling stopped.")))
        return True

    def _measured(self, value: tuple[Estimate, Estimate | None]) -> None:
        self.measured, self.measured_against = value
        self.measuredReady.emit()

    def drop_measured(self) -> None:
        """A snapshot is open: the Measured tab and the report show it now, not an earlier profile run."""
        self.measured = self.measured_against = None
