"""Runs the real training step on fake tensors and records every storage allocation and free.

No real memory is taken: the model is built on the meta device and moved to fake CPU tensors.
Ops whose output size depends on data fall back to a real run on the CPU when the model is small.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from .checkpointing import apply_checkpointing
from .config import TrainConfig
from .errors import Cancelled, UserError
from .results import MemEvent, Trace
from .step import DTYPES, cast_inputs, run_steps
from .step_replay import StepReplay
from .tracker import ModuleScopes, RecordingMode, StorageRecorder

REAL_FALLBACK_LIMIT = 2 * 1024**3  # parameter bytes under which a data-dependent model is run for real


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
    method: str = "fake"


def _fakeify(model: nn.Module, inputs, cfg: TrainConfig, fm: FakeTensorMode):
    with fm:
        _materialize(model, DTYPES[cfg.precision] if cfg.precision in ("fp16", "bf16") else None)

        seen: dict[int, torch.Tensor] = {}

        def conv(x):
            if isinstance(x, torch.Tensor):  # one tensor passed twice (input_ids as labels) stays one
                if id(x) not in seen:
                    seen[id(x)] = torch.empty_like(x, device="cpu")
                return seen[id(x)]
            if isinstance(x, dict):
                return {k: conv(v) for k, v in x.items()}
            if isinstance(x, (tuple, list)):
                return type(x)(conv(v) for v in x)
            return x

        inputs = conv(inputs)
        if cfg.precision in ("fp16", "bf16"):
            inputs = cast_inputs(inputs, DTYPES[cfg.precision])
    return model, inputs


def _materialize(model: nn.Module, dtype: torch.dtype | None = None) -> None:
    """Meta parameters and buffers → empty tensors on the (fake) CPU, keeping shared ones shared;
    floating-point ones cast to `dtype` when given (pure fp16/bf16, as model.to(dtype) would).

    nn.Module.to_empty would give each module its own copy of a tied weight (an embedding shared with the
    LM head), counting it twice.
    """
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in memo:  # a factory call: much cheaper under fake mode than converting p
                    t = torch.empty_strided(p.size(), p.stride(), device="cpu", dtype=_cast(p, dtype))
                    memo[id(p)] = nn.Parameter(t, requires_grad=p.requires_grad)
                mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None:
                if id(b) not in memo:
                    memo[id(b)] = torch.empty_strided(b.size(), b.stride(), device="cpu", dtype=_cast(b, dtype))
                mod._buffers[name] = memo[id(b)]
        # Plain tensor attributes (a mask kept as an attribute, not a buffer, or in a dict or list) were built
        # on meta too.
        for name, v in list(vars(mod).items()):
            if name not in ("_parameters", "_buffers", "_modules"):
                new = _meta_to_cpu(v, memo)
                if new is not v:
                    setattr(mod, name, new)


def _meta_to_cpu(v, memo: dict[int, torch.Tensor], depth: int = 0):
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


def _flat_tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flat_tensors(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _flat_tensors(v)


def _record(model: nn.Module, inputs, cfg: TrainConfig, rec: StorageRecorder, info: ModelInfo, mode_ctx, probe=False):
    """Runs the steps under the recorder; fills info's storage roles."""
    roles, owner = info.storage_roles, info.storage_owner
    param_owner: dict[int, str] = {}
    for mname, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            k = rec.track(p, "parameter")
            roles[k] = "parameters"
            owner.setdefault(k, mname)
            param_owner.setdefault(id(p), mname)  # a tied weight belongs to its first module
        for b in mod.buffers(recurse=False):
            k = rec.track(b, "buffer")
            roles.setdefault(k, "buffers")
            owner.setdefault(k, mname)
    for t in _flat_tensors(inputs):
        roles.setdefault(rec.track(t, "input"), "inputs")
    params = [p for p in model.parameters() if p.requires_grad]

    replay = StepReplay(rec, roles, model) if isinstance(mode_ctx, FakeTensorMode) and REPLAY_STEPS else None

    def set_phase(step: int, phase: str) -> None:
        if rec.cancel is not None and rec.cancel.is_set():
            raise Cancelled()
        rec.step, rec.phase = step, phase
        if phase != "backward":
            rec.module_stack.clear()
        if replay is not None and phase == "forward":
            replay.step_starts(step)

    def after_backward() -> None:
        if replay is not None:
            replay.grads_seen(params)
        for p in params:
            if p.grad is not None:
                k = rec.track(p.grad, "grad")
                roles[k] = "gradients"
                owner[k] = param_owner.get(id(p), "")

    def after_optimizer(opt) -> None:
        for p, state in opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    k = rec.track(v, "optimizer_state")
                    roles[k] = "optimizer_state"
                    owner[k] = param_owner.get(id(p), "")

    kernels = nullcontext()
    if cfg.device == "cuda" and isinstance(mode_ctx, FakeTensorMode):
        from .cuda_target import CudaKernelChoices, compute_capability

        kernels = CudaKernelChoices(compute_capability(cfg.gpu))
    fake = mode_ctx if isinstance(mode_ctx, FakeTensorMode) else None
    with mode_ctx, ModuleScopes(model, rec), RecordingMode(rec, probe_cpu_kernels=probe, fake=fake), kernels:
        copy_step = _replayed(replay, after_backward, set_phase) if replay is not None else None
        opt = run_steps(model, inputs, cfg, set_phase, after_backward, after_optimizer, replay=copy_step)
        rec.closed = True
    del opt


REPLAY_STEPS = True  # the second step's forward/backward copied from the first (engine.step_replay)


