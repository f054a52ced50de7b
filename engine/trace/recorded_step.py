"""One training step run under a StorageRecorder, and what the recording means.

Owns the model's bookkeeping (ModelInfo: parameter counts, module types, storage roles and owners), the step
run with every parameter, buffer, input, gradient and optimizer state given its role (record_step), and the
categorisation of a raw event log into a Trace (categorize, to_trace). The tracer (fake tensors), the CPU
profiler and the CUDA profiler all build on it; it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ..config.gpus import is_this_machines_gpu
from ..config.optimizers import EIGHT_BIT_OPTIMIZERS, OPTIMIZER_TABLE
from ..config.train_config import TrainConfig
from ..core.bookkeeping import bookkeeping
from ..core.errors import Cancelled
from ..core.hook_reach import hooks_reach
from ..finetune.adapters import is_adapter, keep_adapters_fp32
from ..finetune.quantized import QuantizedWeights, decomposition
from ..results.estimate_fields import KernelFigures, Method, TraceFold, TraceSource
from ..results.types import Category, MemEvent, Trace
from .checkpointing import apply_checkpointing
from .fold_plan import FoldPlan
from .folded_optimizer import OptimizerFold
from .folded_trace import DepthFold
from .recorder import ModuleScopes, RawEvent, RecordingMode, StorageRecorder
from .step import DTYPES, cast_inputs, run_steps
from .step_replay import StepReplay
from .transforms import Transformed, apply_transforms

if TYPE_CHECKING:
    from ..cuda.kernels import KernelCost, KernelModel
    from ..models.source import ModelSource


@dataclass
class ModelInfo:
    name: str
    parameters: int
    trainable_parameters: int
    module_types: dict[str, str]
    module_params: dict[str, int]  # own (non-recursive) parameter counts
    storage_roles: dict[int, str]  # storage key -> parameters|buffers|gradients|optimizer_state|inputs
    storage_owner: dict[int, str]  # storage key -> owning module for parameter/gradient/optimizer storages
    checkpointed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    modelled: list[str] = field(default_factory=list)  # figures that rest on a model of a library, not a run
    method: Method = "fake"
    cuda_kernels: KernelFigures | None = None  # a CUDA target: what its kernels were costed from
    fold: TraceFold | None = None  # whether the repeated blocks were folded, and why


def model_info(name: str, model: nn.Module, transformed: Transformed | None = None) -> ModelInfo:
    """Parameter counts and module types of `model`; storage roles are filled in by record_step.
    `transformed`: what engine.trace.transforms did to the model (quantized, adapters)."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    info = ModelInfo(
        name=name,
        parameters=total,
        trainable_parameters=trainable,
        module_types={n: type(m).__name__ for n, m in model.named_modules()},
        module_params={n: _own_parameters(m) for n, m in model.named_modules()},
        storage_roles={},
        storage_owner={},
    )
    if transformed is not None:  # packed weights hold two 4-bit values per byte: count the base before packing
        info.parameters = transformed.base_parameters + transformed.adapter_parameters
        info.notes.extend(transformed.notes)
        info.modelled.extend(transformed.modelled)
    return info


def _own_parameters(m: nn.Module) -> int:
    """A module's own parameter count; a quantized Linear's is its weight's logical size, not its packed bytes."""
    if isinstance(m, QuantizedWeights):
        return m.in_features * m.out_features + (m.bias.numel() if m.bias is not None else 0)
    return sum(p.numel() for p in m.parameters(recurse=False))


def build_real(source: ModelSource | str, cfg: TrainConfig) -> tuple[nn.Module, Any, ModelInfo]:
    """(model, inputs, info) built for real on the CPU, checkpointed and cast as cfg asks."""
    if isinstance(source, str):
        from ..models.sources import resolve_source

        source = resolve_source(source)
    model, inputs = source.build(cfg)
    info = model_info(source.name, model, apply_transforms(model, cfg))
    if cfg.checkpointing and cfg.training:
        info.checkpointed = apply_checkpointing(model)
    if cfg.precision in ("fp16", "bf16"):
        model.to(DTYPES[cfg.precision])
        keep_adapters_fp32(model)
        inputs = cast_inputs(inputs, DTYPES[cfg.precision])
    return model, inputs, info


