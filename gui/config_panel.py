"""The training-configuration panel: every TrainConfig field (batch, input size, precision, optimizer, mode,
fine-tuning (LoRA/QLoRA) and quantized weights, GPUs and sharding, allocator option, target GPU), built through
TrainConfig.from_options as the CLI's are.

Edits are debounced (~250 ms) so a spin-box drag or a typed number yields one estimate, not fifty (a step of a
spin box, its arrow keys, buttons or wheel, ~80 ms: a held key's repeats still come closer); a value the engine's
TrainConfig refuses is shown at the panel with its one-line reason and nothing is emitted.

Each field has a name (`fields()`); a user's change of one is announced as `fieldEdited(name, stepped)` (the undo
history, gui.config_undo, records it) and `restore_field` shows an undone or redone value as such a change is
shown (debounced, then estimated) without announcing it; `set_config` and a refreshed target list announce only
`loaded` (a file's or the settings' configuration is not an edit).
"""

from __future__ import annotations

import re
from functools import partial

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal, SignalInstance
from PySide6.QtGui import QKeyEvent, QValidator
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.config.gpus import GpuSpec, list_gpus, local_gpu
from engine.config.optimizers import OPTIMIZER_TABLE
from engine.config.train_config import CACHES, MOE_ROUTINGS, OPTIMIZERS, PRECISIONS, STRATEGIES, TrainConfig
from engine.core.errors import UserError
from engine.core.units import format_bytes

DEBOUNCE_MS = 250
STEP_DEBOUNCE_MS = 80  # a spin box stepped (not typed into): its value is whole at once (issue 24: edit → numbers)
STEP_KEYS = (Qt.Key.Key_Up, Qt.Key.Key_Down, Qt.Key.Key_PageUp, Qt.Key.Key_PageDown)
MIN_WIDTH = 360  # px: the panel's narrowest; its fields scroll sideways below their own width
FieldValue = bool | int | float | str | None  # a field's value: ticked, a number, a text, a combo box's item data
Field = QCheckBox | QComboBox | QSpinBox | QDoubleSpinBox | QLineEdit
CPU_TARGET = "__cpu__"
LOCAL_TARGET = "__local__"

_PRECISION_LABELS = {
    "fp32": "FP32",
    "fp16": "FP16 (pure)",
    "bf16": "BF16 (pure)",
    "amp-fp16": "AMP FP16",
    "amp-bf16": "AMP BF16",
}
_PEFT_LABELS = {None: "Full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base)"}
_WEIGHT_LABELS = {None: "as precision", "nf4": "NF4 4-bit", "fp4": "FP4 4-bit", "int8": "INT8 (LLM.int8)",
                  "fp8": "FP8 e4m3"}


# The engine's messages name the CLI's options ("--mode generate needs …"); the panel's user knows its fields.
_MODE_LABELS = {"train": "Training step", "inference": "Inference", "generate": "Generation (KV cache)"}
_FIELD_OF_OPTION = {
    "--batch-size": "Batch size", "--seq-len": "Sequence length", "--image-size": "Image size",
    "--precision": "Precision", "--optimizer": "Optimizer", "--mode": "Mode", "--checkpointing": "Activation "
    "checkpointing", "--peft": "Fine-tuning", "--lora-rank": "LoRA rank", "--lora-alpha": "LoRA alpha",
    "--lora-targets": "LoRA targets", "--weights": "Weights", "--grad-accum": "Grad accumulation", "--gpu": "Target",
    "--world-size": "GPUs", "--strategy": "GPUs' strategy", "--tp": "TP", "--alloc-conf": "Alloc. conf",
    "--moe-routing": "MoE routing", "--prompt-len": "Generation's prompt", "--new-tokens": "Generation's new tokens",
    "--cache": "Generation's cache", "--generate-program": "Program",
    "--compile": "torch.compile",
}
_OPTION = re.compile(r"--[a-z][a-z-]*(?: (train|inference|generate|lora|qlora)\b)?")


def in_panel_terms(message: str) -> str:
    """An engine message with the CLI's option names as the panel's fields: '--mode generate needs …' reads
    'Mode “Generation (KV cache)” needs …', '--peft lora' 'Fine-tuning “LoRA”'. Other options stay as they are."""

    def field(m: re.Match[str]) -> str:
        option, value = m.group(0).split(" ")[0], m.group(1)
        name = _FIELD_OF_OPTION.get(option)
        if name is None:
            return m.group(0)
        if value is None:
            return name
        label = _MODE_LABELS.get(value) if option == "--mode" else _PEFT_LABELS.get(value)
        return f"{name} “{label}”" if label else m.group(0)

    return _OPTION.sub(field, message)


