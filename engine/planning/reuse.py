"""A planner candidate that changes only the optimizer, answered from the step already traced.

A different optimizer (SGD with momentum, 8-bit AdamW, a fused step) allocates differently only in the optimizer
phases: the forward and backward of the step are the same ops on the same tensors, whatever updates the weights
afterwards. So the traced step's events are kept and only its two optimizer phases are traced again, on the
model's fake parameters with gradients of the sizes the backward left: each of the new optimizer's phases takes
the place of the old one's, its gradient frees mapped onto the traced gradients. The result is the trace a
fresh estimate records (tests/test_planner_reuse.py compares every figure, event by event). Where that cannot
be shown from the trace (fp16 AMP's GradScaler unscales in the optimizer phase, a real run's measurement, the
gradients not what the parameters give, kernel scratch costed in the optimizer step) it declines (None), and the
planner traces the candidate in full.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from ..config.optimizers import OPTIMIZER_TABLE
from ..config.train_config import TrainConfig
from ..core.errors import Cancelled
from ..core.gc_scope import older_objects_set_aside
from ..core.progress import CancelToken, Progress
from ..results.types import Category, Estimate, MemEvent, Trace

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..models.source import ModelSource
    from ..trace.folded_trace import DepthFold
    from ..trace.recorded_step import ModelInfo
    from ..trace.recorder import RawEvent, StorageRecorder

# the configuration fields an optimizer-only candidate may change
OPTIMIZER_FIELDS = ("optimizer", "fused")
NOTE = "forward and backward reused from the traced step; the optimizer step traced for this optimizer"


@dataclass(frozen=True)
class TracedStep:
    """A traced step kept for the planner: its events, the model's bookkeeping, and the configuration traced (its
    target GPU resolved)."""

    trace: Trace
    info: ModelInfo
    cfg: TrainConfig
    origin: str  # where the target GPU came from (engine.planning.estimator.with_target_gpu)
    # with_optimizer's answers from this step, by configuration: the app's quick plan and then its full plan of the
    # same step (engine.jobs.calls.kept_step) ask for the same optimizer swaps
    swapped: dict[TrainConfig, Estimate | None] = field(default_factory=dict, compare=False, repr=False)


def traced_step(source: ModelSource, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                progress: Progress | None = None) -> tuple[Estimate, TracedStep]:
    """engine.planning.estimator.estimate's answer, with the trace it came from kept."""
    from .estimator import traced_estimate

    est, trace, info, cfg, origin = traced_estimate(source, cfg, cancel=cancel, progress=progress)
    return est, TracedStep(trace, info, cfg, origin)


def swappable(base: TracedStep, new_cfg: TrainConfig) -> bool:
    """Whether `new_cfg` differs from the traced step only in its optimizer, in a way this module reproduces."""
    old = base.cfg
    same = {f.name: getattr(old, f.name) for f in fields(TrainConfig) if f.name in OPTIMIZER_FIELDS}
    if replace(new_cfg, **same, gpu=old.gpu) != old:
        return False
    return (old.training and old.precision != "amp-fp16" and old.world_size == 1 and old.tp == 1
            and base.info.method == "fake" and base.trace.source == "tracer"
            and OPTIMIZER_TABLE[old.optimizer].torch_class is not None
            and OPTIMIZER_TABLE[new_cfg.optimizer].torch_class is not None)


def with_optimizer(source: ModelSource, base: TracedStep, new_cfg: TrainConfig,
                   cancel: CancelToken | None = None) -> Estimate | None:
    """The estimate of `new_cfg` (`base`'s step with another optimizer), from `base`'s forward and backward and a
    trace of the new optimizer's two steps; None where that would not be the fresh trace's answer. Each answer is
    kept on `base` (an Estimate is immutable): asked again, it is not traced again."""
    if new_cfg in base.swapped:
        return base.swapped[new_cfg]
    with older_objects_set_aside():  # its full garbage collections walk only what it makes (engine.core.gc_scope)
        est = _with_optimizer(source, base, new_cfg, cancel)
    base.swapped[new_cfg] = est
    return est