def flat_tensors(x: object) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) dict/tuple/list of inputs."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from flat_tensors(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from flat_tensors(v)


def track_model_state(model: nn.Module, rec: StorageRecorder, info: ModelInfo) -> dict[int, str]:
    """The model's parameters and buffers tracked with their roles and owning modules (info's storage roles and
    owners); returns id(parameter) → its owning module (a tied weight belongs to its first module)."""
    roles, owner = info.storage_roles, info.storage_owner
    param_owner: dict[int, str] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            k = rec.track(p, "parameter")
            roles[k] = "adapter_weights" if is_adapter(f"{mname}.{pname}") else "parameters"
            owner.setdefault(k, mname)
            param_owner.setdefault(id(p), mname)
        quant_state = isinstance(mod, QuantizedWeights)  # a quantized weight's scales are part of the weight
        for b in mod.buffers(recurse=False):
            k = rec.track(b, "quantization state" if quant_state else "buffer")
            roles.setdefault(k, "parameters" if quant_state else "buffers")
            owner.setdefault(k, mname)
    return param_owner


def track_gradient(p: torch.Tensor, rec: StorageRecorder, info: ModelInfo, param_owner: dict[int, str]) -> None:
    """`p`'s gradient, when it has one, tracked as a gradient owned by `p`'s module (param_owner:
    track_model_state's map)."""
    if p.grad is not None:
        k = rec.track(p.grad, "grad")
        info.storage_roles[k] = "gradients"
        info.storage_owner[k] = param_owner.get(id(p), "")


def record_step(model: nn.Module, inputs: Any, cfg: TrainConfig, rec: StorageRecorder, info: ModelInfo,
                mode_ctx: AbstractContextManager[Any], probe: bool = False, micro_steps: int | None = None,
                fold: FoldPlan | None = None, copy_second_step: bool = True) -> None:
    """Runs the steps under the recorder; fills info's storage roles. `fold`: the stack of repeated blocks traced
    at a few blocks' depth and written out for all (engine.trace.folded_trace; FoldDeclined when it cannot be).
    `copy_second_step`: may the second step's forward and backward be copied from the first
    (engine.trace.step_replay; not for the user's own code: engine.trace.tracer)."""
    roles, owner = info.storage_roles, info.storage_owner
    steps = cfg.training and OPTIMIZER_TABLE[cfg.optimizer].torch_class is not None and \
        any(p.requires_grad for p in model.parameters())  # an optimizer step, which zero_grad ends
    folding = DepthFold(fold, rec, virtual_grads=steps) if fold is not None else None
    opt_fold = OptimizerFold(folding) if folding is not None and steps else None
    param_owner = track_model_state(model, rec, info)
    for t in flat_tensors(inputs):
        roles.setdefault(rec.track(t, "input"), "inputs")
    if isinstance(mode_ctx, FakeTensorMode):
        _track_held(model, rec, mode_ctx)
    params = [p for p in model.parameters() if p.requires_grad]

    replay = StepReplay(rec, roles, model, folding.virtual if folding is not None else None,
                        folding.idle_modules() if folding is not None else None) \
        if isinstance(mode_ctx, FakeTensorMode) and REPLAY_STEPS and copy_second_step else None

    def set_phase(step: int, phase: str) -> None:
        if rec.cancel is not None and rec.cancel.is_set():
            raise Cancelled()
        rec.step, rec.phase = step, phase
        if phase != "backward":
            rec.module_stack.clear()
        if replay is not None and phase == "forward":
            replay.step_starts(step)
        if folding is not None and phase == "forward":
            folding.open()

    def after_backward() -> None:
        with bookkeeping():
            if folding is not None:
                folding.close()
            if replay is not None:
                replay.grads_seen(params)
            for p in params:
                track_gradient(p, rec, info, param_owner)
            if folding is not None:
                for k, p in folding.virtual_params():
                    roles[k] = "gradients"
                    owner[k] = param_owner.get(id(p), "")

    def after_optimizer(opt: torch.optim.Optimizer) -> None:
        with bookkeeping():
            for p, state in opt.state.items():
                for name, v in state.items():
                    if isinstance(v, torch.Tensor):
                        if cuda_kernels is not None and name == "step" and v.dim() == 0 and not rec.tracks(v):
                            continue  # a CPU tensor on a CUDA run (engine.trace.recorder: the step counter)
                        k = rec.track(v, "optimizer_state")
                        roles[k] = "optimizer_state"
                        owner[k] = param_owner.get(id(p), "")
            if opt_fold is not None:
                opt_fold.copy_roles(roles, owner)

    fake = mode_ctx if isinstance(mode_ctx, FakeTensorMode) else None
    recording, kernels, cuda_kernels = recording_modes(cfg, rec, fake, probe)

    def on_cache(cache: Any) -> None:  # transformers' DynamicCache / StaticCache
        from .text_generation import cache_tensors

        for t in cache_tensors(cache):
            roles[rec.track(t, "kv_cache")] = "kv_cache"

    def fast_forward(grow: Callable[[], Sequence[torch.Tensor]]) -> None:
        rec.pause()
        kept = grow()
        rec.resume("(decode steps skipped: the KV cache and the ids grown)")
        for t in kept:  # what the skipped steps leave alive, allocated after the frees they did
            rec.track(t)

    with mode_ctx, ModuleScopes(model, rec), recording, kernels, rec.autocast_exits_in_allocation_order():
        copy_step = _replayed(replay, after_backward, set_phase, folding) if replay is not None else None
        try:
            opt = run_steps(model, inputs, cfg, set_phase, after_backward, after_optimizer, replay=copy_step,
                            micro_steps=micro_steps, on_cache=on_cache,
                            fast_forward=fast_forward if fake is not None else None,
                            optimizer_window=opt_fold.window if opt_fold is not None else None)
            if folding is not None:
                folding.close()  # an inference pass's last forward
        finally:
            if folding is not None:
                folding.restore()
        rec.closed = True
    del opt
    if cuda_kernels is not None:
        info.cuda_kernels = kernel_summary(rec.kernel_costs, cuda_kernels)


