"""The optimizers (and tensors) a user's step reaches beyond its arguments' plain structure: held by a model's
attributes (`model.opts`), by a trainer object, or by the parameters' gradient hooks (PyTorch's optimizer step fused
into the backward: a dict or list of per-parameter optimizers, or one given as a default argument or a partial's,
stepped and zeroed by a post-accumulate hook on each parameter).

The traced step runs on fake copies (engine.trace.user_step.fake_copy), the hooks copied with them
(engine.core.callable_copy): every optimizer found here has its state made fake before the copy and is traced as one
of the step's optimizers (its phases, its state's category). The canonical estimate brings its own optimizer, so
a model whose hooks step optimizers of their own is refused there, naming estimate_step."""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .callable_copy import held_values
from .code_origin import installed
from .errors import UserError
from .grad_hooks import grad_hooks, has_grad_hooks

_DEPTH = 6
_BUDGET = 200_000  # objects one walk visits at most (a dataset list a trainer holds is not walked to its end)
_SKIPPED = frozenset({"_parameters", "_buffers", "_modules"})  # (a module's tensors and submodules: walked as such)


@dataclass
class Reached:
    """What a walk found, each once, in the order met."""

    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    # (a module's parameters and buffers, an optimizer's state too)
    tensors: list[torch.Tensor] = field(default_factory=list)
    modules: list[nn.Module] = field(default_factory=list)  # the outermost met
    seen: dict[int, int] = field(default_factory=dict)  # object id -> the shallowest depth it was walked at
    visited: int = 0


def walk(x: object, found: Reached, depth: int = 0) -> None:
    """Optimizers and tensors in `x`: containers, plain objects' and modules' attributes, a scheduler's optimizer,
    what callables hold (engine.core.callable_copy.held_values), a few levels down."""
    if depth > _DEPTH or found.visited > _BUDGET or isinstance(x, (str, bytes, int, float, bool, type(None))):
        return
    if found.seen.get(id(x), _DEPTH + 1) <= depth:
        return
    first = id(x) not in found.seen
    found.seen[id(x)] = depth
    found.visited += 1
    if isinstance(x, torch.optim.Optimizer):
        if first:
            found.optimizers.append(x)
            found.tensors.extend(v for state in x.state.values() for v in state.values()
                                 if isinstance(v, torch.Tensor))
    elif isinstance(x, torch.Tensor):
        if first:
            found.tensors.append(x)
    elif isinstance(x, LRScheduler):
        walk(x.optimizer, found, depth + 1)
    elif isinstance(x, nn.Module):
        if first:
            found.modules.append(x)
            found.tensors.extend([*x.parameters(), *x.buffers()])
        for m in x.modules():
            found.seen[id(m)] = min(found.seen.get(id(m), depth), depth)
            for key, v in vars(m).items():
                if key not in _SKIPPED:
                    walk(v, found, depth + 1)
            for p in m._parameters.values():
                if p is not None:
                    for h in grad_hooks(p):
                        walk(h, found, depth + 1)
    elif isinstance(x, dict):
        for k, v in x.items():
            walk(k, found, depth + 1)
            walk(v, found, depth + 1)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            walk(v, found, depth + 1)
    elif isinstance(x, (types.ModuleType, type)) or \
            (isinstance(x, types.FunctionType) and installed(x.__globals__.get("__name__"))):
        return  # (a library's function holds the library's state, not the user's program's)
    elif callable(x) or hasattr(x, "__dict__"):  # (the user's objects and callables: any kind)
        for v in held_values(x).values():
            walk(v, found, depth + 1)


def _held_callables(model: nn.Module) -> list[object]:
    """What `model`'s copy will run of the user's: its modules' non-empty hook dicts and instance functions, its
    parameters' gradient hooks (one pass over the modules: a deep model has thousands, most holding none)."""
    held: list[object] = []
    for m in model.modules():
        for key, v in vars(m).items():
            if (isinstance(v, dict) and v and key.endswith("_hooks")) or isinstance(v, (types.FunctionType,
                                                                                      functools.partial)):
                held.append(v)
        for p in m._parameters.values():
            if p is not None and has_grad_hooks(p):
                held.extend(grad_hooks(p))
    return held


def hooks_reach(model: nn.Module) -> Reached:
    """What the callables `model`'s copy will run hold: its modules' hooks and instance functions, its parameters'
    gradient hooks (engine.core.callable_copy copies them through the model's memo)."""
    found = Reached()  # (the model's own tensors a callable holds are among them: its modules are not walked)
    held = _held_callables(model)
    if held:
        for m in model.modules():
            found.seen[id(m)] = -1
        for v in held:
            walk(v, found, 1)
    return found


def check_no_optimizer_in_hooks(model: nn.Module) -> None:
    """UserError where `model`'s parameters' gradient hooks, or its modules' hooks and instance functions, reach
    optimizers (an optimizer step in the backward, in any form: a global dict, a closure, a default argument, a
    partial, a bound method of a trainer): the canonical step (engine.trace.step) brings its own optimizer, so only
    the user's own step can be estimated."""
    seen: set[int] = set()
    held = [h for v in _held_callables(model) for h in (v.values() if isinstance(v, dict) else (v,))]
    for hook in held:
        if id(hook) in seen:
            continue
        seen.add(id(hook))
        found = Reached()
        walk(hook, found)
        if found.optimizers:
            inner = hook.func if isinstance(hook, functools.partial) else hook
            name = getattr(inner, "__qualname__", None) or type(inner).__name__  # (the user's: any callable)
            raise UserError(
                f"the model's hook {name} reaches {len(found.optimizers)} optimizer(s) "
                f"({type(found.optimizers[0]).__name__}: an optimizer step in the backward), and this estimate's "
                "step brings its own optimizer: estimate your own step instead, "
                "vramscope.estimate_step(step, model, inputs), with the step that calls backward()")
