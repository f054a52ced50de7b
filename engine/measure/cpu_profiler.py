"""Real measurement on this machine's CPU: the same step, run for real under PyTorch's profiler.

The step runs exactly as in the tracer, with nothing of ours intercepting ops (an interposed dispatch mode
changes what some composite ops allocate). Every CPU allocator event is taken from the profiler, kernel
scratch included; categories come from the profiler's own memory analysis (torch.profiler._memory_profiler),
phases from the times the step entered them. The result is a Trace of the same type as the tracer's.
"""

from __future__ import annotations

import bisect
import time

import torch
from torch import nn
from torch._C._profiler import _ExtraFields_Allocation, _ExtraFields_PyCall, _ExtraFields_TorchOp, _ProfilerEvent
from torch.profiler import ProfilerActivity, profile as torch_profile
from torch.profiler._memory_profiler import Action, Category as TorchCategory, Key, MemoryProfile, TensorKey

from ..config.train_config import TrainConfig
from ..core.errors import Cancelled, UserError
from ..core.progress import CancelToken, Progress
from ..models.source import ModelSource
from ..models.sources import user_code_output
from ..results.types import Category, Estimate, Trace
from ..trace.compiled_step import compiled_for_real
from ..trace.cpu_kernels import kineto_results, quiet_profiler
from ..trace.recorded_step import ModelInfo, build_real, flat_tensors, mem_events
from ..trace.recorder import RawEvent
from ..trace.step import phase_count, run_steps
from ..trace.summary import summarise
from .cuda_profiler import profile_cuda

# (time_ns, ptr, signed bytes, innermost op, module) of one CPU allocator event
Allocation = tuple[int, int, int, str, str]
# (time_ns, step, phase) when the step entered a phase; the last one is (end, -1, "end")
Mark = tuple[int, int, str]

_CATEGORY: dict[TorchCategory | None, Category] = {
    TorchCategory.INPUT: Category.INPUTS,
    TorchCategory.TEMPORARY: Category.TEMPORARIES,
    TorchCategory.ACTIVATION: Category.ACTIVATIONS,
    TorchCategory.GRADIENT: Category.GRADIENTS,
    TorchCategory.AUTOGRAD_DETAIL: Category.TEMPORARIES,
    TorchCategory.PARAMETER: Category.PARAMETERS,
    TorchCategory.OPTIMIZER_STATE: Category.OPTIMIZER_STATE,
    None: Category.TEMPORARIES,
}


def _allocations(prof: torch_profile, names: dict[int, str] | None = None) -> list[Allocation]:
    """(time_ns, ptr, signed bytes, innermost op, module) of every CPU allocator event, in time order.

    The module comes from the profiler's own records: in forward, the innermost nn.Module call around the
    event (`names`: id(module) → qualified name); in backward, the module whose forward op has the autograd
    node's sequence number (the same module the tracer names when that module's gradient arrives).
    """
    names = names or {}
    roots = kineto_results(prof).experimental_event_tree()
    seq_module: dict[int, str] = {}  # forward op's sequence number → its module
    stack: list[tuple[_ProfilerEvent, str, bool]] = [(ev, "", False) for ev in roots]
    while stack:
        ev, mod, in_backward = stack.pop()
        fields = ev.typed[1]
        if isinstance(fields, _ExtraFields_PyCall) and fields.module is not None:
            mod = names.get(fields.module.self_ptr, mod)
        elif isinstance(fields, _ExtraFields_TorchOp):
            if ev.name.startswith("autograd::engine::evaluate_function"):
                in_backward = True
            elif not in_backward and mod and fields.sequence_number >= 0:
                seq_module.setdefault(fields.sequence_number, mod)
        stack.extend((c, mod, in_backward) for c in ev.children)
    out: list[Allocation] = []
    op_stack: list[tuple[_ProfilerEvent, str, str]] = [(ev, "", "") for ev in roots]
    while op_stack:
        ev, op, mod = op_stack.pop()
        fields = ev.typed[1]
        if isinstance(fields, _ExtraFields_TorchOp):
            op = ev.name
            if op.startswith("autograd::engine::evaluate_function"):
                mod = seq_module.get(fields.sequence_number, "")
        elif isinstance(fields, _ExtraFields_PyCall) and fields.module is not None:
            mod = names.get(fields.module.self_ptr, mod)  # recomputation under checkpointing, too
        op_stack.extend((c, op, mod) for c in ev.children)
        if isinstance(fields, _ExtraFields_Allocation) and fields.device.type == "cpu":
            out.append((ev.start_time_ns, fields.ptr, fields.alloc_size, op, mod))
    out.sort(key=lambda x: x[0])
    return out


def _baseline(model: nn.Module, inputs: object) -> dict[int, tuple[int, Category]]:
    """Storages alive before the step: parameters, buffers and inputs, by address."""
    base: dict[int, tuple[int, Category]] = {}
    for p in model.parameters():
        base.setdefault(p.untyped_storage().data_ptr(), (p.untyped_storage().nbytes(), Category.PARAMETERS))
    for b in model.buffers():
        base.setdefault(b.untyped_storage().data_ptr(), (b.untyped_storage().nbytes(), Category.BUFFERS))
    for t in flat_tensors(inputs):
        base.setdefault(t.untyped_storage().data_ptr(), (t.untyped_storage().nbytes(), Category.INPUTS))
    return base


