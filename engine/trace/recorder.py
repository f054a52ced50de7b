"""Records every storage allocation and free of a PyTorch program, with the op, module, phase and step.

Works on fake tensors (the tracer) and on real ones. Frees are seen through weak references to storages.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import torch
from torch import nn
from torch._ops import OpOverload
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from ..core.errors import Cancelled
from ..core.progress import CancelToken
from ..cuda.fused import ENCODER_LAYER, OUT, Step, encoder_layer_sequence
from ..cuda.gpu_profile import KERNEL_OPS, OUTPUT
from ..cuda.kernel_probe import measure_kernel
from ..cuda.kernels import KernelCost, KernelModel, output_bytes, signature
from ..cuda.reduce import REDUCTION_OPS
from ..finetune.quantized_weights import Decompose
from . import grouped_mm
from .cpu_kernels import HALF_MATMULS, HALF_REDUCTIONS, PROBED_OPS, probe


class RawEvent(NamedTuple):
    """One storage allocation (nbytes > 0) or free (nbytes < 0) as recorded, before it is categorised."""

    storage: int  # the recorder's key of the storage
    nbytes: int
    step: int
    phase: str
    module: str
    op: str


class StorageRecorder:
    """Raw event log: RawEvents in time order."""

    def __init__(self, cancel: CancelToken | None = None) -> None:
        self.events: list[RawEvent] = []
        self.step = 0
        self.phase = "setup"
        self.module_stack: list[str] = []
        self.op = ""
        self.cancel = cancel
        self._live: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}  # id(storage) -> (ref, key)
        self._next_key = 0
        self.nbytes: dict[int, int] = {}
        self.alloc_index: dict[int, int] = {}
        self.closed = False  # set when the measured steps end: tear-down frees are not part of them
        self.kernel_costs: list[KernelCost] = []  # a CUDA target: the scratch of each kernel call costed
        self.paused = False  # while set, nothing is recorded; frees of tracked storages wait for resume()
        self._held_frees: list[tuple[int, int]] = []
        self._ordered_frees: list[RawEvent] | None = None  # frees held by frees_in_allocation_order
        self._moved: set[int] = set()  # id()s of the weak references of storages taken over by another
        # While set (engine.trace.folded_optimizer's window): storage key -> the block of the stack it belongs to.
        # Each op's new storages get the block of its inputs (a multi-tensor op's i-th output: its i-th input's).
        self.owners: dict[int, int] | None = None
        self.owner_now: int | None = None  # the block of the op being recorded (None: no block's, or several)
        self.owners_mixed = False  # set when an op read tensors of two blocks
        self.free_actor: dict[int, int] = {}  # a free's event index -> the block of the op last run when it came
        # While set (engine.trace.folded_trace's window): called with each op's arguments before it runs
        # (engine.trace.fold_reads: which block's tensors the model's code reads)
        self.reader: Callable[[tuple[Any, ...], dict[str, Any] | None], None] | None = None
        # While set (the same window): module name -> how many times its forward was entered (the cut container
        # checks that each block it hands out runs)
        self.entries: dict[str, int] | None = None

    @property
    def module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""

    def track(self, t: torch.Tensor, op: str | None = None, nbytes: int | None = None) -> int:
        st = t.untyped_storage()
        sid = id(st)
        entry = self._live.get(sid)
        if entry is not None and entry[0]() is st:
            return entry[1]
        key = self._next_key
        self._next_key += 1
        n = st.nbytes() if nbytes is None else nbytes
        self._watch(st, key, n)
        self.nbytes[key] = n
        self.alloc_index[key] = len(self.events)
        self.events.append(RawEvent(key, n, self.step, self.phase, self.module, op if op is not None else self.op))
        if self.owners is not None and self.owner_now is not None:
            self.owners[key] = self.owner_now
        return key

    def owner_of(self, t: object) -> int | None:
        """The block (owners) a tensor's storage belongs to, if any."""
        if self.owners is None or not isinstance(t, torch.Tensor) or not self.tracks(t):
            return None
        return self.owners.get(self.track(t))

    def set_owner(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[int | None] | None:
        """owner_now for an op on `args`: the one block its tensors belong to (several: owners_mixed). An op
        on a list of tensors (a `_foreach_` or fused optimizer kernel): its list's blocks, one per output
        (returned; an op that returns fewer, a stack or a cat, of several blocks' sets owners_mixed)."""
        first = args[0] if args else None
        if isinstance(first, (list, tuple)) and first and all(isinstance(t, torch.Tensor) for t in first):
            self.owner_now = None
            return [self.owner_of(t) for t in first]
        found = {o for t in op_tensors((args, kwargs)) if (o := self.owner_of(t)) is not None}
        if len(found) > 1:
            self.owners_mixed = True
        self.owner_now = found.pop() if len(found) == 1 else None
        return None

    def key_of(self, t: torch.Tensor) -> int | None:
        """The key of `t`'s storage if this recorder follows it (tracks nothing new)."""
        st = t.untyped_storage()
        entry = self._live.get(id(st))
        return entry[1] if entry is not None and entry[0]() is st else None

    def track_new(self, t: torch.Tensor, op: str | None = None) -> bool:
        """`track(t, op)`; True when `t`'s storage was not followed before (this is its allocation)."""
        before = self._next_key
        return self.track(t, op) >= before

    def tracks(self, t: torch.Tensor) -> bool:
        """Is `t`'s storage one this recorder follows?"""
        return self.key_of(t) is not None

    def _watch(self, st: torch.UntypedStorage, key: int, n: int) -> None:
        """Record the free of `key` (n bytes) when storage `st` dies, unless its bytes moved on (`take_over`)."""
        sid = id(st)

        def _freed(_ref: weakref.ref[torch.UntypedStorage], key: int = key, sid: int = sid, n: int = n,
                   rec: StorageRecorder = self) -> None:
            entry = rec._live.get(sid)
            if entry is not None and entry[0] is _ref:
                rec._live.pop(sid)
            if id(_ref) in rec._moved:  # its bytes live on in another storage
                rec._moved.discard(id(_ref))
                return
            if rec.paused:
                rec._held_frees.append((key, n))
            elif not rec.closed:
                rec._record_free(RawEvent(key, -n, rec.step, rec.phase, rec.module, rec.op))

        self._live[sid] = (weakref.ref(st, _freed), key)

    def take_over(self, new: torch.Tensor, old: torch.Tensor) -> bool:
        """`new` is `old`'s bytes updated in place (what autograd does when it sums two gradients and holds the only
        reference to the first): no allocation; the bytes are freed when `new`'s storage dies, not `old`'s.
        False (nothing done) when `old` is not a tracked storage of the same size."""
        old_st, new_st = old.untyped_storage(), new.untyped_storage()
        entry = self._live.get(id(old_st))
        if entry is None or entry[0]() is not old_st or id(new_st) in self._live:
            return False
        key = entry[1]
        if self.nbytes.get(key) != new_st.nbytes():
            return False
        self._moved.add(id(entry[0]))
        self._watch(new_st, key, self.nbytes[key])
        return True

    def _record_free(self, ev: RawEvent) -> None:
        if self._ordered_frees is not None:
            self._ordered_frees.append(ev)
        else:
            if self.owners is not None and self.owner_now is not None:
                self.free_actor[len(self.events)] = self.owner_now
            self.events.append(ev)

    @contextlib.contextmanager
    def frees_in_allocation_order(self) -> Iterator[None]:
        """Frees made inside (where nothing is allocated) are recorded when it ends, in the order their storages were
        allocated: C++ releases some batches in hash-map order, which changes from run to run (the autocast cache's
        weight casts at autocast's exit), and nothing tells their real order apart: the bytes after the batch, the
        allocator's state and every peak are the same in any order."""
        if self._ordered_frees is not None:  # already held (an autocast's exit inside another's)
            yield
            return
        held: list[RawEvent] = []
        self._ordered_frees = held
        try:
            yield
        finally:
            self._ordered_frees = None
            self.events.extend(sorted(held, key=lambda e: e.storage))

    @contextlib.contextmanager
    def autocast_exits_in_allocation_order(self) -> Iterator[None]:
        """While held, on this thread: every torch.autocast's exit (not only the step's own: a checkpoint's
        recompute under autocast in the backward, a model's own autocast) frees its cache's casts in allocation
        order (frees_in_allocation_order); the recompute's order changed from run to run."""
        with _AUTOCAST_LOCK:
            if _AUTOCAST_HOLDERS[0] == 0:
                _AUTOCAST_CLASS.__exit__ = _ordered_autocast_exit  # type: ignore[method-assign]
            _AUTOCAST_HOLDERS[0] += 1
        outer = _AUTOCAST_RECORDER.rec
        _AUTOCAST_RECORDER.rec = self
        try:
            yield
        finally:
            _AUTOCAST_RECORDER.rec = outer
            with _AUTOCAST_LOCK:
                _AUTOCAST_HOLDERS[0] -= 1
                if _AUTOCAST_HOLDERS[0] == 0:
                    _AUTOCAST_CLASS.__exit__ = _AUTOCAST_EXIT  # type: ignore[method-assign]

    def pause(self) -> None:
        """Stop recording (engine.trace.text_generation's skipped decode steps): allocations made meanwhile are not
        seen."""
        self.paused = True

    def resume(self, op: str) -> None:
        """Record again; tracked storages freed while paused are freed now, under `op`. The caller tracks what
        the paused work left alive (it is allocated after these frees: no peak the real run would not have)."""
        self.paused = False
        for key, n in self._held_frees:
            self.events.append(RawEvent(key, -n, self.step, self.phase, self.module, op))
        self._held_frees.clear()

    def live_keys(self) -> set[int]:
        """Keys of the tracked storages still alive."""
        return {key for _ref, key in self._live.values()}

    @property
    def next_key(self) -> int:
        """The key the next storage recorded will get."""
        return self._next_key

    def copied(self, n: int) -> int:
        """A new key for an allocation of `n` bytes that the caller appends itself (engine.trace.step_replay)."""
        key = self._next_key
        self._next_key += 1
        self.nbytes[key] = n
        self.alloc_index[key] = len(self.events)
        return key

    def transient(self, nbytes: int, op: str) -> int:
        """A kernel's own buffer allocated now (freed by `release`); its key."""
        key = self._next_key
        self._next_key += 1
        self.nbytes[key] = nbytes  # (a folded optimizer step pairs its free by size: engine.trace.folded_optimizer)
        self.events.append(RawEvent(key, nbytes, self.step, self.phase, self.module, f"{op} (kernel scratch)"))
        if self.owners is not None and self.owner_now is not None:
            self.owners[key] = self.owner_now
        return key

    def release(self, key: int, nbytes: int, op: str) -> None:
        self.events.append(RawEvent(key, -nbytes, self.step, self.phase, self.module, f"{op} (kernel scratch)"))

    def scratch(self, nbytes: int, op: str) -> None:
        """A transient allocation inside a kernel: allocated and freed within the op."""
        self.release(self.transient(nbytes, op), nbytes, op)


# StorageRecorder.autocast_exits_in_allocation_order: torch.autocast's exit, patched while any thread holds it (a
# count under a lock), each thread's frees held by the recorder it set for itself
_AUTOCAST_CLASS = torch.amp.autocast_mode.autocast
_AUTOCAST_EXIT = _AUTOCAST_CLASS.__exit__
_AUTOCAST_LOCK = threading.Lock()
_AUTOCAST_HOLDERS = [0]


class _ThisThreadsRecorder(threading.local):
    rec: StorageRecorder | None = None  # the recorder that holds this thread's autocast exits


_AUTOCAST_RECORDER = _ThisThreadsRecorder()


def _ordered_autocast_exit(self: torch.amp.autocast_mode.autocast, *exc: Any) -> Any:
    rec = _AUTOCAST_RECORDER.rec
    if rec is None:
        return _AUTOCAST_EXIT(self, *exc)
    with rec.frees_in_allocation_order():
        return _AUTOCAST_EXIT(self, *exc)


# Ops whose outputs, handed back by the fake tensor cache, differ from their fake kernel's: the oneDNN LSTM backward's
# weight gradients came back so that autograd took them as the parameters' .grad, where the kernel's own (and the
# real CPU run's) are copied into new ones (an empty_strided each, later in the backward). With the cache, a process's
# first CPU-target trace of an LSTM and its later ones differed in that order (RESULTS, thirteenth session).
_UNCACHED = frozenset({"mkldnn_rnn_layer.default", "mkldnn_rnn_layer_backward.default"})


# TorchDispatchMode's __init_subclass__ and __init__ carry no annotations in torch: the two ignores below.
class RecordingMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees every op's outputs; new storages become allocation events."""

    def __init__(self, rec: StorageRecorder, probe_cpu_kernels: bool = False, fake: FakeTensorMode | None = None,
                 cuda_kernels: KernelModel | None = None, decompose: Decompose | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # decompose(func, args, kwargs) -> the Python code a library kernel runs, traced op by op instead of the
        # op's fake kernel (which makes only the output): engine.finetune.quantized.decomposition.
        self.decompose = decompose
        self.rec = rec
        self.cuda_kernels = cuda_kernels  # a CUDA target: the scratch its kernels take (engine.cuda.kernels)
        self._calls = 0
        self.probe = probe_cpu_kernels
        self.fake = fake  # the FakeTensorMode below, or None on real tensors (measured, not modelled)
        self._cache_default = fake.cache_enabled if fake is not None else False

    def __torch_dispatch__(self, func: OpOverload[..., Any], types: Sequence[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        rec = self.rec
        if rec.paused:
            return func(*args, **(kwargs or {}))
        name = func.__name__
        rec.op = name
        per_output = rec.set_owner(args, kwargs) if rec.owners is not None else None
        if rec.reader is not None:
            rec.reader(args, kwargs)
        if self.fake is not None and _updates_in_place(func) and \
                all(isinstance(t, FakeTensor) and t.constant is None for t in args[0]):
            # An in-place multi-tensor update (the optimizer's step) allocates nothing, and fake tensors without
            # a known value (all but small constants such as step counts) hold none: nothing to run. Running
            # it costs a meta kernel per tensor, most of an optimizer step. (Real tensors, which a model built
            # for real may hold, are updated as usual.)
            return None
        if self.decompose is not None:
            impl = self.decompose(func, args, kwargs or {})
            if impl is not None:
                with self:
                    return impl(*args, **(kwargs or {}))
        if self.fake is not None:
            # Hashing the long tensor lists of foreach (optimizer) ops costs more than the fake cache saves; the
            # oneDNN RNN kernels' cached outputs are not what the kernel gives (_UNCACHED).
            self.fake.cache_enabled = self._cache_default and not name.startswith("_foreach") and \
                name not in _UNCACHED
        if name == grouped_mm.OP and grouped_mm.needs_stand_in(args):
            out = grouped_mm.fake_grouped_mm(func, args, kwargs or {})
        else:
            out = func(*args, **(kwargs or {}))
        if self.cuda_kernels is not None and name == "lift_fresh.default" and rec.phase == "optimizer" \
                and isinstance(out, torch.Tensor) and out.dim() == 0:
            # an optimizer's `step` counter: `torch.tensor(0.0)` without a device, which on a CUDA run is a CPU
            # tensor (only capturable or fused optimizers keep it on the GPU, made with `zeros`)
            return out
        flat, _ = tree_flatten(out)
        real = None
        if self.probe and (name in PROBED_OPS or
                           ((name in HALF_REDUCTIONS or name in HALF_MATMULS) and _has_half(args))):
            real = probe(func, args, kwargs or {})
            if real is not None and isinstance(out, tuple):
                out = _resized(out, real[1])
                flat = tree_flatten(out)[0]
        elif self.probe and _mixed_floats(args):
            real = probe(func, args, kwargs or {}, strict=False)
        # a fused kernel whose intermediates are known in order: those before its output, then after it
        steps = encoder_layer_sequence(args) if self.cuda_kernels is not None and name == ENCODER_LAYER else None
        cut = steps.index(OUT) if steps is not None else 0
        held: dict[str, tuple[int, int]] = {}
        cost = None
        if self.cuda_kernels is not None and name in KERNEL_OPS and steps is None:  # a known sequence is no rule
            kw = kwargs or {}
            cost = self.cuda_kernels.cost(name, signature(args, kw), output_bytes(out),
                                          measure=lambda: measure_kernel(func, args, kw))
            if cost is not None:
                rec.kernel_costs.append(cost)
        if steps is not None:
            _run_steps(rec, steps[:cut], held, name)
        if name == "add.Tensor" and _autograd_sums_in_place(rec.phase, args, kwargs or {}):
            rec.take_over(out, args[0])  # no allocation: the first gradient's bytes hold the sum
        outputs = [t for t in flat if isinstance(t, torch.Tensor) and t.device.type != "meta"]
        if self.cuda_kernels is not None and name in CUDA_ALLOCATION_ORDER and len(outputs) == \
                len(CUDA_ALLOCATION_ORDER[name]):
            outputs = [outputs[i] for i in CUDA_ALLOCATION_ORDER[name]]
        if cost is not None and cost.requests:
            _replay_requests(rec, cost.requests, outputs, name)
        elif per_output is not None and len(per_output) == len(outputs):
            for t, o in zip(outputs, per_output, strict=True):
                rec.owner_now = o
                rec.track(t, name)
            rec.owner_now = None  # the frees that follow are of no one op's block
        else:
            if per_output is not None and outputs and len({o for o in per_output if o is not None}) > 1:
                rec.owners_mixed = True  # one output of several blocks' tensors (a stack, a cat)
            for t in outputs:
                rec.track(t, name)
        if steps is not None:
            _run_steps(rec, steps[cut + 1:], held, name)
        if real is not None and real[0]:
            rec.scratch(real[0], name)
        if cost is not None and cost.scratch and not cost.requests:
            rec.scratch(cost.scratch, name)
        if self.cuda_kernels is not None and name in REDUCTION_OPS:
            staged = [(rec.transient(n, name), n) for n in self.cuda_kernels.reduction(name, args, kwargs or {})]
            for key, n in reversed(staged):  # both held while it runs, freed as the kernel's locals go
                rec.release(key, n, name)
        if self.fake is not None and name in MATMULS and real is None:  # a probed matmul measured its copies
            copied = _expanded_operand_bytes(args)
            if copied:  # BLAS needs a real leading stride: the kernel copies the operand, after its output exists
                rec.scratch(copied, name)
        return out


# ops whose CUDA kernels allocate their outputs in another order than they return them (the H200's GPT-2 trace):
# positions in the op's tensor outputs, in allocation order
CUDA_ALLOCATION_ORDER: dict[str, tuple[int, ...]] = {
    "native_dropout.default": (1, 0),  # the mask, then the output (Dropout.cu)
    # the philox seed and offset, then the output and the softmax statistics
    "_scaled_dot_product_cudnn_attention.default": (2, 3, 0, 1),
}

_TORCH = Path(torch.__file__).parent
_ENGINE_FRAME = ("_engine_run_backward", str(_TORCH / "autograd" / "graph.py"))
# frames between an op the autograd engine calls from C++ and this mode: torch's wrappers of __torch_dispatch__
_WRAPPER_FILES = (str(_TORCH / "_compile.py"), str(_TORCH / "_dynamo" / "eval_frame.py"), __file__)


def _autograd_sums_in_place(phase: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Is this `add.Tensor` autograd summing two gradients of one tensor (its InputBuffer) where a real backward
    would add the second into the first in place?

    Autograd sums in place when grad mode is off, the first gradient is dense and nothing else holds it or its
    storage; it checks that through `isTensorSubclassLike`, which is true whenever a dispatch mode is active, so
    under this mode (and any other) it adds out of place and allocates a third tensor a real step never makes.
    The call comes straight from the engine's C++ (no Python frame of a backward formula in between). Held
    elsewhere (a backward hook keeping grad_input, `h + h` giving one gradient to both sides): out of place, as
    for real — the first gradient then has more owners than the second, which the engine has just handed over.
    Not told apart: a C++ backward formula that adds two fresh temporaries itself (atan2's), counted in place."""
    if phase != "backward" or torch.is_grad_enabled() or kwargs.get("alpha", 1) != 1 or len(args) != 2:
        return False
    a, b = args
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a is b or a.shape != b.shape \
            or a.dtype != b.dtype or a.device != b.device or not is_non_overlapping_and_dense_or_false(a):
        return False
    # the storage's only owner is this tensor (one more reference: the storage object asked for here), and the
    # tensor has no more owners than the gradient just handed over (both: the buffer or the call, and this frame)
    owners = a._use_count() > b._use_count()  # type: ignore[attr-defined]  # Tensor._use_count is not in the stubs
    if torch._C._storage_Use_Count(a.untyped_storage()._cdata) != 2 or owners \
            or sys.getrefcount(a) > sys.getrefcount(b):
        return False
    f: FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename in _WRAPPER_FILES:
        f = f.f_back
    return f is not None and (f.f_code.co_name, f.f_code.co_filename) == _ENGINE_FRAME


def _replay_requests(rec: StorageRecorder, requests: tuple[int, ...], outputs: list[torch.Tensor], op: str) -> None:
    """A kernel call's allocations in the order the GPU made them (a calibration profile's record): each OUTPUT
    entry is the next output, any other the bytes of a scratch request freed before the call returned. Outputs
    the record did not see (an empty one) follow at the end."""
    rest = iter(outputs)
    for n in requests:
        if n == OUTPUT:
            for t in rest:  # an empty output, or one that is an input's storage, made no request on the GPU
                if rec.track_new(t, op) and t.untyped_storage().nbytes() > 0:
                    break
        else:
            rec.scratch(n, op)
    for t in rest:
        rec.track(t, op)


def _run_steps(rec: StorageRecorder, steps: list[Step], held: dict[str, tuple[int, int]], op: str) -> None:
    """A fused kernel's intermediates (engine.cuda.fused): (name, bytes) allocates, (name, 0) frees."""
    for buf, nbytes in steps:
        if nbytes:
            held[buf] = (rec.transient(nbytes, op), nbytes)
        elif buf in held:
            key, n = held.pop(buf)
            rec.release(key, n, op)


_IN_PLACE: dict[OpOverload[..., Any], bool] = {}


def _updates_in_place(func: OpOverload[..., Any]) -> bool:
    """A `_foreach_*_` op: writes its first tensor list, returns nothing."""
    known = _IN_PLACE.get(func)
    if known is None:
        s = func._schema
        first = s.arguments[0].alias_info if s.arguments else None
        known = _IN_PLACE[func] = (func.__name__.startswith("_foreach_") and not s.returns
                                   and first is not None and first.is_write)
    return known


MATMULS = frozenset({"mm.default", "addmm.default", "bmm.default", "baddbmm.default"})


def _expanded_operand_bytes(args: tuple[Any, ...]) -> int:
    """Bytes of the contiguous copies a matmul kernel makes of operands with a zero stride (an expanded
    gradient, such as the one `loss.sum()` sends back), on the CPU and with cuBLAS alike."""
    total = 0
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.numel() > 1 and 0 in a.stride()[-2:]:
            total += a.numel() * a.element_size()
    return total


def _mixed_floats(args: tuple[Any, ...]) -> bool:
    """Tensors of two floating dtypes given to one op (a bf16 base layer's output plus a float32 LoRA adapter's): the
    CPU's TensorIterator casts the other operands to their common dtype in temporaries of their full size first
    (CUDA's kernels cast as they read), so such a call is probed (cpu_kernels.probe). 0-dim tensors are scalars to
    it."""
    first = None
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() and a.is_floating_point():
            if first is None:
                first = a.dtype
            elif a.dtype != first:
                return True
    return False


def _has_half(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args)


def _resized(out: tuple[Any, ...], real_nbytes: tuple[int, ...]) -> tuple[Any, ...]:
    """Outputs whose size only the real kernel knows (oneDNN workspaces) are replaced by ones of that size."""
    items = list(out)
    j = 0
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            continue
        if j < len(real_nbytes) and t.dim() == 1 and t.untyped_storage().nbytes() != real_nbytes[j]:
            items[i] = torch.empty(real_nbytes[j] // t.element_size(), dtype=t.dtype, device=t.device)
        j += 1
    return tuple(items)


class ModuleScopes:
    """Keeps the recorder's module stack in forward (global hooks) and backward (grad hooks on outputs)."""

    def __init__(self, model: nn.Module, rec: StorageRecorder) -> None:
        self.rec = rec
        self.names = {id(m): n for n, m in model.named_modules()}
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> ModuleScopes:
        rec = self.rec
        names = self.names

        def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
            name = names.get(id(mod))
            if name is None:  # not this model's: the hooks are global, another thread's estimate calls them too
                return
            # Cancellation is checked here, between modules, in Python: an exception raised inside an op's
            # dispatch (C++ below and above it) on a worker thread has aborted the process.
            if rec.cancel is not None and rec.cancel.is_set():
                raise Cancelled()
            rec.module_stack.append(name)
            entries = rec.entries
            if entries is not None:
                entries[name] = entries.get(name, 0) + 1

        def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
            name = names.get(id(mod))
            if name is None:
                return out
            if rec.module_stack and rec.module_stack[-1] == name:
                rec.module_stack.pop()
            if torch.is_grad_enabled():
                self._mark_backward(name, out)
            return out

        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(pre),
            nn.modules.module.register_module_forward_hook(post),
        ]
        return self

    def _mark_backward(self, name: str, out: Any) -> None:
        # The gradient flowing into a module's output marks the start of that module's backward.
        rec = self.rec
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:

                def hook(grad: torch.Tensor, name: str = name) -> None:
                    if rec.phase == "backward":
                        rec.module_stack[:] = [name]
                    return None

                t.register_hook(hook)  # type: ignore[no-untyped-call]  # Tensor.register_hook is unannotated
                break

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class PtrRecorder(StorageRecorder):
    """A StorageRecorder that also keeps each storage's address, to match allocator events (CUDA profile)."""

    def __init__(self, cancel: CancelToken | None = None) -> None:
        super().__init__(cancel)
        self.ptr_of: dict[int, int] = {}

    def track(self, t: torch.Tensor, op: str | None = None, nbytes: int | None = None) -> int:
        before = self._next_key
        key = super().track(t, op, nbytes)
        if key == before:  # a new storage
            self.ptr_of[key] = t.untyped_storage().data_ptr()
        return key


def op_tensors(x: object) -> Iterator[torch.Tensor]:
    """The tensors in an op's arguments (in lists, tuples and dicts, at any depth), as tree_flatten finds them,
    without building its spec (set_owner asks it for every op of a folded optimizer step)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from op_tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from op_tensors(y)
