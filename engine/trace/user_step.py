"""A user's own training step traced (the Python API's `vramscope.estimate_step`): `step(*args, **kwargs)` run twice
on fake copies of the models, optimizers, schedulers and tensors it is given, under the same recorder as the
canonical step (engine.trace.recorder, engine.trace.recorded_step). Its phases are told apart as they happen: backward
while autograd runs, forward from a module's call (a closure's inside an optimizer's step too), optimizer inside an
optimizer's step otherwise (and after it, until the next module is called).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sysconfig
import threading
import traceback
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.optim.lr_scheduler import LRScheduler

from ..config.optimizers import NAME_OF_CLASS
from ..config.train_config import TrainConfig
from ..core.callable_copy import copy_model_callables, global_names, map_hook_dicts
from ..core.errors import Cancelled, UserError
from ..core.grad_hooks import carry_grad_hooks
from ..core.hook_reach import Reached, walk
from ..core.limits import check_live_bytes, is_overflow, too_large
from ..core.progress import CancelToken
from ..core.resources import SOURCE_ROOT
from ..models.sources import user_code_output
from ..results.estimate_fields import UserStep
from ..results.types import Trace
from .recorded_step import (
    ModelInfo,
    kernel_summary,
    model_info,
    recording_modes,
    to_trace,
    track_gradient,
    track_model_state,
)
from .recorder import ModuleScopes, RecordingMode, StorageRecorder
from .step import STEPS, SteadyStateScaler

# what a user's step may need a value for: torch raises these (or GuardOnDataDependentSymNode) on fake tensors
_VALUE_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)
_TORCH = str(Path(torch.__file__).parent)
_OURS = tuple(str(SOURCE_ROOT / d) for d in ("engine", "vramscope"))
_STDLIB = sysconfig.get_paths()["stdlib"]
_PACKAGES = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
# what torch says when a traced step sends a tensor to CUDA: a CPU-only build, no driver, or a fake CUDA tensor
# meeting the fake CPU weights
_CUDA_REFUSED = ("not linked with support", "not compiled with", "no nvidia driver", "different devices")


@dataclass
class StepParts:
    """What the step was given, found by walking its arguments (and a bound method's object)."""

    modules: list[tuple[str, nn.Module]] = field(default_factory=list)
    optimizers: list[tuple[str, torch.optim.Optimizer]] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)  # tensors given as such (not a module's)


def _walk(x: object, path: str, parts: StepParts, seen: set[int], depth: int = 0) -> None:
    if id(x) in seen or depth > 4:
        return
    seen.add(id(x))
    if isinstance(x, nn.Module):
        parts.modules.append((path, x))
    elif isinstance(x, torch.optim.Optimizer):
        parts.optimizers.append((path, x))
    elif isinstance(x, LRScheduler):
        parts.schedulers.append(f"{path} ({type(x).__name__})")
        _walk(x.optimizer, f"{path}.optimizer", parts, seen, depth + 1)
    elif isinstance(x, torch.Tensor):
        parts.tensors.append(x)
    elif isinstance(x, dict):
        for i, (k, v) in enumerate(x.items()):  # (a key that is a tensor is named by its position, not printed)
            _walk(v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[{type(k).__name__} {i}]", parts,
                  seen, depth + 1)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _walk(v, f"{path}[{i}]", parts, seen, depth + 1)
    elif hasattr(x, "__dict__") and not isinstance(x, type) and not inspect.isroutine(x) and \
            not inspect.ismodule(x):  # the user's own object (a trainer, a config): its attributes are data
        for k, v in vars(x).items():
            _walk(v, f"{path}.{k}", parts, seen, depth + 1)


def find_parts(bound: dict[str, Any]) -> StepParts:
    parts = StepParts()
    seen: set[int] = set()
    for name, value in bound.items():
        _walk(value, name, parts, seen)
    # a module inside another one given too (model and model.encoder) belongs to the outer one
    inner = {id(m) for _n, top in parts.modules for m in top.modules() if m is not top}
    parts.modules = [(n, m) for n, m in parts.modules if id(m) not in inner]
    return parts