def measure_cpu(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                progress: Progress | None = None) -> tuple[Trace, ModelInfo, int]:
    """Runs cfg's steps for real on the CPU. Returns (categorised trace, model info, peak bytes).
    `progress(fraction, text)` as each phase starts (0.1–0.7), then while the profiler's records are read.

    The peak is the bytes alive before the step (parameters, buffers, inputs) plus the highest running sum
    of the allocator's events during it.
    """
    if progress:
        progress(0.02, "building the model")
    model, inputs, info = build_real(source, cfg)
    base = _baseline(model, inputs)
    marks: list[Mark] = []
    total = phase_count(cfg)

    owners = _Owners(model)
    runner = compiled_for_real(model, inputs, cfg) if cfg.compile else model  # compiled before it is measured

    def set_phase(step: int, phase: str) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        marks.append((time.time_ns(), step, phase))
        owners.step = step
        if progress:
            progress(0.1 + 0.6 * min(len(marks) - 1, total) / total, f"step {step + 1}: {phase}")

    with quiet_profiler(), torch_profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        opt = run_steps(runner, inputs, cfg, set_phase, owners.after_backward, owners.after_optimizer)
        marks.append((time.time_ns(), -1, "end"))
    del opt
    if progress:
        progress(0.72, "reading the profiler's memory records")
    allocs = _allocations(prof, {id(m): n for n, m in model.named_modules()})
    end_ns = marks[-1][0]
    cur = peak = 0
    for t, _p, n, _op, _m in allocs:
        if t > end_ns:
            break
        cur += n
        peak = max(peak, cur)
    baseline = sum(n for n, _c in base.values())
    info.method = "real-cpu"
    if progress:
        progress(0.85, "sorting the memory into categories")
    trace = _categorised_trace(prof, allocs, base, marks, cfg, owners, info.storage_owner)
    return trace, info, baseline + peak


class _Owners:
    """Storage address → owning module of the parameters, buffers, gradients and optimizer state, as the
    tracer attributes them (a tied weight belongs to its first module). Gradients are taken after each
    backward and per step: set_to_none frees them and the next step may reuse an address for another one."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.param_owner: dict[int, str] = {}
        self.fixed: dict[int, str] = {}
        self.by_step: dict[int, dict[int, str]] = {}
        self.step = 0
        for mname, mod in model.named_modules():
            for p in mod.parameters(recurse=False):
                self.param_owner.setdefault(id(p), mname)
                self.fixed.setdefault(p.untyped_storage().data_ptr(), mname)
            for b in mod.buffers(recurse=False):
                self.fixed.setdefault(b.untyped_storage().data_ptr(), mname)

    def after_backward(self) -> None:
        seen = self.by_step.setdefault(self.step, {})
        for p in self.model.parameters():
            if p.grad is not None:
                seen.setdefault(p.grad.untyped_storage().data_ptr(), self.param_owner.get(id(p), ""))

    def after_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for p, state in opt.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                    self.fixed.setdefault(v.untyped_storage().data_ptr(), self.param_owner.get(id(p), ""))

    def of(self, ptr: int, step: int) -> str | None:
        return self.by_step.get(step, {}).get(ptr) or self.fixed.get(ptr)


_OWNED = (Category.PARAMETERS, Category.BUFFERS, Category.GRADIENTS, Category.OPTIMIZER_STATE)


def _categorised_trace(prof: torch_profile, allocs: list[Allocation], base: dict[int, tuple[int, Category]],
                       marks: list[Mark], cfg: TrainConfig, owners: _Owners | None = None,
                       storage_owner: dict[int, str] | None = None) -> Trace:
    """`owners` (address → module) fills `storage_owner` (trace storage → module) for the model's states."""
    mp = MemoryProfile(kineto_results(prof))
    cats = mp._categories
    times = [m[0] for m in marks]
    end_ns = marks[-1][0]

    def phase_at(t: int) -> tuple[int, str]:
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return 0, "setup"
        step, phase = marks[i][1], marks[i][2]
        return (marks[i - 1][1], marks[i - 1][2]) if phase == "end" and i > 0 else (step, phase)

    at = {(t, n): (op, m) for t, _p, n, op, m in allocs}
    raw: list[RawEvent] = []
    ids: dict[tuple[Key | str, int], int] = {}  # (profiler key, version) or ("unseen", address) -> trace key

    def key_of(k: tuple[Key | str, int]) -> int:
        return ids.setdefault(k, len(ids))

    seen_base: set[int] = set()
    category_of: dict[int, Category] = {}
    for t, action, (key, version), size in mp.timeline:
        if key.device.type != "cpu" or (t > end_ns and t != -1):
            continue
        nbytes = abs(size)  # the profiler signs some sizes and not others
        tensor = isinstance(key, TensorKey)
        cat = _CATEGORY[cats.get(key, version) if tensor else None]
        step, phase = phase_at(t) if t >= 0 else (0, "setup")
        op, module = at.get((t, nbytes)) or at.get((t, -nbytes)) or ("", "")
        if action == Action.PREEXISTING:
            ptr = key.storage.ptr if isinstance(key, TensorKey) else None
            if ptr is not None and ptr in base:
                seen_base.add(ptr)
                cat = base[ptr][1]
            k = key_of((key, version))
            raw.append(RawEvent(k, nbytes, 0, "setup", "", "pre-existing"))
            category_of[k] = cat
        elif action == Action.CREATE:
            if cat == Category.PARAMETERS:  # the profiler's data flow tags some optimizer temporaries
                cat = Category.TEMPORARIES  # (Adam's sqrt) so; parameters exist before the step, nothing made
                # during it is one
            k = key_of((key, version))
            raw.append(RawEvent(k, nbytes, step, phase, module, op))
            category_of[k] = cat
        elif action == Action.INCREMENT_VERSION:
            old = key_of((key, version))
            new = key_of((key, version + 1))
            new_cat = _CATEGORY[cats.get(key, version + 1) if tensor else None]
            if category_of.get(old) in (Category.PARAMETERS, Category.BUFFERS):  # updated in place (BN's counter)
                new_cat = category_of[old]
            if new_cat != category_of.get(old):
                raw.append(RawEvent(old, -nbytes, step, phase, module, op))
                raw.append(RawEvent(new, nbytes, step, phase, module, op))
                category_of[new] = new_cat
            else:
                ids[(key, version + 1)] = old
        elif action == Action.DESTROY:
            k = key_of((key, version))
            raw.append(RawEvent(k, -nbytes, step, phase, module, op))
    # Parameters/inputs no op touched are alive all the same.
    for ptr, (n, cat) in base.items():
        if ptr not in seen_base:
            k = key_of(("unseen", ptr))
            raw.insert(0, RawEvent(k, n, 0, "setup", "", "pre-existing"))
            category_of[k] = cat
    if owners is not None and storage_owner is not None:
        ptr_of = {k: _address(key, version) for (key, version), k in ids.items()}
        born: dict[int, int] = {}
        for e in raw:
            if e.nbytes > 0:
                born.setdefault(e.storage, e.step)
        for k, ptr in ptr_of.items():
            if ptr is not None and category_of.get(k) in _OWNED:
                m = owners.of(ptr, born.get(k, 0))
                if m is not None:
                    storage_owner.setdefault(k, m)
    events = mem_events(raw, lambda k: category_of.get(k, Category.TEMPORARIES))
    return Trace(events=events, source="profiler-cpu", device="cpu")


