"""The training configuration a user sets (batch, precision, optimizer, …) and its validation."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..core.errors import UserError
from ..core.limits import MAX_CONFIG
from .gpus import find_gpu
from .optimizers import OPTIMIZER_TABLE

if TYPE_CHECKING:
    from .gpus import GpuSpec

OPTIMIZERS = tuple(OPTIMIZER_TABLE)
Precision = Literal["fp32", "fp16", "bf16", "amp-fp16", "amp-bf16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
Mode = Literal["train", "inference", "generate"]
MODES: tuple[Mode, ...] = get_args(Mode)
GenerateProgram = Literal["generate", "loop"]  # model.generate(), or a hand-written prefill-then-decode loop
GENERATE_PROGRAMS: tuple[GenerateProgram, ...] = get_args(GenerateProgram)
KvCache = Literal["dynamic", "static"]  # the KV cache of generation: transformers' DynamicCache or StaticCache
CACHES: tuple[KvCache, ...] = get_args(KvCache)
MoeRouting = Literal["balanced", "worst"]  # how a mixture-of-experts router spreads tokens (engine.models.moe_routing)
MOE_ROUTINGS: tuple[MoeRouting, ...] = get_args(MoeRouting)
Device = Literal["cuda", "cpu"]
DEVICES: tuple[Device, ...] = get_args(Device)
Strategy = Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
PeftMethod = Literal["lora", "qlora"]
PEFT_METHODS: tuple[PeftMethod, ...] = get_args(PeftMethod)
WeightFormat = Literal["nf4", "fp4", "int8", "fp8"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = get_args(WeightFormat)
# torch.compile's modes; only the default one is modelled (engine.trace.compiled_step), the others are refused by name
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE_UNMODELLED = {
    "reduce-overhead": "its CUDA graphs keep a private memory pool",
    "max-autotune": "its autotuned kernels and CUDA graphs choose buffers by timing",
    "max-autotune-no-cudagraphs": "its autotuned kernels choose buffers by timing",
}


MAX_LORA = 1 << 20  # a LoRA rank or alpha: far beyond any adapter (ranks are 4 to 256), far below an overflow

def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value in allowed:
        return value
    close = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"unknown {what} '{value}'{hint}; choose one of: {', '.join(allowed)}")


_LABELS = {
    "batch_size": "batch size",
    "grad_accum": "gradient accumulation steps",
    "world_size": "world size",
    "tp": "tensor-parallel degree",
    "seq_len": "seq len",
    "image_size": "image size",
    "prompt_len": "prompt length",
    "new_tokens": "new tokens",
}


def _short(v: object) -> str:
    """A value for a message: a 5,000-digit number is shown by its length, not pasted in."""
    if isinstance(v, int) and v.bit_length() > 200:  # str() of a 5,000-digit int raises in Python ≥ 3.11
        return f"a number of about {int(v.bit_length() * 0.30103) + 1} digits"
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class TrainConfig:
    """What is measured: one training step (or inference pass) of a model under these settings."""

    batch_size: int = 1
    optimizer: str = "adam"
    precision: Precision = "fp32"
    mode: Mode = "train"
    checkpointing: bool = False
    grad_accum: int = 1
    device: Device = "cuda"
    seq_len: int | None = None
    image_size: int | None = None
    fused: bool = False
    gpu: str | None = None
    world_size: int = 1
    strategy: Strategy = "ddp"
    tp: int = 1
    alloc_conf: str | None = None
    # Generation (mode "generate"): a prompt of prompt_len tokens (default: seq_len, else the model's default),
    # then new_tokens decode steps with the model's own KV cache.
    prompt_len: int | None = None
    new_tokens: int = 128
    cache: KvCache = "dynamic"
    generate_program: GenerateProgram = "generate"  # engine.trace.generate_program, or engine.trace.text_generation's
    # loop
    do_sample: bool = False  # generate() samples (top_k / top_p: None: the generation config's); the loop is greedy
    top_k: int | None = None
    top_p: float | None = None
    moe_routing: MoeRouting = "balanced"
    peft: PeftMethod | None = None  # frozen base, trained low-rank adapters (engine.finetune.adapters)
    lora_rank: int = 16
    lora_alpha: int | None = None  # None: twice the rank
    lora_targets: str | None = None  # comma-separated Linear names or "all-linear"; None: the model's default
    weights: WeightFormat | None = None  # the frozen Linear weights quantized (engine.finetune.quantized)
    # The step as torch.compile(model) runs it (inductor, default mode): engine.trace.compiled_step. A mode's name
    # (COMPILE_MODES, as torch.compile's mode=) is taken too: "default" is True, the others are refused.
    compile: bool = False
    full_trace: bool = False  # trace every block of a repeated stack (default: fold them, engine.trace.folded_trace)
    # fold a stack whose code is the user's own too (default: only a known library's or this project's code folds;
    # the user's is traced in full, exact: engine.trace.fold_known)
    fold_own_code: bool = False

    def __post_init__(self) -> None:
        for name, v in (("batch_size", self.batch_size), ("grad_accum", self.grad_accum),
                        ("world_size", self.world_size), ("tp", self.tp), ("seq_len", self.seq_len),
                        ("image_size", self.image_size), ("prompt_len", self.prompt_len),
                        ("new_tokens", self.new_tokens)):
            if v is None and name in ("seq_len", "image_size", "prompt_len"):
                continue
            label = _LABELS[name]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise UserError(f"{label} must be a positive whole number, got {_short(v)}")
            if v > MAX_CONFIG[name]:
                raise UserError(f"{label} {_short(v)} is too large (at most {MAX_CONFIG[name]:,})")
        _choice(self.optimizer, OPTIMIZERS, "optimizer")
        _choice(self.precision, PRECISIONS, "precision")
        _choice(self.mode, MODES, "mode")
        _choice(self.device, DEVICES, "device")
        _choice(self.strategy, STRATEGIES, "strategy")
        _choice(self.cache, CACHES, "KV cache")
        _choice(self.generate_program, GENERATE_PROGRAMS, "generation program")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)
                                       or self.top_k < 0):
            raise UserError(f"top-k must be a whole number ≥ 0, got {_short(self.top_k)}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):
            raise UserError(f"top-p must be a number in (0, 1], got {_short(self.top_p)}")
        _choice(self.moe_routing, MOE_ROUTINGS, "MoE routing")
        compile_as: object = self.compile
        if isinstance(compile_as, str):
            compile_mode = _choice(compile_as, COMPILE_MODES, "torch.compile mode")
            if compile_mode != "default":
                raise UserError(f"torch.compile mode '{compile_mode}' is not modelled "
                                f"({_COMPILE_UNMODELLED[compile_mode]}); only the default mode is")
            object.__setattr__(self, "compile", True)
        elif not isinstance(compile_as, bool):
            raise UserError(f"compile must be true, false or a torch.compile mode, got {_short(compile_as)}")
        if self.compile and self.generating:
            raise UserError("--compile models a training step or an inference pass; generation under "
                            "torch.compile is not modelled: use --mode train or inference, or drop --compile")
        if self.world_size == 1 and self.strategy != "ddp":
            raise UserError(f"strategy '{self.strategy}' shards across GPUs: give --world-size N (N > 1)")
        if self.peft is not None:
            _choice(self.peft, PEFT_METHODS, "PEFT method")
            if not self.training:
                raise UserError(f"--peft {self.peft} trains adapters: use --mode train")
        if self.weights is not None:
            _choice(self.weights, WEIGHT_FORMATS, "weight format")
            if self.training and self.peft is None:
                raise UserError(f"quantized weights ({self.weights}) are frozen: train them with --peft lora, "
                                "or use --mode inference")
        if not isinstance(self.lora_rank, int) or not 0 < self.lora_rank <= MAX_LORA:
            raise UserError(f"LoRA rank must be a whole number from 1 to {MAX_LORA:,}, got "
                            f"{_short(self.lora_rank)}")
        alpha = self.lora_alpha
        if alpha is not None and (not isinstance(alpha, int) or not 0 < alpha <= MAX_LORA):
            raise UserError(f"LoRA alpha must be a whole number from 1 to {MAX_LORA:,}, got "
                            f"{_short(self.lora_alpha)}")
        if self.lora_targets is not None and self.lora_targets.strip() and \
                not [t for t in self.lora_targets.split(",") if t.strip()]:
            raise UserError(f"LoRA targets {self.lora_targets!r} name no layer; give Linear names (q_proj,v_proj) "
                            "or all-linear")
        if not self.training:
            # A step that trains nothing accumulates, checkpoints and fuses nothing: the app's panel keeps these
            # fields (greyed) when its mode changes, and a file saved then carries them; they must not reach the
            # notes, the report or the JSON of an inference pass. (The CLI refuses them when asked for.)
            for name, off in (("grad_accum", 1), ("checkpointing", False), ("fused", False)):
                object.__setattr__(self, name, off)
        if self.world_size % self.tp:
            raise UserError(f"world size {self.world_size} is not a multiple of the tensor-parallel degree {self.tp}")
        # The GPU as typed ('h100', 'RTX 4090', 'NVIDIA H200') resolved here, once, to its catalogue entry
        # (UserError naming --gpu when unknown): `gpu` keeps the canonical name, `gpu_spec` the entry.
        spec = self.gpu_spec
        object.__setattr__(self, "gpu", spec.name if spec is not None else None)

    def size_hint(self) -> str:
        """The settings that make tensors big, with their values: what a "too large" error asks to lower."""
        parts = [f"the batch size ({self.batch_size})"]
        if self.seq_len is not None:
            parts.append(f"the sequence length ({self.seq_len})")
        if self.image_size is not None:
            parts.append(f"the image size ({self.image_size})")
        return " or ".join(parts) + " or the model's sizes"

    @property
    def amp(self) -> bool:
        return self.precision.startswith("amp-")

    @property
    def training(self) -> bool:
        return self.mode == "train"

    @property
    def generating(self) -> bool:
        return self.mode == "generate"

    @property
    def program(self) -> str:
        """The program modelled: "compiled" (torch.compile(model), inductor: engine.trace.compiled_step) or "eager"."""
        return "compiled" if self.compile else "eager"

    def describe_program(self) -> str:
        """`program` in words, for the CLI's summary, the report and the app."""
        return "compiled (torch.compile, inductor, default mode)" if self.compile else "eager"

    @cached_property
    def gpu_spec(self) -> GpuSpec | None:
        """The catalogue's entry for `gpu` (None when no GPU is named), resolved when the configuration is built:
        every figure that depends on the GPU reads it here, nothing looks the name up again."""
        if not self.gpu:
            return None
        return find_gpu(str(self.gpu))

    @property
    def weight_format(self) -> str | None:
        """The quantized format of the frozen Linear weights: --weights, or nf4 for QLoRA."""
        if self.weights is not None:
            return self.weights
        return "nf4" if self.peft == "qlora" else None

    def with_(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> TrainConfig:
        """The one way a configuration is built from what a user set: the CLI's parsed options, the app's
        configuration panel, a saved JSON. Keys are the field names; other keys are ignored, missing fields
        keep their defaults, and the values are validated here (UserError naming the field)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in known})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainConfig:
        return cls.from_options(data)
