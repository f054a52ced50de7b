"""Runs the real training step on fake tensors and records every storage allocation and free.

No real memory is taken: the model is built on the meta device and moved to fake CPU tensors.
Ops whose output size depends on data fall back to a real run on the CPU when the model is small.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from ..config.train_config import TrainConfig
from ..core.callable_copy import remap_callables
from ..core.errors import Cancelled, UserError
from ..core.hook_reach import check_no_optimizer_in_hooks, hooks_reach
from ..core.limits import check_live_bytes, is_overflow, too_large
from ..core.progress import CancelToken, Progress
from ..core.tensor_tree import map_tensors
from ..finetune.adapters import is_adapter
from ..finetune.quantized import QuantizedWeights
from ..models import moe_routing
from ..models.hf_source import HFConfigSource
from ..models.source import ModelSource
from ..parallel.tensor_parallel import check_data_parallel, check_tensor_parallel
from ..results.types import Trace
from . import grad_accum
from .checkpointing import apply_checkpointing
from .compiled_step import record_compiled_step
from .fake_factory import fake_empty, fake_parameter
from .fold_known import declined_as_own, own_code_reason
from .fold_plan import FoldDeclined, FoldPlan, fold_debug, plan_fold
from .meta_build import build_on_meta
from .recorded_step import ModelInfo, model_info, record_step, to_trace
from .recorder import StorageRecorder
from .step import DTYPES, cast_inputs
from .transforms import apply_transforms

# What the caller runs when fake tensors cannot trace the step (an op whose output size depends on the data):
# (source, cfg, info so far, the error, cancel, peak reached before it) -> (trace, info). engine.measure.real_fallback's
# `run_for_real` measures the step with a real CPU run; without one such a model is a one-line error.
RealRun = Callable[[ModelSource, TrainConfig, ModelInfo, Exception, CancelToken | None, int], tuple[Trace, ModelInfo]]


def _fakeify(model: nn.Module, inputs: Any, cfg: TrainConfig, fm: FakeTensorMode) -> tuple[nn.Module, Any]:
    _materialize(model, fm, DTYPES[cfg.precision] if cfg.precision in ("fp16", "bf16") else None)
    with fm:
        seen: dict[int, torch.Tensor] = {}

        def conv(x: torch.Tensor) -> torch.Tensor:  # one tensor passed twice (input_ids as labels) stays one
            if id(x) not in seen:
                seen[id(x)] = torch.empty_like(x, device="cpu")
            return seen[id(x)]

        inputs = map_tensors(inputs, conv)
        if cfg.precision in ("fp16", "bf16"):
            inputs = cast_inputs(inputs, DTYPES[cfg.precision])
    return model, inputs


def _materialize(model: nn.Module, fm: FakeTensorMode, dtype: torch.dtype | None = None) -> None:
    """Meta parameters and buffers → empty fake tensors on the CPU (`fm`'s: engine.trace.fake_factory, with `fm`
    not active), keeping shared ones shared;
    floating-point ones cast to `dtype` when given (pure fp16/bf16, as model.to(dtype) would).

    nn.Module.to_empty would give each module its own copy of a tied weight (an embedding shared with the
    LM head), counting it twice.
    """
    memo: dict[int, torch.Tensor] = {}
    for mname, mod in model.named_modules():
        fixed = isinstance(mod, QuantizedWeights)  # packed weights and their scales keep their dtypes
        for name, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in memo:  # a factory call: much cheaper under fake mode than converting p
                    # LoRA adapters stay float32 on a half base: peft's autocast_adapter_dtype, as a model loaded
                    # in bf16 and then given adapters has them (engine.finetune.adapters.keep_adapters_fp32).
                    cast = dtype if not (fixed and name != "bias") and not is_adapter(f"{mname}.{name}") else None
                    memo[id(p)] = fake_parameter(fm, p, _cast(p, cast), p.requires_grad)
                mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None:
                if id(b) not in memo:
                    memo[id(b)] = fake_empty(fm, b, _cast(b, None if fixed else dtype))
                mod._buffers[name] = memo[id(b)]
        # Plain tensor attributes (a mask kept as an attribute, not a buffer, or in a dict or list) were built
        # on meta too.
        # (what _meta_to_cpu may change: a tensor, a container not empty; most modules' are empty hook dicts)
        attrs = [(name, v) for name, v in vars(mod).items()
                 if (isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple, dict)) and v))
                 and name not in ("_parameters", "_buffers", "_modules")]
        if attrs:
            with fm:
                for name, v in attrs:
                    new = _meta_to_cpu(v, memo)
                    if new is not v:
                        setattr(mod, name, new)
    # what the model's callables hold on meta (a hook's own tensor, a parameter it closes over) reaches the fake ones
    held = [t for t in hooks_reach(model).tensors if t.device.type == "meta"]
    if held:
        for t in held:
            if id(t) not in memo:
                memo[id(t)] = fake_empty(fm, t, t.dtype)
        remap_callables(model, memo)


def _meta_to_cpu(v: Any, memo: dict[int, torch.Tensor], depth: int = 0) -> Any:
    if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
        if v.device.type != "meta":
            return v
        if id(v) not in memo:
            memo[id(v)] = torch.empty_like(v, device="cpu")
        return memo[id(v)]
    if depth < 3 and isinstance(v, (list, tuple, dict)):
        items = v.items() if isinstance(v, dict) else enumerate(v)
        changed = {k: _meta_to_cpu(x, memo, depth + 1) for k, x in items}
        if all(changed[k] is (v[k]) for k in changed):
            return v
        if isinstance(v, dict):
            v.update(changed)  # in place: the module may hold other references to it
            return v
        if isinstance(v, list):
            v[:] = [changed[i] for i in range(len(v))]
            return v
        return type(v)(changed[i] for i in range(len(v))) if not hasattr(v, "_fields") else type(v)(
            *[changed[i] for i in range(len(v))])
    return v


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def trace_model(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                progress: Progress | None = None, every_micro_step: bool = False,
                real_run: RealRun | None = None) -> tuple[Trace, ModelInfo]:
    """The exact allocation trace of `cfg`'s steps of `source`'s model, on fake tensors.

    A step whose op has a data-dependent output size is handed to `real_run` (see RealRun).

    Gradient accumulation's micro-steps after the second are copies of it (engine.trace.grad_accum) unless
    `every_micro_step`, or unless the second is not self-contained. What the model prints goes to stderr."""
    from ..models.sources import user_code_output

    with user_code_output():
        try:
            return _trace(source, cfg, cancel=cancel, progress=progress, every_micro_step=every_micro_step,
                          real_run=real_run)
        except SystemExit as e:  # the model's forward (or a hook) called sys.exit: not a result
            raise UserError(f"the model's code called sys.exit({e.code!r}) while it was traced; a model must "
                            "return its output, not exit") from None


# The rung of fold_plan.RUNGS that last folded a stack of this kind (FoldPlan.kind): its next trace starts there,
# not at a rung that declined it (every rung gives the full trace's events; this saves the declined attempts).
# By block class, held weakly: a user's model file reloaded (a new class) lets the old one and its module go.
_FOLDED_AT: weakref.WeakKeyDictionary[type[nn.Module], dict[tuple[str, int], int]] = weakref.WeakKeyDictionary()


def _folded_rung(kind: tuple[str, type[nn.Module], int]) -> int:
    path, cls, blocks = kind
    return _FOLDED_AT.get(cls, {}).get((path, blocks), 0)


def _remember_rung(kind: tuple[str, type[nn.Module], int], rung: int) -> None:
    path, cls, blocks = kind
    _FOLDED_AT.setdefault(cls, {})[path, blocks] = rung


def forget_fold_rungs() -> None:
    """Every stack's next trace starts at the first rung again (the tests' isolation: which rung folds a kind of
    stack shows in extra.trace_fold)."""
    _FOLDED_AT.clear()


def _trace(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None, progress: Progress | None,
           every_micro_step: bool, real_run: RealRun | None, unfolded: str | None = None,
           rung: int | None = None) -> tuple[Trace, ModelInfo]:
    """`unfolded`: why a folded trace of this model was given up (then every block is traced); `rung`: of
    fold_plan.RUNGS, the one to fold at (None: where this kind of stack folded last, else the first)."""
    if isinstance(source, str):
        from ..models.sources import resolve_source

        source = resolve_source(source)
    if progress:
        progress(0.05, "building the model")
    t0 = time.perf_counter()
    try:
        model, inputs, built_for_real = _build(source, cfg)
    except Exception as e:
        if is_overflow(e):
            raise too_large("the model's tensors do not fit 64-bit sizes", cfg.size_hint()) from None
        raise
    check_tensor_parallel(model, cfg.tp, source.name)
    if cfg.training:
        check_no_optimizer_in_hooks(model)
    with torch.device("cpu" if built_for_real else "meta"):  # adapters are made where the model is
        transformed = apply_transforms(model, cfg)
    info = model_info(source.name, model, transformed)
    if cfg.training:
        check_data_parallel(info.trainable_parameters, cfg.world_size, cfg.tp, cfg.strategy, source.name)
    if isinstance(source, HFConfigSource) and source.moe:
        info.notes.append(moe_routing.describe(cfg.moe_routing, source.experts_implementation(cfg)))
    if built_for_real:
        info.notes.append("built for real on the CPU: the model's constructor reads tensor values")
    if cfg.checkpointing and cfg.training:
        info.checkpointed = apply_checkpointing(model)
        if not info.checkpointed:
            info.notes.append("checkpointing asked for, but the model has no repeated blocks to wrap")
    fold = plan_fold(model, cfg) if unfolded is None else unfolded
    if isinstance(fold, FoldPlan):
        fold = fold.at_rung(_folded_rung(fold.kind) if rung is None else rung) or fold
    info.fold = fold_debug(fold)
    # the user's own code is traced in full along time too: its second step run, not copied from the first
    # (engine.trace.step_replay sees no state kept outside the modules: a count in a global, a hook's closure)
    own = None if cfg.fold_own_code or isinstance(fold, FoldPlan) else \
        info.fold.reason if declined_as_own(info.fold.reason) else own_code_reason(model, [])
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    model, inputs = _fakeify(model, inputs, cfg, fm)
    if progress:
        progress(0.15, "tracing the step")
    rec = StorageRecorder(cancel=cancel)
    # A shape error inside a fake kernel is logged with a traceback by torch; the user gets one line instead.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    micro = None if every_micro_step or not cfg.training else grad_accum.traced_micro_steps(cfg)
    try:
        declined = _record(model, inputs, cfg, rec, info, fm, micro, fold, replay=own is None)
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        del model, inputs
        partial = 0
        running = 0
        for ev in rec.events:
            running += ev.nbytes
            partial = max(partial, running)
        if real_run is None:
            raise UserError(f"the model uses an op whose output size depends on the data ({e}): fake tensors "
                            "cannot trace it") from None
        return real_run(source, cfg, info, e, cancel, partial)
    except (UserError, Cancelled):
        raise
    except Exception as e:  # the model's own code failed on these shapes: one line, naming the module
        if is_overflow(e):
            raise too_large("the model's tensors do not fit 64-bit sizes", cfg.size_hint()) from None
        raise _shape_error(e, rec, info) from None
    finally:
        fake_log.setLevel(level)
    if declined is not None:  # more blocks are traced at the next rung, every block after the last
        del model, inputs
        assert isinstance(fold, FoldPlan)
        higher = fold.at_rung(fold.rung + 1)
        return _trace(source, cfg, cancel=cancel, progress=progress, every_micro_step=every_micro_step,
                      real_run=real_run, unfolded=None if higher else declined,
                      rung=higher.rung if higher else None)
    if isinstance(fold, FoldPlan):
        _remember_rung(fold.kind, fold.rung)
    if micro is not None and cfg.grad_accum > micro:
        extended = grad_accum.extend(rec.events, cfg, rec.copied, info.storage_roles, info.storage_owner)
        if extended is None:
            if cfg.grad_accum > grad_accum.MAX_SHOWN:
                raise UserError(f"this model's micro-steps differ after the second, so {cfg.grad_accum:,} of them "
                                f"cannot be traced: use a gradient accumulation of {grad_accum.MAX_SHOWN} or less")
            return _trace(source, cfg, cancel=cancel, progress=progress, every_micro_step=True, real_run=real_run)
        rec.events = extended
        n = grad_accum.note(cfg)
        if n:
            info.notes.append(n)
    check_live_bytes(rec.events, cfg.size_hint())
    if progress:
        progress(0.9, "summarising")
    note = f"traced in {time.perf_counter() - t0:.2f} s on fake tensors"
    if info.fold is not None and declined_as_own(info.fold.reason):
        note += ", every block and both steps (the stack is the user's own code; “fold my own code”, " \
            "--fold-own-code, traces a few and copies the second step)"
    elif own is not None and not cfg.compile and not cfg.generating:
        note += ", both steps (the model is the user's own code; “fold my own code”, --fold-own-code, copies the " \
            "second step from the first)"
    info.notes.append(note)
    return to_trace(rec.events, info.storage_roles, cfg, "tracer"), info


def _record(model: nn.Module, inputs: Any, cfg: TrainConfig, rec: StorageRecorder, info: ModelInfo,
            fm: FakeTensorMode, micro: int | None, fold: FoldPlan | str, replay: bool = True) -> str | None:
    """record_step, with `fold`'s stack folded when it is a plan: None when recorded, else why the folded trace
    was given up (the blocks did not repeat as folding needs, or the cut stack failed). `replay`: may the second
    step be copied from the first (engine.trace.step_replay)."""
    if cfg.compile:  # torch.compile's program (never folded: engine.trace.fold_plan)
        record_compiled_step(model, inputs, cfg, rec, info, fm, probe=cfg.device == "cpu", micro_steps=micro)
        return None
    if not isinstance(fold, FoldPlan):
        record_step(model, inputs, cfg, rec, info, fm, probe=cfg.device == "cpu", micro_steps=micro,
                    copy_second_step=replay)
        return None
    try:
        record_step(model, inputs, cfg, rec, info, fm, probe=cfg.device == "cpu", micro_steps=micro, fold=fold)
    except Cancelled:
        raise
    except FoldDeclined as e:
        return str(e)
    except Exception as e:  # noqa: BLE001  # the full trace raises it again if it is the model's own error
        return f"the folded trace failed ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''})"
    return None


def _build(source: ModelSource, cfg: TrainConfig) -> tuple[nn.Module, Any, bool]:
    """(model, inputs, built_for_real): on the meta device, or for real when the constructor needs values."""
    try:
        model, inputs = build_on_meta(source, cfg)
        return model, inputs, False
    except (UserError, RuntimeError, NotImplementedError) as meta_error:
        if is_overflow(meta_error):
            raise
        # A constructor that reads tensor values (`[x.item() for x in torch.linspace(...)]`) cannot run on
        # the meta device: build for real on the CPU; if that fails too, the error is the user's.
        try:
            model, inputs = source.build(cfg)
        except Exception:
            if isinstance(meta_error, UserError):
                raise meta_error from None
            raise
        return model, inputs, True


def _shape_error(e: Exception, rec: StorageRecorder, info: ModelInfo) -> Exception:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not isinstance(e, RuntimeError):
        msg = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    if rec.module:
        where = f"module '{rec.module}' ({info.module_types.get(rec.module, '?')})"
    else:
        where = "the model's top level"
    at = f" at op {rec.op}" if rec.op and isinstance(e, RuntimeError) else ""  # Python-level checks raise between ops
    return UserError(f"{where} failed{at}: {msg.rstrip('.')}")


