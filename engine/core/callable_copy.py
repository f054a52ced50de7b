"""Copies of the user's callables (a parameter's gradient hook, a module's hook, a `forward` set on an instance) that
reach copies of what they held instead of the user's live objects.

An estimate works on copies of the user's model and step objects (engine.models.object_source.copy_module,
engine.trace.user_step.fake_copy: `copy.deepcopy` with a memo mapping each tensor to its copy). `copy.deepcopy`
keeps a function as it is, so a copied model's hooks and instance functions would still reach the user's own
objects: a hook's counter would count in the user's program, a logging hook would put fake tensors in the user's
list, a hook stepping an optimizer held as a default argument would train the user's real model, a `forward` set on
the instance that calls the original bound method would run the user's real module. Here each such callable is
copied through the same memo:

- a function: the globals its code loads (data only: not modules, functions or classes), its closure cells, its
  defaults; its code and the rest of its globals are shared;
- a `functools.partial`: its function, arguments and keywords; a bound method: its object (the function shared);
- any other callable object: deep-copied, its state with it.

A `RemovableHandle` the user kept refers to the copy's hook dicts once the memo maps the user's dicts to them
(`map_hook_dicts`), so a hook that removes itself removes its copy. What a function called by the hook holds is not
copied (one level)."""

from __future__ import annotations

import copy
import dis
import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

from .code_origin import installed
from .errors import UserError
from .grad_hooks import HOOK_DICTS

_CODE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
         types.MethodDescriptorType, types.WrapperDescriptorType)


def global_names(code: types.CodeType) -> set[str]:
    """The global names `code` loads (its LOAD_GLOBAL / LOAD_NAME instructions, and its nested functions'), not the
    attribute names that `co_names` also holds (`self.model` is no global `model`)."""
    names: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL") and \
                isinstance(ins.argval, str):
            names.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


def held_values(fn: object) -> dict[str, object]:
    """What a callable holds, by name: a function's loaded globals, closure cells and defaults; a partial's function
    and arguments; a bound method's object; another callable object's attributes."""
    if isinstance(fn, types.FunctionType):
        g = fn.__globals__
        out: dict[str, object] = {n: g[n] for n in global_names(fn.__code__) if n in g}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            try:
                out[name] = cell.cell_contents
            except ValueError:  # (a cell not filled yet)
                continue
        for i, d in enumerate(fn.__defaults__ or ()):
            out[f"default {i}"] = d
        out.update({f"default {k}": v for k, v in (fn.__kwdefaults__ or {}).items()})
        return out
    if isinstance(fn, functools.partial):
        return {"function": fn.func, **{f"argument {i}": a for i, a in enumerate(fn.args)},
                **{f"argument {k}": v for k, v in fn.keywords.items()}}
    if isinstance(fn, types.MethodType):
        return {"self": fn.__self__}
    try:
        return dict(vars(fn))
    except TypeError:
        return {}


def copy_callable(fn: Callable[..., Any], memo: dict[int, Any], done: dict[int, Any],
                  copied: bool = False) -> Callable[..., Any]:
    """`fn` copied to reach copies of what it holds (`memo`: the deep copy's; `done`: callables copied already, by
    id, so one hook shared by many parameters stays one copy, its state shared as the user's is). `copied`: `fn`
    came through that deep copy already (a module's hook, a partial set on an instance), which rebound a bound
    method's object, a partial's arguments and a callable object's state; only the plain functions in it, which a
    deep copy keeps as they are, are copied then. UserError naming what cannot be copied."""
    key = id(fn)
    if key in done:
        return done[key]  # type: ignore[no-any-return]  # (what this function put there)
    if isinstance(fn, types.FunctionType):
        # (a library's function is shared: what it holds is the library's, not the user's program's)
        new: Callable[..., Any] = fn if installed(fn.__globals__.get("__name__")) else _copied_function(fn, memo, done)
    elif isinstance(fn, functools.partial):
        func = copy_callable(fn.func, memo, done, copied)
        if copied and func is fn.func:
            new = fn
        else:
            args = fn.args if copied else _deep(fn.args, memo, fn, "its arguments")
            keywords = fn.keywords if copied else _deep(fn.keywords, memo, fn, "its keywords")
            new = functools.partial(func, *args, **keywords)
            new.__dict__.update(fn.__dict__)  # (functools.update_wrapper's __wrapped__, __name__: accelerate's)
    elif copied or (isinstance(fn, _CODE) and not isinstance(fn, types.MethodType)):
        new = fn
    elif isinstance(fn, types.MethodType):
        new = types.MethodType(fn.__func__, _deep(fn.__self__, memo, fn, "its object"))
    else:
        new = _deep(fn, memo, fn, "its state")
    done[key] = new
    return new