def _with_optimizer(source: ModelSource, base: TracedStep, new_cfg: TrainConfig,
                    cancel: CancelToken | None) -> Estimate | None:
    from .estimator import estimate_of_trace, with_target_gpu

    new_cfg, origin = with_target_gpu(new_cfg)
    if not swappable(base, new_cfg):
        return None
    t0 = time.perf_counter()
    recorded = _optimizer_phases(source, new_cfg, cancel)
    if recorded is None:
        return None
    raw, roles, owners, modelled = recorded
    _check(cancel)  # the splice and the allocator's replay below check no token themselves
    spliced = _splice(base, raw, roles)
    if spliced is None:
        return None
    events, key_of = spliced
    info = base.info
    kept_roles = {k: r for k, r in info.storage_roles.items() if r != "optimizer_state"}
    kept_owner = {k: o for k, o in info.storage_owner.items() if info.storage_roles.get(k) != "optimizer_state"}
    for k, role in roles.items():
        if role == "optimizer_state":
            if k not in key_of:
                return None  # state made before the optimizer was (a parameter's own storage, say): not placed
            kept_roles[key_of[k]] = role
            kept_owner[key_of[k]] = owners.get(k, "")
    new_info = replace(info, storage_roles=kept_roles, storage_owner=kept_owner, notes=[*info.notes, NOTE],
                       checkpointed=list(info.checkpointed), modelled=modelled,
                       module_types=dict(info.module_types), module_params=dict(info.module_params),
                       cuda_kernels=info.cuda_kernels)
    trace = Trace(events=events, source=base.trace.source, device=base.trace.device)
    _check(cancel)
    return estimate_of_trace(trace, new_info, new_cfg, origin=origin, t0=t0)