def _replayed(replay: StepReplay, after_backward, set_phase):
    """run_steps' `replay`: the step's phase marks and gradient roles around StepReplay's copy."""

    def run(step: int) -> bool:
        set_phase(step, "forward")  # cancellation is checked here too
        if not replay(step):
            return False
        after_backward()
        return True

    return run


def trace_model(source, cfg: TrainConfig, *, cancel=None, progress=None) -> tuple[Trace, ModelInfo]:
    """The exact allocation trace of `cfg`'s steps of `source`'s model, on fake tensors."""
    if isinstance(source, str):
        from .sources import resolve_source

        source = resolve_source(source)
    if progress:
        progress(0.05, "building the model")
    t0 = time.perf_counter()
    built_for_real = False
    try:
        with torch.device("meta"):
            model, inputs = source.build(cfg)
    except (UserError, RuntimeError, NotImplementedError) as meta_error:
        # A constructor that reads tensor values (`[x.item() for x in torch.linspace(...)]`) cannot run on
        # the meta device: build for real on the CPU; if that fails too, the error is the user's.
        try:
            model, inputs = source.build(cfg)
        except Exception:
            if isinstance(meta_error, UserError):
                raise meta_error from None
            raise
        built_for_real = True
    info = _model_info(source.name, model)
    if built_for_real:
        info.notes.append("built for real on the CPU: the model's constructor reads tensor values")
    if cfg.checkpointing and cfg.training:
        info.checkpointed = apply_checkpointing(model)
        if not info.checkpointed:
            info.notes.append("checkpointing asked for, but the model has no repeated blocks to wrap")
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    model, inputs = _fakeify(model, inputs, cfg, fm)
    if progress:
        progress(0.15, "tracing the step")
    rec = StorageRecorder(cancel=cancel)
    # A shape error inside a fake kernel is logged with a traceback by torch; the user gets one line instead.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        _record(model, inputs, cfg, rec, info, fm, probe=cfg.device == "cpu")
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        del model, inputs
        partial = 0
        running = 0
        for _k, n, *_rest in rec.events:
            running += n
            partial = max(partial, running)
        return _real_fallback(source, cfg, info, e, cancel, partial)
    except (UserError, Cancelled):
        raise
    except Exception as e:  # the model's own code failed on these shapes: one line, naming the module
        raise _shape_error(e, rec, info) from None
    finally:
        fake_log.setLevel(level)
    if progress:
        progress(0.9, "summarising")
    info.notes.append(f"traced in {time.perf_counter() - t0:.2f} s on fake tensors")
    return to_trace(rec.events, info.storage_roles, cfg, "tracer"), info


def _real_fallback(source, cfg: TrainConfig, info: ModelInfo, err, cancel, partial_peak: int = 0):
    """Fake tensors cannot know how big a data-dependent output is: run the step for real on the CPU,
    measured by the profiler (engine.profiler), when the model is small enough for this machine.

    `partial_peak` is what the fake trace had reached before the data-dependent op: the real run needs at
    least that, and the parameters' training state besides; both must fit in half the free host memory."""
    need = max(partial_peak, 0) + (4 if cfg.training else 1) * 4 * info.parameters
    free = _available_host_memory()
    if 4 * info.parameters > REAL_FALLBACK_LIMIT or (free is not None and need > free // 2):
        raise UserError(
            f"the model uses an op whose output size depends on the data ({err}); running it for real would "
            f"need at least {need / 1024**3:.1f} GiB of host memory, more than this machine can spare"
        )
    from .profiler import measure_cpu

    trace, real_info, _peak = measure_cpu(source, cfg, cancel=cancel)
    real_info.notes = info.notes + ["an op's output size depends on the data: measured with a real run on the CPU"]
    return Trace(events=trace.events, source="tracer", device=cfg.device), real_info


def _available_host_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


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


def _model_info(name: str, model: nn.Module) -> ModelInfo:
    seen = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return ModelInfo(
        name=name,
        parameters=total,
        trainable_parameters=trainable,
        module_types={n: type(m).__name__ for n, m in model.named_modules()},
        module_params={n: sum(p.numel() for p in m.parameters(recurse=False)) for n, m in model.named_modules()},
        storage_roles={},
        storage_owner={},
    )


def categorize(raw, roles: dict[int, str], training: bool) -> dict[int, str]:
    """Category of every storage: its role if it has one, else by when it was allocated and freed.

    A forward allocation still alive when its forward ends is an activation (saved for backward);
    everything else without a role is a temporary.
    """
    alloc: dict[int, tuple[int, str]] = {}
    freed: dict[int, tuple[int, str]] = {}
    for key, n, step, phase, _m, _op in raw:
        if n >= 0:
            alloc.setdefault(key, (step, phase))
        else:
            freed[key] = (step, phase)
    cats = {}
    for key, (step, phase) in alloc.items():
        role = roles.get(key)
        if role:
            cats[key] = role
        elif phase == "forward" and (not training or freed.get(key, (None, None)) != (step, "forward")):
            cats[key] = "activations"
        else:
            cats[key] = "temporaries"
    return cats


def to_trace(raw, roles: dict[int, str], cfg: TrainConfig, source: str) -> Trace:
    cats = categorize(raw, roles, cfg.training)
    ev = tuple(
        MemEvent(index=i, storage=k, nbytes=n, category=cats[k], step=s, phase=ph, module=m, op=op)
        for i, (k, n, s, ph, m, op) in enumerate(raw)
    )
    return Trace(events=ev, source=source, device=cfg.device)