def _copied_function(fn: types.FunctionType, memo: dict[int, Any], done: dict[int, Any]) -> types.FunctionType:
    g = fn.__globals__
    # (data and bound methods: a `forward` override calling the original module's bound forward reaches its copy)
    names = [n for n in global_names(fn.__code__) if n in g and
             (not isinstance(g[n], _CODE) or isinstance(g[n], types.MethodType))]
    globals_ = g
    if names:
        globals_ = dict(g)
        for n in names:
            globals_[n] = _deep(g[n], memo, fn, f"'{n}'")
    closure = fn.__closure__
    if closure is not None:
        cells = []
        for name, cell in zip(fn.__code__.co_freevars, closure, strict=True):
            try:
                value = cell.cell_contents
            except ValueError:
                cells.append(cell)
                continue
            if isinstance(value, (types.FunctionType, functools.partial)):
                cells.append(types.CellType(copy_callable(value, memo, done)))
            elif isinstance(value, _CODE) and not isinstance(value, types.MethodType):
                cells.append(cell)
            else:
                cells.append(types.CellType(_deep(value, memo, fn, f"'{name}'")))
        closure = tuple(cells)
    defaults = _deep(fn.__defaults__, memo, fn, "its defaults") if fn.__defaults__ else fn.__defaults__
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, defaults, closure)
    new.__kwdefaults__ = _deep(fn.__kwdefaults__, memo, fn, "its defaults") if fn.__kwdefaults__ else None
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new


def _deep(value: Any, memo: dict[int, Any], fn: object, what: str) -> Any:
    if type(value).__module__ == "numpy":  # (an array a hook reads: shared, not copied with its data)
        return value
    if isinstance(value, weakref.ref):  # (kept as it is by a deep copy: one to what was copied points at the copy)
        target = value()
        return weakref.ref(memo[id(target)]) if target is not None and id(target) in memo else value
    try:
        return copy.deepcopy(value, memo)
    except Exception as e:  # noqa: BLE001 - the user's objects: a failure to copy them is one line
        first = "it refers to itself too deeply" if isinstance(e, RecursionError) else \
            (str(e).strip().splitlines() or [""])[0]
        name = getattr(fn, "__qualname__", None) or type(fn).__name__  # (the user's callable: any kind)
        raise UserError(f"{name} holds {what} ({type(value).__name__}), which cannot be copied with copy.deepcopy, "
                        f"which the estimate needs to leave your objects unchanged: {type(e).__name__}: {first}"
                        ) from None


# a module's hooks that run in a training step
_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def map_hook_dicts(src: Any, dst: Any, memo: dict[int, Any]) -> None:
    """The memo maps `src`'s gradient-hook dicts (a parameter's) to `dst`'s (its copy's, carried: grad_hooks), so that
    a RemovableHandle copied through the memo removes the copy's hook, not the user's."""
    for attr in HOOK_DICTS:
        a, b = getattr(src, attr), getattr(dst, attr)  # (torch's two dicts, None until a hook is registered)
        if a is not None and b is not None:
            memo[id(a)] = b


def copy_model_callables(root: nn.Module, memo: dict[int, Any], done: dict[int, Any], copied: bool = True) -> None:
    """In `root` (a deep copy made with `memo`): each module's hooks, functions set on an instance (a `forward`
    override) and each parameter's gradient hooks replaced by copies reaching the copies (copy_callable). Not
    `copied`: `root`'s tensors were replaced in place (`memo`: old id -> new), its callables not (remap_callables)."""
    for m in root.modules():
        for key, value in list(vars(m).items()):
            if key in _MODULE_HOOKS and isinstance(value, dict):
                for k, h in list(value.items()):
                    value[k] = copy_callable(h, memo, done, copied)
            elif isinstance(value, (types.FunctionType, functools.partial)):
                setattr(m, key, copy_callable(value, memo, done, copied))
        for p in m._parameters.values():
            if p is not None:
                copy_grad_hook_entries(p, memo, done)


def copy_grad_hook_entries(t: Any, memo: dict[int, Any], done: dict[int, Any]) -> None:
    """`t`'s gradient hooks (carried from the user's parameter) replaced by copies reaching the copies."""
    for attr in HOOK_DICTS:
        hooks = getattr(t, attr)
        if hooks:
            for k, h in list(hooks.items()):
                hooks[k] = copy_callable(h, memo, done)


def remap_callables(root: nn.Module, memo: dict[int, Any]) -> None:
    """After `root`'s tensors were replaced in place (the tracer's fake weights for meta ones; `memo`: old id -> new),
    its callables reach the new ones: a hook holding a parameter or a tensor of its own (`o * scale`) met the meta
    one beside the fake weights. Its modules stay themselves."""
    table = dict(memo)
    table.update({id(m): m for m in root.modules()})
    copy_model_callables(root, table, {}, copied=False)
