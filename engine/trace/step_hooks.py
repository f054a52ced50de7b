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

from ..core.callable_copy import held_values
from ..core.code_origin import installed
from ..core.errors import UserError
from ..core.grad_hooks import grad_hooks

_DEPTH = 6
_SKIPPED = frozenset({"_parameters", "_buffers", "_modules"})  # (a module's tensors and submodules: walked as such)


@dataclass
class Reached:
    """What a walk found, each once, in the order met."""

    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)  # (a module's parameters and buffers too)
    modules: list[nn.Module] = field(default_factory=list)  # the outermost met
    seen: set[int] = field(default_factory=set)


def walk(x: object, found: Reached, depth: int = 0) -> None:
    """Optimizers and tensors in `x`: containers, plain objects' and modules' attributes, a scheduler's optimizer,
    what callables hold (engine.core.callable_copy.held_values), a few levels down."""
    if id(x) in found.seen or depth > _DEPTH or isinstance(x, (str, bytes, int, float, bool, type(None))):
        return
    found.seen.add(id(x))
    if isinstance(x, torch.optim.Optimizer):
        found.optimizers.append(x)
    elif isinstance(x, torch.Tensor):
        found.tensors.append(x)
    elif isinstance(x, LRScheduler):
        walk(x.optimizer, found, depth + 1)
    elif isinstance(x, nn.Module):
        found.modules.append(x)
        found.tensors.extend(t for t in (*x.parameters(), *x.buffers()) if id(t) not in found.seen)
        found.seen.update(id(t) for t in found.tensors)
        for m in x.modules():
            found.seen.add(id(m))
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


def check_no_optimizer_in_hooks(model: nn.Module) -> None:
    """UserError where `model`'s parameters' gradient hooks reach optimizers (an optimizer step in the backward, in
    any form: a global dict, a closure, a default argument, a partial, a bound method of a trainer): the canonical step
    (engine.trace.step) brings its own optimizer, so only the user's own step can be estimated."""
    seen: set[int] = set()
    for p in model.parameters():
        for hook in grad_hooks(p):
            if id(hook) in seen:
                continue
            seen.add(id(hook))
            found = Reached()
            walk(hook, found)
            if found.optimizers:
                inner = hook.func if isinstance(hook, functools.partial) else hook
                name = getattr(inner, "__qualname__", None) or type(inner).__name__  # (the user's: any callable)
                raise UserError(
                    f"the parameters' gradient hook {name} reaches {len(found.optimizers)} optimizer(s) "
                    f"({type(found.optimizers[0]).__name__}: an optimizer step in the backward), and this estimate's "
                    "step brings its own optimizer: estimate your own step instead, "
                    "vramscope.estimate_step(step, model, inputs), with the step that calls backward()")