def check_closure(step: Callable[..., Any]) -> None:
    """A model or optimizer the step reaches outside its arguments would be trained for real: refused, by name."""
    fn = step.__func__ if inspect.ismethod(step) else step
    if not isinstance(fn, types.FunctionType):
        return
    # (the globals its code loads: `self.model` names no global `model`, which inspect.getclosurevars would take)
    reached = {n: fn.__globals__[n] for n in global_names(fn.__code__) if n in fn.__globals__}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        with contextlib.suppress(ValueError):  # (a cell not filled yet)
            reached[name] = cell.cell_contents
    for name, v in reached.items():
        # a module without weights (a loss, an activation) holds nothing to train or to count: it may stay global
        holds = isinstance(v, nn.Module) and any(True for _ in [*v.parameters(), *v.buffers()])
        if holds or isinstance(v, torch.optim.Optimizer):
            raise UserError(f"{_where_defined(fn)}: {fn.__name__} uses '{name}' (a {type(v).__name__}) from outside "
                            f"its arguments; pass it as one (estimate_step({fn.__name__}, {name}, …)) so that a fake "
                            "copy is traced instead of the real one being trained")


def _where_defined(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)  # a user's callable: its attributes are data
    return f"{_short(code.co_filename)}:{code.co_firstlineno}" if code is not None else getattr(fn, "__name__", "step")


def _short(filename: str) -> str:
    with contextlib.suppress(ValueError):
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    return filename


_COPIED_FOR_REAL = 1 << 20  # bytes under which a CPU tensor an object holds is copied with its values


def _fake_copy(t: torch.Tensor) -> torch.Tensor:
    """A fake tensor like `t` (on the CPU device, which the trace runs on); a parameter stays a parameter."""
    new = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
    if isinstance(t, nn.Parameter):  # (its gradient hooks run in the real step: engine.core.grad_hooks)
        return carry_grad_hooks(t, nn.Parameter(new, requires_grad=t.requires_grad))
    return new.requires_grad_(t.requires_grad) if t.is_leaf and t.is_floating_point() else new


def _rewrap_scheduled_step(opt: torch.optim.Optimizer, original: torch.optim.Optimizer) -> None:
    """An LR scheduler wraps its optimizer's `step` (an attribute of the optimizer, which a copy leaves out: the
    scheduler would warn that the step was overridden). The copy's is wrapped as the scheduler wraps it."""
    wrapped = vars(original).get("step")
    if wrapped is None or not getattr(wrapped, "_wrapped_by_lr_sched", False):
        return

    def step(*args: Any, **kwargs: Any) -> Any:
        opt._opt_called = True  # type: ignore[attr-defined]  # what the scheduler's own wrapper records
        return type(opt).step(opt, *args, **kwargs)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    opt.step = step  # type: ignore[method-assign]


