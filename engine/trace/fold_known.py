"""Whose code runs in and around a stack the fold would cut (engine.trace.fold_plan, engine.trace.fold_stack).

A fold is right only where nothing the code does differs from block to block unseen, and the checks (fold_loops,
fold_state, fold_index, fold_reads) see only what they know to look for. Library code is the model code they were
built on and are measured against, event for event, on every template and catalogue model
(benchmarks.fold_identity); a user's own code can keep state anywhere (a count in a class attribute, in an iterator,
in an argument object, a `random` draw, a decorator's closure): probes of hand-written models found 84 that folded
wrongly past every check (benchmarks/RESULTS.md, "The user's own code is traced in full"). So by default a stack
folds only where the code is a known library's or this project's, read afresh at each trace (a class patched between
two estimates is read as patched):

- every module class of the model (the stack's owners, its blocks and their neighbours: a rotary embedding's output
  is read in every block), along its bases, with what each class defines;
- what each module holds (its `forward` set on the instance, its hooks, an accelerate hook object, its parameters'
  gradient hooks), and the global module hooks;
- the functions the model's classes call by name: the namespaces of the modules defining them, of `torch`,
  `torch.nn.functional` and `torch.Tensor` (a user's `F.silu = mine`, `modeling_llama.apply_rotary_pos_emb = mine`,
  an attention function registered in transformers' registry);
- the function that goes through the stack as it runs (cut_stack).

A function counts as the module its code was defined in (a decorator's `functools.wraps` copies `__module__` onto
its wrapper, not its globals), and is read into: a wrapper's closure and `__wrapped__`, a partial's function and
arguments, a bound method's object, a container's entries, a few levels down. An object of a class defined
elsewhere than a known module is the user's. Anything of the user's means the stack is traced in full, which is
exact; TrainConfig.fold_own_code (`--fold-own-code`) folds it anyway, with the checks, unproven."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional
from torch import nn
from torch.nn.modules import module as torch_module

from ..core.code_origin import installed, known_module
from ..core.grad_hooks import grad_hooks, has_grad_hooks

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")
# nn.Module's own records but its hooks (those that run in a step)
_BOOKKEEPING = frozenset(vars(nn.Module())) - frozenset(_HOOKS)
_DEPTH = 3  # levels read into a function's closure, a partial's arguments, a container
_ENTRIES = 64  # of a container


def own_code_reason(model: nn.Module, blocks: list[nn.Module]) -> str | None:
    """Why the model whose stack holds `blocks` runs the user's own code in or around it (see the module
    docstring), or None where all of it is known. (The stack's modules are read first: the reason names them.)"""
    memo: _Memo = {}
    for name in _GLOBAL_HOOKS:
        where = _own_in(getattr(torch_module, name), _DEPTH, memo)
        if where is not None:
            return _OWN.format(f"a global module hook ({name.strip('_')}, from {where})")
    modules = list({id(m): m for m in (*(sub for b in blocks for sub in b.modules()), *model.modules())}.values())
    classes: dict[type, None] = {}
    for m in modules:
        if type(m) not in classes:
            classes[type(m)] = None
            why = _class_reason(type(m), memo)
            if why is not None:
                return why
    for m in modules:
        why = _instance_reason(m, memo)
        if why is not None:
            return why
    return _namespace_reason(classes, memo)


def own_caller_reason(frame: types.FrameType) -> str | None:
    """Why the function in `frame`, which goes through the stack, is the user's own code, or None."""
    if known_module(frame.f_globals.get("__name__")):
        return None
    code = frame.f_code
    return _OWN.format(f"{code.co_name} (line {frame.f_lineno} of {code.co_filename}), which goes through the stack,")


_MARK = "is the user's own code"
_OWN = "{} " + _MARK + ": traced in full, exact (“fold my own code”, --fold-own-code, fold_own_code=True, folds it: " \
    "checked, not proven)"


def declined_as_own(reason: str) -> bool:
    """Was a fold declined (its reason, TraceFold.reason) because the stack is the user's own code?"""
    return _MARK in reason


def _class_reason(cls: type, memo: _Memo) -> str | None:
    for base in cls.__mro__:
        if base is object:
            continue
        if not known_module(base.__module__):
            return _OWN.format(f"class {base.__qualname__} ({base.__module__})")
        for name, value in list(vars(base).items()):
            if isinstance(value, type):
                continue  # (a class it names, config_class: read where it is a module's)
            where = _own_in(value, _DEPTH, memo)
            if where is not None:
                return _OWN.format(f"{base.__qualname__}.{name} (from {where})")
    return None


def _instance_reason(m: nn.Module, memo: _Memo) -> str | None:
    for key, value in list(vars(m).items()):
        if key in _BOOKKEEPING:
            continue  # (nn.Module's own records: its submodules are read as modules, the rest holds no code)
        kind = type(value)
        if kind in _PLAIN or (kind in _EMPTY_HOLDERS and not value):
            continue  # (_own_in's first answers, without the call: a deep model has thousands of these)
        where = _own_in(value, _DEPTH, memo)
        if where is not None:
            what = f"a hook on {type(m).__name__} ({key.strip('_')})" if key in _HOOKS else f"{type(m).__name__}.{key}"
            return _OWN.format(f"{what} (from {where})")
    for name, p in m._parameters.items():  # (its gradient hooks run in the backward: engine.core.grad_hooks)
        if p is None or not has_grad_hooks(p):
            continue
        where = _own_in(grad_hooks(p), _DEPTH, memo)
        if where is not None:
            return _OWN.format(f"a gradient hook on {type(m).__name__}.{name} (from {where})")
    return None


def _namespace_reason(classes: Iterable[type], memo: _Memo) -> str | None:
    """A user's function or object put in the namespace of a module the model's classes are defined in (or of
    torch, torch.nn.functional), or among torch.Tensor's methods: the classes' code calls it by name."""
    names = {base.__module__ for cls in classes for base in cls.__mro__ if base is not object}
    spaces: list[tuple[str, Mapping[str, object]]] = [(n, vars(sys.modules[n])) for n in sorted(names)
                                                      if n in sys.modules]
    spaces += [("torch", vars(torch)), ("torch.nn.functional", vars(torch.nn.functional)),
               ("torch.Tensor", vars(torch.Tensor))]
    for space, values in spaces:
        for name, value in list(values.items()):
            if isinstance(value, (type, types.ModuleType)) or (name.startswith("__") and name.endswith("__")):
                continue  # (a module's own records: its loader, spec, builtins)
            where = _own_in(value, 2, memo)
            if where is not None:
                return _OWN.format(f"{space}.{name} (from {where})")
    return None


def _defined_in(f: types.FunctionType) -> str:
    """The module a function was defined in: its globals' name (a decorator's `functools.wraps` copies the wrapped
    function's `__module__` onto the wrapper, not its globals)."""
    return str(f.__globals__.get("__name__", f.__module__))


_Memo = dict[tuple[int, int], "str | None"]
_PLAIN = frozenset({str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size})
_EMPTY_HOLDERS = frozenset({dict, OrderedDict, list, tuple, set, frozenset})  # empty: no code in them


def _own_in(value: object, depth: int, memo: _Memo | None = None) -> str | None:
    """The module of the first of the user's code in `value` (a function, a method, a partial, a property, a
    wrapper's closure, an object of a class, a container's entries, `depth` levels down), or None where all of it
    is known. Tensors, modules (read as modules) and plain values are no code."""
    kind = type(value)
    if kind in _PLAIN or isinstance(value, (torch.Tensor, nn.Module)):
        return None
    if kind in (dict, list, tuple) and not value:
        return None
    if isinstance(value, type):
        return None if installed(value.__module__) else value.__module__
    inner: list[object] = []
    if isinstance(value, types.FunctionType):
        if not installed(_defined_in(value)):
            return _defined_in(value)
        inner = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        inner += [x for x in (getattr(value, "__wrapped__", None),) if x is not None]
    elif isinstance(value, (staticmethod, classmethod)):
        inner = [value.__func__]
    elif isinstance(value, types.MethodType):
        inner = [value.__func__, value.__self__]
    elif isinstance(value, (functools.partial, functools.partialmethod)):
        inner = [value.func, *value.args, *value.keywords.values()]
    elif isinstance(value, property):
        inner = [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    elif isinstance(value, (list, tuple, set, frozenset)):
        inner = list(value)[:_ENTRIES]
    elif isinstance(value, dict):
        inner = list(value.values())[:_ENTRIES]
    elif isinstance(value, (types.BuiltinFunctionType, types.ModuleType)):
        return None
    else:
        if not installed(kind.__module__):
            return kind.__module__
        # a library's object: the dicts it or its class keeps (a registry: transformers' attention functions, in
        # a class-wide dict), and what it wraps (functools.lru_cache's wrapper)
        # (read statically: no __getattr__ or property of theirs runs)
        held = [*_own_dict(value).values(), *vars(kind).values()]
        inner = [x for x in held if type(x) is dict]
        wrapped = inspect.getattr_static(value, "__wrapped__", None)
        if wrapped is not None:
            inner.append(wrapped)
    if depth <= 0 or not inner:
        return None
    memo = {} if memo is None else memo
    key = (id(value), depth)
    if key in memo:  # (read already at this depth in this pass: a config every module holds)
        return memo[key]
    memo[key] = None
    for x in inner:
        where = _own_in(x, depth - 1, memo)
        if where is not None:
            memo[key] = where
            return where
    return None


def _own_dict(value: object) -> dict[str, object]:
    try:
        d = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return d if isinstance(d, dict) else {}


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True
