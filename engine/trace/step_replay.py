"""The second traced step's forward and backward, reproduced from the first instead of run again.

The steady-state step differs from the first only in what already exists (optimizer state), not in what its
forward and backward allocate: the same ops, shapes, modules and order. Where the first step shows that
(every storage its forward/backward made is gone by the end of the step, apart from the gradients the
optimizer used, and no module's own attributes changed), its events are copied with new storage keys and
fresh gradient tensors are put in place for the real optimizer step that follows. Anything else (a cache
filled at the first call, a lazily made scale, a call counter or an "initialized" flag, gradients sharing one
buffer) makes it decline, and the step is run for real. State kept outside the modules (globals, closures)
is not seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch

from .recorder import RawEvent, StorageRecorder

# a gradient as the previous step left it: (parameter, size, stride, dtype, storage bytes)
GradSpec = tuple[torch.nn.Parameter, tuple[int, ...], tuple[int, ...], torch.dtype, int]
# each module's own attributes, fingerprinted: (module path, attribute) → what it holds
ModuleState = dict[tuple[str, str], Any]


class StepReplay:
    """`grads_seen(params)` after each backward; `__call__(step)` before a step's forward (True: replayed)."""

    def __init__(self, rec: StorageRecorder, roles: dict[int, str], model: torch.nn.Module,
                 virtual: dict[tuple[int, str], int] | None = None, idle: set[int] | None = None) -> None:
        self.rec = rec
        # modules that never run in this trace (a folded trace's blocks past the cut: DepthFold.idle_modules): no
        # call can change their attributes, so they are not fingerprinted
        self.idle = idle or set()
        # gradients that are storages of the trace only (a folded trace's written-out blocks':
        # engine.trace.folded_trace.DepthFold.virtual), by their slot: the copy gives each slot its new storage
        self.virtual = virtual if virtual is not None else {}
        self.roles = roles
        self.model = model
        self.grad_of: dict[int, GradSpec] = {}  # gradient storage key → how to make it again
        self.ok = True  # False once something the copy cannot reproduce was seen
        self.state_before: ModuleState | None = None

    def step_starts(self, step: int) -> None:
        """Called as each step's forward begins: the modules' own state before the first one."""
        if step == 0 and self.state_before is None:
            self.state_before = _module_state(self.model, self.idle)

    def grads_seen(self, params: Iterable[torch.nn.Parameter]) -> None:
        rec = self.rec
        owner: dict[int, int] = {}
        for p in params:
            g = p.grad
            if g is None:
                continue
            if g.layout != torch.strided or g.storage_offset() != 0 or g.untyped_storage().nbytes() == 0:
                self.ok = False
                continue
            k = rec.track(g, "grad")
            if owner.setdefault(k, id(p)) != id(p):  # two parameters' gradients in one buffer
                self.ok = False
            self.grad_of[k] = (p, tuple(g.size()), tuple(g.stride()), g.dtype, rec.nbytes[k])

    def __call__(self, step: int) -> bool:
        if not self.ok or step < 1:
            return False
        rec = self.rec
        events = rec.events
        window = [i for i, e in enumerate(events) if e.step == step - 1 and e.phase in ("forward", "backward")]
        if not window or window[-1] - window[0] + 1 != len(window):
            return False
        lo, hi = window[0], window[-1] + 1
        made = {e.storage for e in events[lo:hi] if e.nbytes > 0}
        freed = {e.storage for e in events[lo:hi] if e.nbytes < 0}
        live = rec.live_keys()
        kept = made - freed  # must be exactly the gradients, freed since by zero_grad(set_to_none=True)
        slots = {k: slot for slot, k in self.virtual.items()}
        if freed - made or made & live or not kept <= set(self.grad_of) | set(slots) or \
                any(self.roles.get(k) not in (None, "gradients") for k in made):
            return False
        if any(p.grad is not None for p, *_ in self.grad_of.values()):
            return False
        if self.state_before is None or _module_state(self.model, self.idle) != self.state_before:
            return False  # a counter, a flag, an object made at the first call: the next call may differ

        new_key: dict[int, int] = {}
        copied, append = rec.copied, events.append
        for e in events[lo:hi]:
            k = e.storage
            if k in kept:
                slot = slots.get(k)
                if slot is not None and e.nbytes > 0:
                    new = self.virtual[slot] = copied(e.nbytes)
                    append(RawEvent(new, e.nbytes, step, e.phase, e.module, e.op))
                elif e.nbytes > 0:
                    self._new_grad(k, e.phase, e.module, e.op, step)
                continue
            n = new_key.get(k)
            if n is None:  # its allocation (a zero-byte storage's free is a 0 too)
                n = new_key[k] = copied(e.nbytes)
            append(RawEvent(n, e.nbytes, step, e.phase, e.module, e.op))
        self.grad_of = {k: v for k, v in self.grad_of.items() if k not in kept}
        return True

    def _new_grad(self, key: int, phase: str, module: str, op: str, step: int) -> None:
        """A gradient like the previous step's, allocated here (recorded as that op's output)."""
        rec = self.rec
        p, size, stride, dtype, nbytes = self.grad_of[key]
        rec.step, rec.phase, rec.module_stack[:] = step, phase, [module] if module else []
        before = len(rec.events)
        if _storage_bytes(size, stride, dtype) == nbytes:
            g = torch.empty_strided(size, stride, dtype=dtype, device=p.device)
        else:  # the previous gradient was a view of a larger buffer: that buffer alone, as autograd made it
            g = torch.empty(nbytes, dtype=torch.uint8, device=p.device).view(dtype).as_strided(size, stride)
        k = rec.track(g, op)  # already seen by the recording mode, or recorded now
        i = next(j for j in range(before, len(rec.events))
                 if rec.events[j].storage == k and rec.events[j].nbytes >= 0)
        rec.events[i] = RawEvent(k, nbytes, step, phase, module, op)  # as the op that made it in the last step
        p.grad = g


def _storage_bytes(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes `torch.empty_strided(size, stride, dtype=dtype)` allocates (asked before making it: a tensor made
    and dropped would be an allocation and a free the step does not make)."""
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))) * dtype.itemsize


def _module_state(model: torch.nn.Module, idle: set[int]) -> ModuleState:
    """Each module's own attributes (not its parameters, buffers or children), one level deep: plain values as
    they are, tensors by shape, containers by what they hold, anything else by identity; `idle` modules (by id)
    left out."""
    return {(name, key): _fingerprint(value)
            for name, mod in model.named_modules() if id(mod) not in idle for key, value in vars(mod).items()
            if key not in ("_parameters", "_buffers", "_modules") and "_hooks" not in key}  # (hooks: their own dicts)


_PLAIN = (bool, int, float, str, bytes, type(None))


def _item(x: object) -> object:
    if isinstance(x, weakref.ref):
        x = x()
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, torch.Tensor):  # by shape: tensors made or kept by a call are the storage checks' business
        return ("tensor", tuple(x.shape), x.dtype)  # (RNNs re-list their weights at their first call)
    return ("id", id(x))


def _fingerprint(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_item(x) for x in value))
    if isinstance(value, dict):
        return ("map", tuple((k, _item(v)) for k, v in value.items()))
    return _item(value)