@dataclass
class FakeStep:
    """The fake copy of the step's objects: call `fn(*args, **kwargs)`; `root` names every module."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    root: nn.Module
    modules: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    inputs: list[torch.Tensor]
    grads: list[tuple[nn.Parameter, torch.Tensor]]
    hook_optimizers: tuple[str, ...] = ()  # the optimizers the parameters' hooks step (engine.core.hook_reach)


def fake_copy(step: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], parts: StepParts,
              fm: FakeTensorMode, cuda: bool) -> FakeStep:
    """The step's arguments (and a bound method's object) deep-copied with every tensor of theirs made fake: the
    models' parameters, buffers, gradients and tensor attributes, the optimizers' state, the tensors given. The
    copies' optimizers step the copies' parameters (an LR scheduler's wrapper included); for a CUDA target they take
    CUDA's default multi-tensor path; an enabled GradScaler always steps (its overflow check reads a value). The
    modules' hooks, functions set on them and the parameters' gradient hooks are copied to reach the copies
    (engine.core.callable_copy), and the optimizers anything of the step's holds are traced as its own
    (engine.core.hook_reach: an optimizer step in the backward, a model's `opts`)."""
    memo: dict[int, Any] = {}
    fn: Callable[..., Any] = step
    owner: tuple[object, ...] = ()
    if inspect.ismethod(step):
        fn, owner = step.__func__, (step.__self__,)
    reached = Reached()
    walk((owner, args, kwargs), reached)
    inside = {id(m) for _n, top in parts.modules for m in top.modules()}
    for m in reached.modules:
        if id(m) not in inside and any(True for _ in m.parameters()):
            raise UserError(f"the step's objects reach a {type(m).__name__} outside its arguments (held by a gradient "
                            "hook, a model's attribute or an object given): pass it to the step as an argument, so "
                            "that it is counted and a fake copy of it is traced")
    given = {id(o) for _n, o in parts.optimizers}
    extra = [o for o in reached.optimizers if id(o) not in given]
    all_optimizers = [*parts.optimizers, *(("", o) for o in extra)]
    grads: list[tuple[nn.Parameter, torch.Tensor]] = []
    counts = {id(v): v.item() for _n, opt in all_optimizers for state in opt.state.values() for v in state.values()
              if isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu"}  # read outside fake mode
    with fm:
        for _n, m in parts.modules:
            for p in m.parameters():
                if id(p) not in memo:
                    memo[id(p)] = _fake_copy(p)
                    map_hook_dicts(p, memo[id(p)], memo)
                    if p.grad is not None:
                        grads.append((memo[id(p)], _fake_copy(p.grad)))
            for b in m.buffers():
                memo.setdefault(id(b), _fake_copy(b))
            for sub in m.modules():
                for k, v in vars(sub).items():
                    if isinstance(v, torch.Tensor) and k not in ("_parameters", "_buffers"):
                        memo.setdefault(id(v), _fake_copy(v))
        for _n, opt in all_optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and id(v) not in memo:
                        # a 0-d CPU tensor (a step counter) keeps its value: a fake constant, as an optimizer made
                        # under fake mode has it (its step reads the count)
                        memo[id(v)] = torch.tensor(counts[id(v)], dtype=v.dtype) if id(v) in counts else \
                            _fake_copy(v)
        for t in parts.tensors:
            memo.setdefault(id(t), _fake_copy(t))
        for t in reached.tensors:  # a tensor a hook or an object holds, not counted: a large one or one on a device
            # is read on a fake copy (a deep copy would take its memory); a small CPU one is deep-copied as before
            if id(t) not in memo and (t.device.type != "cpu" or t.untyped_storage().nbytes() >= _COPIED_FOR_REAL):
                memo[id(t)] = _fake_copy(t)
    try:
        c_owner, c_args, c_kwargs = copy.deepcopy((owner, args, kwargs), memo)
    except Exception as e:  # noqa: BLE001 - the user's objects: a failure to copy them is one line
        first = (str(e).strip().splitlines() or [""])[0]
        raise UserError(f"the step's arguments cannot be copied with copy.deepcopy, which the estimate needs to leave "
                        f"them unchanged: {type(e).__name__}: {first}") from None
    for p, g in grads:
        p.grad = g
    modules = [memo[id(m)] for _n, m in parts.modules]
    done: dict[int, Any] = {}
    for m in modules:
        copy_model_callables(m, memo, done)
    all_optimizers = [(n, o) for n, o in all_optimizers if id(o) in memo]  # (those the copies reach)
    optimizers = [memo[id(o)] for _n, o in all_optimizers]
    for opt, (_n, original) in zip(optimizers, all_optimizers, strict=True):
        _rewrap_scheduled_step(opt, original)
        if cuda:  # on CUDA, torch's optimizers default to the multi-tensor path; on the CPU (the trace's) to the loop
            for group in opt.param_groups:
                if group.get("foreach", False) is None and not group.get("fused") and \
                        not group.get("differentiable"):
                    group["foreach"] = True
    for obj in list(memo.values()):
        if type(obj) is torch.amp.GradScaler and obj.is_enabled():
            obj.__class__ = SteadyStateScaler  # its inf check reads a value; the steady state's step always runs
    if len(modules) == 1:
        root = modules[0]
    else:
        root = nn.Module()
        for (name, _m), m in zip(parts.modules, modules, strict=True):
            root.add_module(name.replace(".", "/"), m)
    inputs = [memo[id(t)] for t in parts.tensors]
    call = (lambda *a, **k: fn(c_owner[0], *a, **k)) if owner else fn
    kinds: dict[str, int] = {}
    for name, opt in all_optimizers:
        if not name:
            kinds[type(opt).__name__] = kinds.get(type(opt).__name__, 0) + 1
    named = tuple(f"{n} × {kind} (held by the models' attributes or gradient hooks)" for kind, n in kinds.items())
    return FakeStep(call, tuple(c_args), dict(c_kwargs), root, modules, optimizers, inputs, grads, named)


class PhasedRecording(RecordingMode):  # type: ignore[no-untyped-call]  # TorchDispatchMode's __init_subclass__
    """The recording mode, telling a user's step's phases apart op by op."""

    optimizer_depth = 0  # inside an optimizer's step (one may call another's)
    hook_steps = 0  # inside an optimizer's step that a backward's gradient hook called (engine.core.hook_reach)
    backward_seen = False

    def __torch_dispatch__(self, func: OpOverload[..., Any], types: Sequence[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        rec = self.rec
        if torch._C._current_graph_task_id() != -1:  # autograd's engine is running a backward
            # (an optimizer stepped by a gradient hook inside it: engine.core.hook_reach)
            rec.phase = "optimizer" if self.hook_steps else "backward"
            self.backward_seen = True
        elif self.optimizer_depth and rec.phase != "forward":  # a closure's forward runs inside the step
            rec.phase = "optimizer"
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextlib.contextmanager
def _phase_hooks(fs: FakeStep, rec: StorageRecorder, recording: PhasedRecording, info: ModelInfo,
                 param_owner: dict[int, str]) -> Iterator[None]:
    roles, owner = info.storage_roles, info.storage_owner

    def grad_role(p: torch.Tensor) -> None:
        track_gradient(p, rec, info, param_owner)

    def state_roles(opt: torch.optim.Optimizer) -> None:
        for p, state in opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor) and (v.dim() or rec.tracks(v) or v.device.type == "cpu"):
                    k = rec.track(v, "optimizer_state")
                    roles[k] = "optimizer_state"
                    owner[k] = param_owner.get(id(p), "")

    # per optimizer step running: whether a backward's hook called it, and the phase and modules it interrupted
    outer: list[tuple[bool, str, list[str]]] = []

    def pre(opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                grad_role(p)
        recording.optimizer_depth += 1
        in_backward = torch._C._current_graph_task_id() != -1  # (a closure's backward starts inside the step)
        recording.hook_steps += in_backward
        outer.append((in_backward, rec.phase, list(rec.module_stack)))
        rec.phase = "optimizer"
        rec.module_stack.clear()

    def post(opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        recording.optimizer_depth -= 1
        state_roles(opt)
        in_backward, phase, stack = outer.pop()
        if in_backward:  # a gradient hook's step: the backward goes on after it
            recording.hook_steps -= 1
            rec.phase = phase
            rec.module_stack[:] = stack

    thread = threading.get_ident()

    def forward_starts(mod: nn.Module, args: tuple[Any, ...]) -> None:
        # a module called outside autograd starts a forward, inside an optimizer's step too (a closure's); the
        # hook is global: another thread's modules (the app's other engine jobs) are none of this step's
        if threading.get_ident() != thread:
            return
        if rec.phase != "forward" and torch._C._current_graph_task_id() == -1:
            rec.phase = "forward"
            rec.module_stack.clear()

    handles = [nn.modules.module.register_module_forward_pre_hook(forward_starts)]
    for opt in fs.optimizers:
        handles += [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
    seen: set[int] = set()
    for m in fs.modules:
        for p in m.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                handle = p.register_post_accumulate_grad_hook(grad_role)  # type: ignore[no-untyped-call]
                # before the user's own (an optimizer step in the backward frees the gradient it is given)
                order = p._post_accumulate_grad_hooks
                assert isinstance(order, OrderedDict)  # (torch's: register_post_accumulate_grad_hook made it)
                order.move_to_end(handle.id, last=False)
                handles.append(handle)
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class _TracedAutocast(torch.amp.autocast_mode.autocast):
    """`torch.autocast(…)` in a user's step while it is traced: the dtype it casts to is noted (the configuration's
    precision), and for a CUDA target `torch.autocast("cuda", …)` becomes the CPU's autocast, which casts the trace's
    CPU tensors following CUDA's op lists (engine.cuda.target). For a CPU target CUDA's autocast stays as it is (off
    for CPU tensors), as in a real run on the CPU."""

    dtypes: list[torch.dtype] = []
    redirect = False

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if device_type == "cuda" and _TracedAutocast.redirect:
            device_type, dtype = "cpu", dtype or torch.float16  # CUDA's default autocast dtype
        if enabled and device_type == "cpu":
            _TracedAutocast.dtypes.append(dtype or torch.bfloat16)
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


@contextlib.contextmanager
def _traced_autocast(cuda: bool) -> Iterator[list[torch.dtype]]:
    seen: list[torch.dtype] = []
    _TracedAutocast.dtypes, _TracedAutocast.redirect = seen, cuda
    before = torch.autocast, torch.amp.autocast
    torch.autocast = torch.amp.autocast = _TracedAutocast  # type: ignore[misc]  # for this trace only
    try:
        yield seen
    finally:
        torch.autocast, torch.amp.autocast = before  # type: ignore[misc]


def user_line(e: BaseException) -> str | None:
    """file:line of the deepest frame of the user's own code: not torch's, the standard library's or ours, and
    outside installed packages when there is such a frame (else the deepest in a package: the model's library)."""
    own = lib = None
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        f = frame.f_code.co_filename
        if f.startswith((_TORCH, _STDLIB, *_OURS)) or f.startswith("<"):
            continue
        if f.startswith(_PACKAGES):
            lib = f"{_short(f)}:{lineno}"
        else:
            own = f"{_short(f)}:{lineno}"
    return own or lib


def _step_error(e: BaseException, name: str) -> UserError:
    where = user_line(e) or name
    first = " ".join((str(e).strip().splitlines() or [""])[0].split()) or "(no message)"
    if isinstance(e, _VALUE_ERRORS) or type(e).__name__ == "GuardOnDataDependentSymNode":
        return UserError(f"{where}: {name} needs a tensor's value (.item(), a comparison, printing, a shape "
                         "that depends on the data), which the fake tensors the step is traced on do not have; "
                         "keep such code out of the step (logging after it, for instance)")
    if isinstance(e, SystemExit):
        return UserError(f"{where}: {name} called sys.exit({e.code!r}) while it was traced")
    low = first.lower()
    if "cuda" in low and any(s in low for s in _CUDA_REFUSED):
        return UserError(f"{where}: {name} moves a tensor to CUDA, but the step is traced on fake CPU tensors (the "
                         "target is modelled, not used): move tensors to the model's device, e.g. "
                         "x.to(next(model.parameters()).device), not to 'cuda'")
    return UserError(f"{where}: {type(e).__name__}: {first} (in {name}, traced on fake tensors)")


def trace_user_step(step: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], cfg: TrainConfig, *,
                    cancel: CancelToken | None = None) -> tuple[Trace, ModelInfo, UserStep, TrainConfig]:
    """The exact allocation trace of two calls of `step` on fake copies of what it is given, its ModelInfo, what the
    step was made of (its function, models, optimizers, schedulers, whether it trained, its autocast) and `cfg` naming
    what it did (engine.trace.user_step._modelled_config)."""
    name = getattr(step, "__qualname__", None) or type(step).__name__
    check_closure(step)
    try:
        bound = inspect.signature(step).bind(*args, **kwargs)
    except TypeError as e:
        raise UserError(f"{_where_defined(step)}: {name} cannot take these arguments: {e}") from None
    except ValueError:  # no signature (a builtin): the arguments by position
        bound = None
    values = dict(bound.arguments) if bound is not None else {f"arg{i}": a for i, a in enumerate(args)} | kwargs
    if inspect.ismethod(step):
        values = {"self": step.__self__, **values}
    parts = find_parts(values)
    if not parts.modules:
        raise UserError(f"{name} is given no torch.nn.Module: pass the model(s) it trains as arguments")
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    fs = fake_copy(step, args, kwargs, parts, fm, cuda=cfg.device == "cuda")
    info = model_info(name, fs.root)
    rec = StorageRecorder(cancel=cancel)
    param_owner = track_model_state(fs.root, rec, info)
    for p, g in fs.grads:
        k = rec.track(g, "grad")
        info.storage_roles[k], info.storage_owner[k] = "gradients", param_owner.get(id(p), "")
    for opt in fs.optimizers:
        for param, state in opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    k = rec.track(v, "optimizer_state")
                    info.storage_roles[k], info.storage_owner[k] = "optimizer_state", param_owner.get(id(param), "")
    for t in fs.inputs:
        info.storage_roles.setdefault(rec.track(t, "input"), "inputs")
    recording, kernels, cuda_kernels = recording_modes(cfg, rec, fm, cfg.device == "cpu", mode=PhasedRecording)
    assert isinstance(recording, PhasedRecording)
    try:
        with user_code_output(), _traced_autocast(cfg.device == "cuda") as autocast, \
                rec.autocast_exits_in_allocation_order(), _phase_hooks(fs, rec, recording, info, param_owner), fm, \
                ModuleScopes(fs.root, rec), recording, kernels:
            for s in range(STEPS):
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                rec.step, rec.phase = s, "forward"
                rec.module_stack.clear()
                out = fs.fn(*fs.args, **fs.kwargs)
                del out
            rec.closed = True
    except (UserError, Cancelled, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - the user's step failed: one line naming their line
        if isinstance(e, Exception) and is_overflow(e):
            raise too_large("the step's tensors do not fit 64-bit sizes", "the batch or the model's sizes") from None
        raise _step_error(e, name) from None
    if cuda_kernels is not None:
        info.cuda_kernels = kernel_summary(rec.kernel_costs, cuda_kernels)
    check_live_bytes(rec.events, "the batch or the model's sizes")
    training = recording.backward_seen
    info.notes.append(f"your own step {name} ({_where_defined(step)}), called {STEPS} times on fake tensors")
    program = UserStep(
        function=f"{name} ({_where_defined(step)})",
        models=tuple(f"{n} ({type(m).__name__})" for n, m in parts.modules),
        optimizers=(*(f"{n} ({type(o).__name__})" for n, o in parts.optimizers), *fs.hook_optimizers),
        schedulers=tuple(parts.schedulers),
        training=training,
        autocast=str(autocast[0]).removeprefix("torch.") if autocast else None,
    )
    cfg = _modelled_config(cfg, fs, program)
    return to_trace(rec.events, info.storage_roles, cfg, "tracer"), info, program, cfg


def _modelled_config(cfg: TrainConfig, fs: FakeStep, program: UserStep) -> TrainConfig:
    """The configuration as far as it can name what the step did: train or inference, the precision (autocast's, or
    the weights' dtype), the first optimizer when the optimizer table knows its kind. The step itself is described
    in full by `program` (Estimate.step)."""
    dtypes = {p.dtype for m in fs.modules for p in m.parameters() if p.is_floating_point()}
    precision = {"bfloat16": "amp-bf16", "float16": "amp-fp16"}.get(program.autocast or "", "fp32")
    if precision == "fp32" and dtypes in ({torch.float16}, {torch.bfloat16}):
        precision = "fp16" if dtypes == {torch.float16} else "bf16"
    optimizer = "none"
    if fs.optimizers:
        opt = fs.optimizers[0]
        kind = type(opt).__name__
        if kind == "SGD":
            optimizer = "sgd-momentum" if opt.param_groups[0].get("momentum") else "sgd"
        else:
            optimizer = NAME_OF_CLASS.get(kind.lower(), "adam")
    batch = next((int(t.size(0)) for t in fs.inputs if t.dim() >= 1 and t.size(0) > 0), 1)
    return cfg.with_(mode="train" if program.training else "inference", precision=precision, optimizer=optimizer,
                     batch_size=batch)