def _address(key: Key | str, version: int) -> int | None:
    """The storage address of a trace key's (profiler key, version): a tensor's storage pointer, or the address
    an ("unseen", address) baseline entry carries; None for keys without a storage."""
    if isinstance(key, TensorKey):
        return key.storage.ptr
    return version if key == "unseen" else None


def profile(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
            progress: Progress | None = None) -> Estimate:
    """The measured counterpart of engine.planning.estimator.estimate, on this machine (CUDA if present, else CPU).

    Callers check first that it fits (engine.planning.room.profile_within_room); any failure of the real run is one
    line."""
    on_gpu = cfg.device == "cuda" and torch.cuda.is_available()
    try:
        with user_code_output():
            return _measure(source, cfg, on_gpu, cancel=cancel, progress=progress)
    except (UserError, Cancelled, KeyboardInterrupt):
        raise
    except MemoryError:
        raise UserError("out of host memory while running the step for real on the CPU") from None
    except SystemExit as e:
        raise UserError(f"the model's code called sys.exit({e.code!r}) while it ran; a model must return its "
                        "output, not exit") from None
    except Exception as e:  # the estimate ran it on fake tensors; the real run can still fail (a data path)
        first = (str(e).strip().splitlines() or [""])[0]
        raise UserError(f"the real run failed: {type(e).__name__}: {first}") from None


def _measure(source: ModelSource | str, cfg: TrainConfig, on_gpu: bool, *, cancel: CancelToken | None = None,
             progress: Progress | None = None) -> Estimate:
    if on_gpu:
        return profile_cuda(source, cfg, cancel=cancel, progress=progress)
    return _profile_cpu(source, cfg, cancel=cancel, progress=progress)


def _profile_cpu(source: ModelSource | str, cfg: TrainConfig, *, cancel: CancelToken | None = None,
                 progress: Progress | None = None) -> Estimate:
    t0 = time.perf_counter()
    cpu_cfg = cfg.with_(device="cpu")
    try:
        trace, info, _peak = measure_cpu(source, cpu_cfg, cancel=cancel, progress=progress)
    except MemoryError:
        raise UserError("out of host memory while running the step for real on the CPU") from None
    if progress:
        progress(0.95, "summarising")
    est = summarise(trace, info, cpu_cfg, elapsed_s=time.perf_counter() - t0)
    if progress:
        progress(1.0, "done")
    return est