def catalogue_gpus() -> list[tuple[str, int]]:
    """(name, total bytes) for each GPU of the engine's catalogue."""
    return [(g.name, g.memory_bytes) for g in list_gpus()]


class CheckedSpinBox(QSpinBox):
    """A spin box that says why it refuses a keystroke (a minus sign, a value past its range) instead of silently
    keeping the digits: `refused(message)`."""

    refused = Signal(str)

    def __init__(self, label: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.label = label

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:  # noqa: N802 (Qt naming)
        body = text.removeprefix(self.prefix()).removesuffix(self.suffix()).strip().replace(",", "")
        if body.startswith(("-", "\u2212")):
            self.refused.emit(f"{self.label}: {body} is refused; it must be at least {self.minimum():,}.")
            return QValidator.State.Invalid, text, pos
        if body.isdigit() and int(body) > self.maximum():
            self.refused.emit(f"{self.label}: {int(body):,} is refused; it can be at most {self.maximum():,}, "
                              f"so it stays {self.value():,}.")
            return QValidator.State.Invalid, text, pos
        return super().validate(text, pos)


def _row(*widgets: QWidget) -> QWidget:
    """Several controls on one form row (keeps the panel short)."""
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        lay.addWidget(w, 1 if isinstance(w, QComboBox) else 0)
    return box


def _changed(field: Field) -> SignalInstance:
    """The signal a field sends when its value changes."""
    if isinstance(field, QCheckBox):
        return field.toggled
    if isinstance(field, QComboBox):
        return field.currentIndexChanged
    if isinstance(field, QLineEdit):
        return field.textChanged
    return field.valueChanged


class ConfigPanel(QWidget):
    """Emits `configChanged(TrainConfig)` after edits settle; `errorChanged(str)` ('' when valid);
    `fieldEdited(name, stepped)` at once for each user's change of a field (`stepped`: a spin box's step, not a
    typed digit); `loaded()` after the fields were set from a configuration (no field edited)."""

    configChanged = Signal(object)
    errorChanged = Signal(str)
    fieldEdited = Signal(str, bool)
    loaded = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ConfigPanel")
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self._emit_now)
        self._loading = False
        self._restoring = False  # an undo or redo shows a field's value: not a new edit
        self._stepping = False  # the next value change is a spin box's step (arrow key, button, wheel)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)

        self.batch = CheckedSpinBox("Batch size")
        self.batch.setRange(1, 2**31 - 1)  # the largest a spin box holds; the engine says when it will not fit
        self.batch.setValue(32)
        self.batch.setAccelerated(True)
        self.batch.setToolTip("Samples per step (per GPU)")
        form.addRow("Batch size", self.batch)

        self.seq_len = QSpinBox()
        self.seq_len.setRange(0, 1 << 20)
        self.seq_len.setSpecialValueText("model default")
        self.seq_len.setToolTip("Sequence length of text models (0 = the model's default)")
        form.addRow("Sequence length", self.seq_len)

        self.image_size = QSpinBox()
        self.image_size.setRange(0, 16384)
        self.image_size.setSpecialValueText("model default")
        self.image_size.setToolTip("Image resolution of vision models (0 = the model's default)")
        form.addRow("Image size", self.image_size)

        self.precision = QComboBox()
        for p in PRECISIONS:
            self.precision.addItem(_PRECISION_LABELS.get(p, p), p)
        form.addRow("Precision", self.precision)

        self.optimizer = QComboBox()
        for o in OPTIMIZER_TABLE.values():
            self.optimizer.addItem(o.label, o.name)
        self.optimizer.setCurrentIndex(OPTIMIZERS.index("adam"))
        self.fused = QCheckBox("fused")
        self.fused.setToolTip("Fused optimizer kernels (one multi-tensor step; fewer temporaries)")
        form.addRow("Optimizer", _row(self.optimizer, self.fused))

        self.mode = QComboBox()
        self.mode.addItem("Training step", "train")
        self.mode.addItem("Inference", "inference")
        self.mode.addItem("Generation (KV cache)", "generate")
        form.addRow("Mode", self.mode)

        # Generation: a prompt, then new tokens decoded one at a time with the model's KV cache.
        self.prompt_len = QSpinBox()
        self.prompt_len.setRange(0, 1 << 22)
        self.prompt_len.setSpecialValueText("prompt: sequence length")
        self.prompt_len.setPrefix("prompt ")
        self.prompt_len.setToolTip("Prompt tokens of the generation (0 = the sequence length, else the model's "
                                   "default)")
        self.new_tokens = QSpinBox()
        self.new_tokens.setRange(1, 1 << 22)
        self.new_tokens.setValue(128)
        self.new_tokens.setSuffix(" new")
        self.new_tokens.setToolTip("Tokens generated after the prompt, one decode step each")
        self.cache = QComboBox()
        for c in CACHES:
            self.cache.addItem(f"{c} cache", c)
        self.cache.setToolTip("transformers' DynamicCache (grows every token) or StaticCache (allocated once for "
                              "prompt + new tokens)")
        self.generate_program = QComboBox()
        self.generate_program.addItem("model.generate()", "generate")
        self.generate_program.addItem("own decode loop", "loop")
        self.generate_program.setToolTip("The program modelled: transformers' model.generate() (greedy), or a "
                                         "prefill-then-decode loop of your own (model(...) once per token)")
        self.do_sample = QCheckBox("Sample")
        self.do_sample.setToolTip("generate() samples the next token (do_sample=True) instead of taking the likeliest")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1 << 20)
        self.top_k.setPrefix("top-k ")
        self.top_k.setSpecialValueText("top-k: default")
        self.top_k.setToolTip("Sampling keeps the K likeliest tokens (default: the model's generation config)")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setDecimals(2)
        self.top_p.setSingleStep(0.05)
        self.top_p.setPrefix("top-p ")
        self.top_p.setSpecialValueText("top-p: default")
        self.top_p.setToolTip("Sampling keeps the likeliest tokens whose probabilities add up to P")
        self._form = form
        self._generation_row = _row(self.prompt_len, self.new_tokens, self.cache)
        form.addRow("Generation", self._generation_row)
        self._program_row = _row(self.generate_program, self.do_sample, self.top_k, self.top_p)
        form.addRow("Program", self._program_row)

        self.checkpointing = QCheckBox("Activation checkpointing")
        form.addRow("", self.checkpointing)
        self.compile = QCheckBox("torch.compile")
        self.compile.setToolTip("The step as torch.compile(model) runs it (inductor, default mode): what the "
                                "partitioner saves for the backward, what the fused kernels allocate and reuse; "
                                "the optimizer step eager")
        form.addRow("", self.compile)

        self.peft = QComboBox()
        for key, label in _PEFT_LABELS.items():
            self.peft.addItem(label, key)
        self.peft.setToolTip("LoRA trains low-rank adapters (peft) on a frozen base: no gradients or optimizer "
                             "state for the base; QLoRA stores the base in 4-bit NF4 (bitsandbytes)")
        self.lora_rank = QSpinBox()
        self.lora_rank.setRange(1, 4096)
        self.lora_rank.setValue(16)
        self.lora_rank.setPrefix("r ")
        self.lora_rank.setToolTip("LoRA rank")
        self.lora_alpha = QSpinBox()
        self.lora_alpha.setRange(0, 1 << 16)
        self.lora_alpha.setPrefix("α ")
        self.lora_alpha.setSpecialValueText("α = 2r")
        self.lora_alpha.setToolTip("LoRA alpha (scaling; no effect on memory); 0 = twice the rank")
        form.addRow("Fine-tuning", _row(self.peft, self.lora_rank, self.lora_alpha))
        self.lora_targets = QLineEdit()
        self.lora_targets.setPlaceholderText("the model's usual ones (q_proj,v_proj) — or all-linear")
        self.lora_targets.setToolTip("Linear layers that get adapters: names (q_proj,v_proj,…) or all-linear; "
                                     "empty = the model's usual ones")
        form.addRow("LoRA targets", self.lora_targets)

        self.weights = QComboBox()
        for key, label in _WEIGHT_LABELS.items():
            self.weights.addItem(label, key)
        self.weights.setToolTip("Quantized frozen Linear weights (bitsandbytes 4-bit/8-bit, float8); the output "
                                "layer keeps its dtype. Training needs LoRA on top")
        form.addRow("Weights", self.weights)

        self.grad_accum = CheckedSpinBox("Grad accumulation")
        self.grad_accum.setRange(1, 4096)
        self.grad_accum.setToolTip("Micro-batches accumulated per optimizer step")
        form.addRow("Grad accumulation", self.grad_accum)

        self.target = QComboBox()
        self.target.setToolTip("The GPU the estimate is checked against")
        # this machine's GPU 0 when the catalogue knows it (engine.config.gpus asks NVML once); else no local target
        self._local: GpuSpec | None = local_gpu(0)
        self._fill_targets()
        form.addRow("Target", self.target)

        self.world_size = QSpinBox()
        self.world_size.setRange(1, 65536)
        self.world_size.setToolTip("GPUs the step runs on; the figures are per GPU")
        self.strategy = QComboBox()
        for st in STRATEGIES:
            self.strategy.addItem(st.upper() if st in ("ddp", "fsdp") else st.replace("-", " ").upper(), st)
        self.strategy.setToolTip("How the model state is split across the GPUs (DDP keeps a full copy on each)")
        self.tp = QSpinBox()
        self.tp.setRange(1, 1024)
        self.tp.setPrefix("TP ")
        self.tp.setToolTip("Tensor-parallel degree (divides the world size)")
        form.addRow("GPUs", _row(self.world_size, self.strategy, self.tp))

        self.alloc_conf = QLineEdit()
        self.alloc_conf.setPlaceholderText("e.g. expandable_segments:True")
        self.alloc_conf.setToolTip("PYTORCH_CUDA_ALLOC_CONF to model for the CUDA caching allocator")
        form.addRow("Alloc. conf", self.alloc_conf)
        self.full_trace = QCheckBox("trace every block")
        self.full_trace.setToolTip("Trace each of a stack's identical blocks (slower; the same figures): by default "
                                   "four are traced and the rest written out")
        self.fold_own_code = QCheckBox("fold my own code")
        self.fold_own_code.setToolTip("Fold a stack of blocks whose code is your own too (by default only a known "
                                      "library's, such as transformers', is folded, and your own model's code is "
                                      "traced in full, exact): faster, checked but not proven")
        form.addRow("Trace", _row(self.full_trace, self.fold_own_code))

        self.moe_routing = QComboBox()
        for routing in MOE_ROUTINGS:
            self.moe_routing.addItem(routing, routing)
        self.moe_routing.setToolTip("How a mixture-of-experts router spreads the tokens: evenly (balanced) or all "
                                    "to the same experts (worst); models without experts ignore it")
        form.addRow("MoE routing", self.moe_routing)

        self.message = QLabel()
        self.message.setObjectName("ConfigError")
        self.message.setWordWrap(True)
        self.message.hide()

        # The fields scroll when the dock is short, so the panel never sets the window's minimum height.
        fields = QWidget()
        inner = QVBoxLayout(fields)
        inner.setContentsMargins(8, 8, 8, 8)
        self._fields_layout = inner
        inner.addLayout(form)
        inner.addWidget(self.message)
        inner.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(fields)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        # Nor its minimum width: at its full width (its size hint, what the window opens with) nothing scrolls
        # sideways; a narrower window (a small screen, a tiled half) scrolls the fields rather than refusing to
        # shrink (the fields' full width made the window at least 1181 px wide).
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.setMinimumWidth(MIN_WIDTH)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(scroll)
        # The wheel scrolls the panel: a combo box or spin box under the pointer changes only once the user has
        # clicked or tabbed into it (else scrolling down to the Target silently changed the precision on the way).
        self._scroll = scroll
        for field in (*fields.findChildren(QComboBox), *fields.findChildren(QAbstractSpinBox)):
            field.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            field.installEventFilter(self)

        # Every field by name, with its name in an undo command's text ("Set batch size to 64"), in panel order.
        self._fields: dict[str, tuple[str, Field]] = {
            "batch": ("batch size", self.batch), "seq_len": ("sequence length", self.seq_len),
            "image_size": ("image size", self.image_size), "precision": ("precision", self.precision),
            "optimizer": ("optimizer", self.optimizer), "fused": ("fused optimizer", self.fused),
            "mode": ("mode", self.mode), "prompt_len": ("prompt length", self.prompt_len),
            "new_tokens": ("new tokens", self.new_tokens), "cache": ("generation cache", self.cache),
            "generate_program": ("generation program", self.generate_program),
            "do_sample": ("sampling", self.do_sample), "top_k": ("top-k", self.top_k), "top_p": ("top-p", self.top_p),
            "checkpointing": ("activation checkpointing", self.checkpointing),
            "compile": ("torch.compile", self.compile), "peft": ("fine-tuning", self.peft),
            "lora_rank": ("LoRA rank", self.lora_rank), "lora_alpha": ("LoRA alpha", self.lora_alpha),
            "lora_targets": ("LoRA targets", self.lora_targets), "weights": ("weights", self.weights),
            "grad_accum": ("gradient accumulation", self.grad_accum), "target": ("target", self.target),
            "world_size": ("GPUs", self.world_size), "strategy": ("GPUs' strategy", self.strategy),
            "tp": ("tensor parallelism", self.tp), "alloc_conf": ("allocator configuration", self.alloc_conf),
            "full_trace": ("trace every block", self.full_trace), "moe_routing": ("MoE routing", self.moe_routing),
            "fold_own_code": ("fold my own code", self.fold_own_code),
        }
        for name, (_label, field) in self._fields.items():
            _changed(field).connect(partial(self._field_edited, name))
        self._refusal = ""  # a refused keystroke's message: it stays until that field takes an edit
        for w in (self.batch, self.grad_accum):
            w.refused.connect(self._refuse)
            w.valueChanged.connect(self._forget_refusal)
        self.peft.currentIndexChanged.connect(self._mode_changed)
        self.generate_program.currentIndexChanged.connect(self._mode_changed)
        self.do_sample.toggled.connect(self._mode_changed)
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.world_size.valueChanged.connect(self._mode_changed)
        self._mode_changed()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt naming)
        """As wide as its widest row in any mode, hidden rows included (the generation row is the widest), so the
        dock the window opens with never scrolls sideways."""
        form = self._form
        labels, fields = 0, 0
        for r in range(form.rowCount()):
            label = form.itemAt(r, QFormLayout.ItemRole.LabelRole)
            field = form.itemAt(r, QFormLayout.ItemRole.FieldRole)
            label_widget = label.widget() if label is not None else None
            field_widget = field.widget() if field is not None else None
            if label_widget is not None:
                labels = max(labels, label_widget.sizeHint().width())
            if field_widget is not None:
                fields = max(fields, field_widget.sizeHint().width())
        m = self._fields_layout.contentsMargins()
        width = m.left() + labels + max(form.horizontalSpacing(), 0) + fields + m.right() + \
            self._scroll.verticalScrollBar().sizeHint().width()
        return QSize(width, super().sizeHint().height())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt naming)
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            QApplication.sendEvent(self._scroll.viewport(), event)
            return True
        if isinstance(watched, QAbstractSpinBox):  # what changes its value next is a step, not a typed digit
            kind = event.type()
            if kind in (QEvent.Type.Wheel, QEvent.Type.MouseButtonPress) or (
                    kind == QEvent.Type.KeyPress and isinstance(event, QKeyEvent) and event.key() in STEP_KEYS):
                self._stepping = True
            elif kind == QEvent.Type.KeyPress:
                self._stepping = False
        return super().eventFilter(watched, event)

    # ---- targets
    def _fill_targets(self) -> None:
        self.target.clear()
        local = self._local
        if local:
            self.target.addItem(f"Local GPU ({local.name})", LOCAL_TARGET)
        for name, total in catalogue_gpus():
            label = f"{name} — {format_bytes(total, 0)}" if total else name
            self.target.addItem(label, name)
        self.target.addItem("CPU (no GPU)", CPU_TARGET)
        i = self._default_target()
        if i >= 0:
            self.target.setCurrentIndex(i)

    def _default_target(self) -> int:
        """The sensible default target's index: this machine's GPU, else a common 80 GB card when the catalogue has
        one (-1: neither)."""
        if self._local:
            return self.target.findData(LOCAL_TARGET)
        for i in range(self.target.count()):
            if "A100" in self.target.itemText(i) and "80" in self.target.itemText(i):
                return i
        return -1

    def refresh_targets(self) -> None:
        """Re-read the GPU catalogue (it may appear after the window opened), keeping the selection."""
        keep = self.target.currentData()
        self._loading = True
        try:
            self._fill_targets()
            i = self.target.findData(keep)
            if i >= 0:
                self.target.setCurrentIndex(i)
        finally:
            self._loading = False
        self.loaded.emit()

    def target_gpu_bytes(self) -> int | None:
        """What a process can allocate on the target GPU (the card's total less the driver's reserve): the one
        figure the gauge, the fit verdict and the largest-batch search compare with, before and after the trace."""
        data = self.target.currentData()
        if data == LOCAL_TARGET:
            return self._local.usable_bytes if self._local else None
        spec = next((g for g in list_gpus() if g.name == data), None)  # the catalogue entry the item names
        return spec.usable_bytes if spec else None

    # ---- inputs
    def set_input_fields(self, *, seq_len: bool, image_size: bool) -> None:
        """Enable the input fields that apply to the current model (a sketch carries its own input)."""
        self.seq_len.setEnabled(seq_len)
        self.image_size.setEnabled(image_size)

    def _mode_changed(self) -> None:
        train = self.mode.currentData() == "train"
        for w in (self.optimizer, self.fused, self.checkpointing, self.grad_accum, self.peft):
            w.setEnabled(train)
        adapters = train and self.peft.currentData() is not None
        for field in (self.lora_rank, self.lora_alpha, self.lora_targets):
            field.setEnabled(adapters)
        # Shown only in generation mode: the other modes keep the panel as short as before.
        for row in (self._generation_row, self._program_row):
            self._form.setRowVisible(row, self.mode.currentData() == "generate")
        self.compile.setEnabled(self.mode.currentData() != "generate")  # generation is modelled eager only
        generate = self.generate_program.currentData() == "generate"  # the loop is greedy
        self.do_sample.setEnabled(generate)
        for limit in (self.top_k, self.top_p):
            limit.setEnabled(generate and self.do_sample.isChecked())
        self.strategy.setEnabled(self.world_size.value() > 1)  # one GPU: nothing to shard

    # ---- config
    def config(self) -> TrainConfig:
        """The TrainConfig the fields describe; raises UserError when the engine refuses it."""
        data = self.target.currentData()
        if data == CPU_TARGET:
            device, gpu = "cpu", None
        elif data == LOCAL_TARGET:
            device, gpu = "cuda", self._local.name if self._local else None
        else:
            device, gpu = "cuda", data
        world = self.world_size.value()
        return TrainConfig.from_options({
            "batch_size": self.batch.value(),
            "optimizer": self.optimizer.currentData(),
            "fused": self.fused.isChecked(),
            "precision": self.precision.currentData(),
            "mode": self.mode.currentData(),
            "checkpointing": self.checkpointing.isChecked(),
            "compile": self.compile.isChecked() and self.mode.currentData() != "generate",
            "grad_accum": self.grad_accum.value(),
            "device": device,
            "seq_len": (self.seq_len.value() or None) if self.seq_len.isEnabled() else None,
            "image_size": (self.image_size.value() or None) if self.image_size.isEnabled() else None,
            "gpu": gpu,
            "world_size": world,
            "strategy": self.strategy.currentData() if world > 1 else "ddp",
            "tp": self.tp.value(),
            "alloc_conf": self.alloc_conf.text().strip() or None,
            "moe_routing": self.moe_routing.currentData(),
            "peft": self.peft.currentData() if self.mode.currentData() == "train" else None,
            "lora_rank": self.lora_rank.value(),
            "lora_alpha": self.lora_alpha.value() or None,
            "lora_targets": self.lora_targets.text().strip() or None,
            "weights": self.weights.currentData(),
            "prompt_len": self.prompt_len.value() or None,
            "new_tokens": self.new_tokens.value(),
            "cache": self.cache.currentData(),
            "generate_program": self.generate_program.currentData(),
            "do_sample": self.do_sample.isChecked(),
            "top_k": self.top_k.value() or None,
            "top_p": self.top_p.value() or None,
            "full_trace": self.full_trace.isChecked(),
            "fold_own_code": self.fold_own_code.isChecked(),
        })

    def set_config(self, cfg: TrainConfig) -> None:
        """Show `cfg` without emitting (restoring settings or a file's config)."""
        self._loading = True
        try:
            self.batch.setValue(cfg.batch_size)
            self.seq_len.setValue(cfg.seq_len or 0)
            self.image_size.setValue(cfg.image_size or 0)
            for combo, value in ((self.precision, cfg.precision), (self.optimizer, cfg.optimizer),
                                 (self.mode, cfg.mode), (self.strategy, cfg.strategy),
                                 (self.moe_routing, cfg.moe_routing), (self.peft, cfg.peft),
                                 (self.weights, cfg.weights), (self.cache, cfg.cache),
                                 (self.generate_program, cfg.generate_program)):
                i = combo.findData(value)
                if i >= 0:
                    combo.setCurrentIndex(i)
            self.checkpointing.setChecked(cfg.checkpointing)
            self.compile.setChecked(cfg.compile)
            self.fused.setChecked(cfg.fused)
            self.grad_accum.setValue(cfg.grad_accum)
            self.world_size.setValue(cfg.world_size)
            self.tp.setValue(cfg.tp)
            self.alloc_conf.setText(cfg.alloc_conf or "")
            self.full_trace.setChecked(cfg.full_trace)
            self.fold_own_code.setChecked(cfg.fold_own_code)
            self.lora_rank.setValue(cfg.lora_rank)
            self.lora_alpha.setValue(cfg.lora_alpha or 0)
            self.lora_targets.setText(cfg.lora_targets or "")
            self.prompt_len.setValue(cfg.prompt_len or 0)
            self.new_tokens.setValue(cfg.new_tokens)
            self.do_sample.setChecked(cfg.do_sample)
            self.top_k.setValue(cfg.top_k or 0)
            self.top_p.setValue(cfg.top_p or 0.0)
            if cfg.device == "cpu":
                i = self.target.findData(CPU_TARGET)
            elif self._local and cfg.gpu == self._local.name:
                i = self.target.findData(LOCAL_TARGET)
            elif cfg.gpu is None:  # no GPU named: the default target, not whatever the panel showed before
                i = self._default_target()
            else:
                i = self.target.findData(cfg.gpu)
            if i >= 0:
                self.target.setCurrentIndex(i)
        finally:
            self._loading = False
        self._timer.stop()
        self._mode_changed()
        self.loaded.emit()

    # ---- fields, by name (the undo history's view of the panel)
    def fields(self) -> dict[str, Field]:
        """Every field, by name, in panel order."""
        return {name: field for name, (_label, field) in self._fields.items()}

    def field_label(self, name: str) -> str:
        """What an undo command calls the field ("batch size")."""
        return self._fields[name][0]

    def field_value(self, name: str) -> FieldValue:
        field = self._fields[name][1]
        if isinstance(field, QCheckBox):
            return field.isChecked()
        if isinstance(field, QComboBox):
            data: FieldValue = field.currentData()
            return data
        if isinstance(field, QLineEdit):
            return field.text()
        return field.value()

    def restore_field(self, name: str, value: FieldValue) -> None:
        """Show `value` in the field (an undo or a redo): the estimate follows as after the user's own edit (the
        debounce, then the engine), but no edit is announced."""
        field = self._fields[name][1]
        self._restoring = True
        try:
            if isinstance(field, QCheckBox):
                field.setChecked(bool(value))
            elif isinstance(field, QComboBox):
                i = field.findData(value)
                if i >= 0:
                    field.setCurrentIndex(i)
            elif isinstance(field, QLineEdit):
                field.setText(str(value or ""))
            elif isinstance(field, QSpinBox):
                field.setValue(int(value or 0))
            else:
                field.setValue(float(value or 0.0))
        finally:
            self._restoring = False

    def _field_edited(self, name: str, *_args: object) -> None:
        if not self._loading and not self._restoring:
            self.fieldEdited.emit(name, self._stepping)
        self._schedule()

    def _schedule(self, *_args: object) -> None:
        if not self._loading:
            # restarts: only the last edit of a burst goes out
            self._timer.start(STEP_DEBOUNCE_MS if self._stepping else DEBOUNCE_MS)
        self._stepping = False

    def flush(self) -> None:
        """Emit now if an edit is waiting (e.g. before a profile run)."""
        if self._timer.isActive():
            self._timer.stop()
            self._emit_now()

    def _emit_now(self) -> None:
        try:
            cfg = self.config()
        except UserError as e:
            self._show_error(str(e))
            return
        self._show_error(self._refusal)  # the edit went out; a keystroke refused after it is still said
        self.configChanged.emit(cfg)

    def _refuse(self, text: str) -> None:
        self._refusal = text
        self._show_error(text)

    def _forget_refusal(self) -> None:
        self._refusal = ""

    def _show_error(self, text: str) -> None:
        text = in_panel_terms(text)
        self.message.setText(text)
        self.message.setVisible(bool(text))
        self.errorChanged.emit(text)