def _track_held(model: nn.Module, rec: StorageRecorder, fm: FakeTensorMode) -> None:
    """A tensor the model's callables hold (a hook's mask, a global it reads) was there before the step and is not
    the model's: followed at 0 bytes, so that a view of it (`mask[:n]`) is no allocation of its whole storage. A real
    one is followed as the fake tensor the mode converts it to (the converter keeps one per tensor)."""
    for t in hooks_reach(model).tensors:
        held = t if isinstance(t, FakeTensor) else fm.fake_tensor_converter.from_real_tensor(fm, t)
        if not rec.tracks(held):
            rec.track(held, "held by the model's hooks", nbytes=0)


def recording_modes(cfg: TrainConfig, rec: StorageRecorder, fake: FakeTensorMode | None, probe: bool,
                    mode: type[RecordingMode] = RecordingMode
                    ) -> tuple[RecordingMode, AbstractContextManager[Any], KernelModel | None]:
    """What records a step for `cfg`'s target: the recording mode (a `mode`), the CUDA kernel choices to enter with
    it, and the CUDA kernels' cost model (None for a CPU target or real tensors). Shared by record_step and a user's
    own step (engine.trace.user_step)."""
    kernels: AbstractContextManager[Any] = nullcontext()
    cuda_kernels: KernelModel | None = None
    if cfg.device == "cuda" and fake is not None:
        from ..cuda.gpu_profile import profile_for
        from ..cuda.kernels import KernelModel
        from ..cuda.target import CudaKernelChoices, compute_capability

        cc = compute_capability(cfg.gpu_spec)
        kernels = CudaKernelChoices(cc, costs=rec.kernel_costs)
        cuda_kernels = KernelModel(cc, profile_for(cfg.gpu), live=is_this_machines_gpu(cfg.gpu_spec),
                                   gpu=cfg.gpu_spec)
    decompose = None
    if fake is not None and (cfg.weight_format in ("nf4", "fp4", "int8")
                             or (cfg.training and cfg.optimizer in EIGHT_BIT_OPTIMIZERS)):
        decompose = decomposition(cfg.device == "cuda")
    recording = mode(rec, probe_cpu_kernels=probe, fake=fake, cuda_kernels=cuda_kernels, decompose=decompose)
    return recording, kernels, cuda_kernels


