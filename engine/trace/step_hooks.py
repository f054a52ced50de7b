"""A user's own step whose parameters' gradient hooks reach the step's objects from outside its arguments: PyTorch's
"optimizer step fused into the backward" (a dict of per-parameter optimizers, stepped and zeroed by a post-accumulate
hook on each parameter), a hook reading a model or a tensor kept in a global.

The traced step runs on fake copies (engine.trace.user_step.fake_copy). A hook carried over as it is would reach the
user's real objects: a dict keyed by the real parameters (KeyError on the fake ones), the real optimizers. So each
such hook is copied too, its globals and closure cells that hold models, optimizers or tensors deep-copied through
the same memo as the step's arguments: the copies' optimizers step the copies' parameters, and are traced as the
step's own optimizers. What a hook reaches must belong to the step's models (a model or parameter not given to the
step would be copied for real): anything else is refused by name, as a step's own global model is."""

from __future__ import annotations

import copy
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.errors import UserError
from ..core.grad_hooks import grad_hooks


@dataclass
class HookReach:
    """What the parameters' hooks reach outside the step's arguments, found before the copy."""

    # (hook function, names of its globals and closure cells to copy)
    hooks: dict[int, tuple[types.FunctionType, tuple[str, ...]]] = field(default_factory=dict)
    optimizers: list[tuple[str, torch.optim.Optimizer]] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)


def _reached(fn: types.FunctionType) -> dict[str, Any]:
    try:
        cv = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return {}
    return {**cv.globals, **cv.nonlocals}


def _walk(x: object, found: list[object], seen: set[int], depth: int = 0) -> None:
    """The modules, optimizers and tensors in `x` (containers and plain objects a few levels down)."""
    if id(x) in seen or depth > 4:
        return
    seen.add(id(x))
    if isinstance(x, (nn.Module, torch.optim.Optimizer, torch.Tensor)):
        found.append(x)
    elif isinstance(x, dict):
        for k, v in x.items():
            _walk(k, found, seen, depth + 1)
            _walk(v, found, seen, depth + 1)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            _walk(v, found, seen, depth + 1)


def find_reach(modules: list[nn.Module]) -> HookReach:
    """The hooks on `modules`' parameters that reach models, optimizers or tensors from outside, and what they reach.
    UserError where that is not the step's: a model, or an optimizer of parameters, not among `modules`'."""
    reach = HookReach()
    params = {id(p) for m in modules for p in m.parameters()}
    owned = {id(x) for m in modules for x in (*m.modules(), *m.parameters(), *m.buffers())}
    seen_opts: set[int] = set()
    for m in modules:
        for p in m.parameters():
            for hook in grad_hooks(p):
                if not isinstance(hook, types.FunctionType) or id(hook) in reach.hooks:
                    continue
                names = []
                for name, value in _reached(hook).items():
                    found: list[object] = []
                    _walk(value, found, set())
                    if not found:
                        continue
                    names.append(name)
                    for x in found:
                        if isinstance(x, torch.optim.Optimizer):
                            if any(id(q) not in params for g in x.param_groups for q in g["params"]):
                                raise _refused(hook, name, "an optimizer of parameters the step is not given")
                            if id(x) not in seen_opts:
                                seen_opts.add(id(x))
                                reach.optimizers.append((f"{name} (in the gradient hook {hook.__name__})", x))
                        elif isinstance(x, nn.Module) and id(x) not in owned:
                            raise _refused(hook, name, f"a {type(x).__name__} the step is not given")
                        elif isinstance(x, torch.Tensor) and id(x) not in owned:
                            reach.tensors.append(x)
                if names:
                    reach.hooks[id(hook)] = (hook, tuple(names))
    return reach


def check_no_optimizer_in_hooks(model: nn.Module) -> None:
    """UserError where `model`'s parameters' gradient hooks step optimizers of their own (an optimizer step in the
    backward): the canonical step (engine.trace.step) brings its own optimizer, so only the user's own step can be
    estimated, and the hooks would reach the user's real optimizers."""
    for p in model.parameters():
        for hook in grad_hooks(p):
            if not isinstance(hook, types.FunctionType):
                continue
            for name, value in _reached(hook).items():
                found: list[object] = []
                _walk(value, found, set())
                if any(isinstance(x, torch.optim.Optimizer) for x in found):
                    code = hook.__code__
                    raise UserError(
                        f"{code.co_filename}:{code.co_firstlineno}: the parameters' gradient hook {hook.__name__} "
                        f"steps the optimizers in '{name}' (an optimizer step in the backward), and this estimate's "
                        "step brings its own optimizer: estimate your own step instead, "
                        "vramscope.estimate_step(step, model, inputs), with the step that calls backward()")


def _refused(hook: types.FunctionType, name: str, what: str) -> UserError:
    code = hook.__code__
    return UserError(f"{code.co_filename}:{code.co_firstlineno}: the gradient hook {hook.__name__} uses '{name}', "
                     f"which holds {what}: pass the model to the step so that a fake copy is traced instead of the "
                     "real one being trained")


def rebind_hooks(params: list[torch.Tensor], reach: HookReach, memo: dict[int, Any]) -> None:
    """The hooks on `params` (the fake copies, carrying the user's hooks) that reach the step's objects replaced by
    copies reaching the fake copies (`memo`: the step's deep copy's, filled)."""
    copies: dict[int, Callable[..., Any]] = {}
    for hook, names in reach.hooks.values():
        copies[id(hook)] = _copied(hook, names, memo)
    if not copies:
        return
    for p in params:
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            hooks = getattr(p, attr)  # (torch's two hook dicts: engine.core.grad_hooks)
            if hooks:
                for key, h in list(hooks.items()):
                    hooks[key] = copies.get(id(h), h)


def _copied(hook: types.FunctionType, names: tuple[str, ...], memo: dict[int, Any]) -> types.FunctionType:
    g = hook.__globals__
    new_globals = dict(g)
    for name in names:
        if name in hook.__code__.co_freevars:
            continue
        new_globals[name] = copy.deepcopy(g[name], memo)
    closure = hook.__closure__
    if closure is not None:
        closure = tuple(types.CellType(copy.deepcopy(cell.cell_contents, memo)) if free in names else cell
                        for free, cell in zip(hook.__code__.co_freevars, closure, strict=True))
    new = types.FunctionType(hook.__code__, new_globals, hook.__name__, hook.__defaults__, closure)
    new.__kwdefaults__ = hook.__kwdefaults__
    new.__qualname__ = hook.__qualname__
    return new