def _check(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def _optimizer_phases(source: ModelSource, cfg: TrainConfig, cancel: CancelToken | None, fold: bool = True
                      ) -> tuple[list[RawEvent], dict[int, str], dict[int, str], list[str]] | None:
    """What the optimizer of `cfg`'s step allocates, recorded as record_step records it: (raw events of its
    construction ("setup": bitsandbytes' quantization maps) and of its two steps ("optimizer"), with the
    gradients made before each step ("backward"), storage roles, owners of the optimizer state, the figures
    that rest on a model of a library (ModelInfo.modelled)). Each gradient is
    made as the backward leaves it (the size, strides and dtype of its parameter). `fold`: where the model's stack
    folds (engine.trace.fold_plan), the steps run over the traced blocks' parameters and are written out for the
    rest, as a folded trace's are (engine.trace.folded_optimizer; traced in full where that declines)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..trace.fold_plan import FoldDeclined, FoldPlan, plan_fold
    from ..trace.folded_optimizer import OptimizerFold
    from ..trace.folded_trace import DepthFold
    from ..trace.meta_build import init_skipped
    from ..trace.recorded_step import model_info, recording_modes, track_model_state
    from ..trace.recorder import StorageRecorder
    from ..trace.step import make_optimizer
    from ..trace.transforms import apply_transforms

    try:
        with torch.device("meta"), init_skipped():
            model, _inputs = source.build(cfg)
            transformed = apply_transforms(model, cfg)
    except Exception:  # noqa: BLE001 - a model built for real (values read at construction): traced in full
        return None
    info = model_info(source.name, model)
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    _fake_parameters(model, cfg, fm)
    rec = StorageRecorder(cancel=cancel)
    plan = plan_fold(model, cfg) if fold else None
    folding = DepthFold(plan, rec, virtual_grads=True) if isinstance(plan, FoldPlan) else None
    opt_fold = OptimizerFold(folding) if folding is not None else None
    param_owner = track_model_state(model, rec, info)
    params = [p for p in model.parameters() if p.requires_grad]
    recording, kernels, cuda = recording_modes(cfg, rec, fm, cfg.device == "cpu")
    start = len(rec.events)
    with fm:  # made outside the recording modes (cheaper): of the gradients only zero_grad's frees are spliced
        grads = [_gradients(params, rec, step, folding) for step in (0, 1)]
    rec.step, rec.phase = 0, "setup"  # the optimizer's construction
    try:
        with fm, recording, kernels:
            model.train()
            opt = make_optimizer(model.parameters(), cfg)
            if opt is None:
                return None
            for step in (0, 1):
                for i, p in enumerate(params):
                    p.grad = grads[step][0][i]
                grads[step][0].clear()  # the parameters hold them alone: zero_grad frees them
                if folding is not None:
                    folding.virtual.clear()
                    folding.virtual.update(grads[step][1])
                rec.step, rec.phase = step, "optimizer"
                rec.module_stack.clear()
                with opt_fold.window(opt) if opt_fold is not None else nullcontext():
                    opt.step()
                for prm, state in opt.state.items():
                    for name, v in state.items():
                        if isinstance(v, torch.Tensor):
                            if cuda is not None and name == "step" and v.dim() == 0 and not rec.tracks(v):
                                continue  # a CPU tensor on a CUDA run, as record_step leaves it
                            k = rec.track(v, "optimizer_state")
                            info.storage_roles[k] = "optimizer_state"
                            info.storage_owner[k] = param_owner.get(id(prm), "")
                if opt_fold is not None:
                    opt_fold.copy_roles(info.storage_roles, info.storage_owner)
                with opt_fold.window(opt) if opt_fold is not None else nullcontext():
                    opt.zero_grad(set_to_none=True)
            rec.closed = True
    except FoldDeclined:
        return _optimizer_phases(source, cfg, cancel, fold=False)
    del opt
    if rec.kernel_costs:
        return None  # the optimizer step's kernels were costed: the base's kernel summary would not say so
    # what rests on a model of a library: engine.trace.transforms' notes, one of them the paged optimizer's
    modelled = list(transformed.modelled) if transformed is not None else []
    return rec.events[start:], info.storage_roles, info.storage_owner, modelled


def _gradients(params: list[torch.nn.Parameter], rec: StorageRecorder, step: int, folding: DepthFold | None
               ) -> tuple[list[torch.Tensor | None], dict[tuple[int, str], int]]:
    """A gradient for each parameter as the backward of `step` leaves it (its size, strides and dtype), tracked;
    a folded stack's written-out blocks' are storages only (None in the list; by (block, parameter name): the
    template block's size)."""
    import torch

    from ..trace.recorder import RawEvent

    rec.step, rec.phase = step, "backward"
    written: dict[int, tuple[int, str]] = {}
    template: dict[str, int] = {}
    if folding is not None:
        for j in range(folding.depth - folding.tail, folding.count - folding.tail):
            for name, p in folding.plan.units[j].named_parameters():
                written[id(p)] = (j, name)
        template = {name: id(p) for name, p in folding.plan.units[folding.template].named_parameters()}
    made: list[torch.Tensor | None] = []
    size: dict[int, int] = {}
    for p in params:
        if id(p) in written:
            made.append(None)
            continue
        g = torch.empty_like(p)
        size[id(p)] = rec.nbytes[rec.track(g, "grad")]
        made.append(g)
    virtual: dict[tuple[int, str], int] = {}
    for p in params:
        slot = written.get(id(p))
        if slot is not None:
            n = size[template[slot[1]]]
            virtual[slot] = k = rec.copied(n)
            rec.events.append(RawEvent(k, n, step, "backward", "", "grad"))
    return made, virtual


def _fake_parameters(model: torch.nn.Module, cfg: TrainConfig, fm: FakeTensorMode) -> None:
    """The model's meta parameters as empty fake CPU tensors (`fm`'s, made as the tracer makes them:
    engine.trace.fake_factory, with `fm` not active), as the tracer materialises them: shared ones kept
    shared, floating-point ones cast to a pure fp16/bf16 precision except LoRA adapters (kept fp32) and a quantized
    Linear's packed weight. Only the parameters: the optimizer sees nothing else (tests/test_planner_reuse.py
    holds this to the tracer's, event for event)."""
    from ..finetune.adapters import is_adapter
    from ..finetune.quantized import QuantizedWeights
    from ..trace.fake_factory import fake_parameter
    from ..trace.step import DTYPES

    dtype = DTYPES[cfg.precision] if cfg.precision in ("fp16", "bf16") else None
    memo: dict[int, torch.Tensor] = {}
    for mname, mod in model.named_modules():
        fixed = isinstance(mod, QuantizedWeights)
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                cast = dtype if not (fixed and name != "bias") and not is_adapter(f"{mname}.{name}") else None
                kind = cast if cast is not None and p.is_floating_point() else p.dtype
                memo[id(p)] = fake_parameter(fm, p, kind, p.requires_grad)
            mod._parameters[name] = memo[id(p)]


_OPTIMIZER_MADE = (Category.OPTIMIZER_STATE, Category.TEMPORARIES)  # what an optimizer's construction makes


def _splice(base: TracedStep, raw: list[RawEvent], roles: dict[int, str]
            ) -> tuple[tuple[MemEvent, ...], dict[int, int]] | None:
    """`base`'s events with its optimizer's (its construction's and its two steps') replaced by `raw`'s (the new
    optimizer's), and the map from `raw`'s storage keys to the spliced trace's; None when the gradients do not
    pair up, size for size, or the trace holds what this does not know how to place."""
    from ..trace.recorded_step import categorize

    events = base.trace.events
    if any(e.phase not in ("setup", "forward", "backward", "optimizer") or e.step not in (0, 1) for e in events):
        return None
    shift = max((e.storage for e in events), default=-1) + 1
    made_grads = {e.storage for e in raw if e.phase == "backward" and e.nbytes > 0}
    segment: dict[tuple[int, str], list[RawEvent]] = {(0, "setup"): [], (0, "optimizer"): [], (1, "optimizer"): []}
    for e in raw:
        if e.phase != "backward":
            if (e.step, e.phase) not in segment:
                return None
            segment[e.step, e.phase].append(e)
    key_of: dict[int, int] = {}
    for step in (0, 1):
        mine = segment[step, "optimizer"]
        theirs = [e for e in events if e.step == step and e.phase == "optimizer"
                  and e.category == Category.GRADIENTS and e.nbytes < 0]
        ours = [e for e in mine if e.storage in made_grads]
        if len(theirs) != len(ours) or any(a.nbytes != b.nbytes or b.nbytes > 0
                                           for a, b in zip(theirs, ours, strict=True)):
            return None
        for a, b in zip(theirs, ours, strict=True):
            key_of[b.storage] = a.storage
    made = [e for seg in segment.values() for e in seg if e.storage not in made_grads]
    cats = categorize(made, roles, True)
    for e in made:
        if e.storage not in cats:
            return None  # a free of something the optimizer did not make: not this module's to place
        key_of.setdefault(e.storage, shift + e.storage)

    out: list[MemEvent] = []

    def put(where: tuple[int, str]) -> None:
        for r in segment.pop(where):
            cat = Category.GRADIENTS if r.storage in made_grads else cats[r.storage]
            out.append(MemEvent(index=0, storage=key_of[r.storage], nbytes=r.nbytes, category=cat, step=r.step,
                                phase=r.phase, module=r.module, op=r.op))

    for m in events:
        if m.phase == "optimizer" or (m.phase == "setup" and m.category in _OPTIMIZER_MADE):
            continue  # the old optimizer's
        if m.phase != "setup" and (0, "setup") in segment:
            put((0, "setup"))  # the optimizer is made as the first step begins
        if m.step == 1 and (0, "optimizer") in segment:
            put((0, "optimizer"))
        out.append(m)
    for where in list(segment):
        put(where)
    return tuple(e._replace(index=i) for i, e in enumerate(out)), key_of