def kernel_summary(costs: list[KernelCost], model: KernelModel) -> KernelFigures:
    """What the CUDA kernels' scratch was costed from: measured calls and modelled ones, with the modelled range.

    Only one kernel's scratch is alive at a time, so the largest gap between a call's figure and its bounds is
    how far the peak can move."""
    measured = [c for c in costs if c.measured]
    modelled = [c for c in costs if not c.measured]
    return KernelFigures(
        profile=model.profile.gpu_name if model.profile is not None else None,
        live=model.live,
        profile_path=model.profile.path if model.profile is not None else None,
        measured_calls=len(measured),
        modelled_calls=len(modelled),
        largest_measured_bytes=max((c.scratch for c in measured), default=0),
        largest_modelled_bytes=max((c.scratch for c in modelled), default=0),
        up_bytes=max((c.high - c.scratch for c in costs), default=0),
        down_bytes=max((c.scratch - c.low for c in costs), default=0),
    )


FORWARD_PHASES = ("forward", "prefill", "decode")  # generation's forwards are forwards too
REPLAY_STEPS = True  # the second step's forward/backward copied from the first (engine.trace.step_replay)


def _replayed(replay: StepReplay, after_backward: Callable[[], None],
              set_phase: Callable[[int, str], None], folding: DepthFold | None) -> Callable[[int], bool]:
    """run_steps' `replay`: the step's phase marks and gradient roles around StepReplay's copy."""

    def run(step: int) -> bool:
        set_phase(step, "forward")  # cancellation is checked here too
        if not replay(step):
            return False
        if folding is not None:
            folding.discard()  # the copy is of a window already written out for every block
        after_backward()
        return True

    return run


_BY_ROLE = {c.value: c for c in Category}  # a storage role's category (Category(role), without the enum's lookup)


def categorize(raw: Sequence[RawEvent], roles: Mapping[int, str], training: bool) -> dict[int, Category]:
    """Category of every storage: its role if it has one, else by when it was allocated and freed.

    A forward allocation still alive when its forward ends is an activation (saved for backward);
    everything else without a role is a temporary.
    """
    alloc: dict[int, tuple[int, str]] = {}
    freed: dict[int, tuple[int, str]] = {}
    first = alloc.setdefault
    for k, n, step, phase, _m, _op in raw:
        if n >= 0:
            first(k, (step, phase))
        else:
            freed[k] = (step, phase)
    cats = {}
    for key, (step, phase) in alloc.items():
        role = roles.get(key)
        if role:
            cats[key] = _BY_ROLE[role]
        elif phase in FORWARD_PHASES and (not training or freed.get(key, (None, None)) != (step, "forward")):
            cats[key] = Category.ACTIVATIONS
        else:
            cats[key] = Category.TEMPORARIES
    return cats


def mem_events(raw: Sequence[RawEvent], category_of: Callable[[int], Category]) -> tuple[MemEvent, ...]:
    """The recorded events, numbered and categorised (category_of: storage key -> its category)."""
    new = tuple.__new__  # (MemEvent's own __new__, without its keyword handling: one C call per event)
    return tuple([new(MemEvent, (i, k, n, category_of(k), st, ph, m, op))
                  for i, (k, n, st, ph, m, op) in enumerate(raw)])


def to_trace(raw: Sequence[RawEvent], roles: Mapping[int, str], cfg: TrainConfig, source: TraceSource) -> Trace:
    cats = categorize(raw, roles, cfg.training)
    return Trace(events=mem_events(raw, cats.__getitem__), source=source, device=cfg.device)
