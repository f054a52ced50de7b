"""Whose code runs in and around a stack the fold would cut (engine.trace.fold_plan, engine.trace.fold_stack).

A fold is right only where nothing the code does differs from block to block unseen, and the checks (fold_loops,
fold_state, fold_index, fold_reads) see only what they know to look for. Library code is the model code they were
built on and are measured against, event for event, on every template and catalogue model
(benchmarks.fold_identity); a user's own code can keep state anywhere (a count in a class attribute, in an iterator,
in an argument object, a `random` draw, a decorator's closure): two probes of hand-written models found 84 that
folded wrongly past every check (benchmarks/RESULTS.md, "The user's own code is traced in full"). So by default a
stack folds only where every module class from the model down to it and in its blocks (with every function they
define or hold, and every hook on them) comes from a known library or from this project, and only a known library's
code goes through the stack as it runs; the user's own code is traced in full, which is exact.
TrainConfig.fold_own_code (`--fold-own-code`) folds the user's own code too, with the checks, unproven."""

from __future__ import annotations

import functools
import sys
import types
import weakref

from torch import nn
from torch.nn.modules import module as torch_module

# the first dotted part of a module name whose code the fold knows (besides Python's standard library)
# (the model libraries, and those they build on or wrap a module's methods with: kernels, huggingface_hub, einops)
KNOWN = frozenset({"torch", "transformers", "peft", "bitsandbytes", "torchvision", "timm", "accelerate", "torchao",
                   "diffusers", "kernels", "huggingface_hub", "einops", "flash_attn", "xformers", "typing_extensions",
                   "engine", "vramscope", "builtins"}) | sys.stdlib_module_names

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def known_module(name: object) -> bool:
    """Is `name` (a module's `__name__`) a known library's or this project's?"""
    return isinstance(name, str) and name.partition(".")[0] in KNOWN


def own_code_reason(model: nn.Module, path: str, blocks: list[nn.Module]) -> str | None:
    """Why the stack at `path` in `model` runs the user's own code (a class, a function it defines or holds, a
    hook), or None where all of it is known (see the module docstring)."""
    owners = [model]
    for name in path.split(".")[:-1] if path else []:
        owners.append(owners[-1].get_submodule(name))
    for name, hooks in ((n, getattr(torch_module, n)) for n in _GLOBAL_HOOKS):
        why = _hooks_reason(hooks, f"a global module hook ({name.strip('_')})")
        if why is not None:
            return why
    seen: set[type] = set()
    for m in (*owners, *(sub for b in blocks for sub in b.modules())):
        cls = type(m)
        if cls not in seen:
            seen.add(cls)
            why = _class_reason(cls)
            if why is not None:
                return why
        why = _instance_reason(m)
        if why is not None:
            return why
    return None


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


def _class_reason(cls: type) -> str | None:
    if cls not in _CLASSES:
        _CLASSES[cls] = _read_class(cls)
    return _CLASSES[cls]


_CLASSES: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()


def _read_class(cls: type) -> str | None:
    for base in cls.__mro__:
        if base is object:
            continue
        if not known_module(base.__module__):
            return _OWN.format(f"class {base.__qualname__} ({base.__module__})")
        for name, value in vars(base).items():
            where = _function_module(value)
            if where is not None and not known_module(where):
                return _OWN.format(f"{base.__qualname__}.{name} (from {where})")
    return None


def _instance_reason(m: nn.Module) -> str | None:
    for key, value in vars(m).items():
        if key in _HOOKS:
            why = _hooks_reason(value, f"a hook on {type(m).__name__} ({key.strip('_')})")
            if why is not None:
                return why
            continue
        if isinstance(value, (nn.Module, type)) or not callable(value):
            continue
        where = _function_module(value) or type(value).__module__
        if not known_module(where):
            return _OWN.format(f"{type(m).__name__}.{key} (from {where})")
    return None


def _hooks_reason(hooks: object, what: str) -> str | None:
    for hook in (hooks.values() if isinstance(hooks, dict) else ()):
        where = _function_module(hook) or type(hook).__module__
        if not known_module(where):
            return _OWN.format(f"{what}, {getattr(hook, '__qualname__', type(hook).__name__)} (from {where})")
    return None


def _defined_in(f: object) -> str:
    """The module a function was defined in: its globals' name (a decorator's `functools.wraps` copies the wrapped
    function's `__module__` onto the wrapper, not its globals)."""
    if isinstance(f, types.FunctionType):
        return str(f.__globals__.get("__name__", f.__module__))
    return str(getattr(f, "__module__", type(f).__module__))


def _function_module(value: object) -> str | None:
    """The module a function-like class or instance attribute's code comes from (a function, a static or class
    method, a property's accessors, a bound method, a partial), or None for anything else."""
    if isinstance(value, (staticmethod, classmethod, types.MethodType)):
        value = value.__func__
    if isinstance(value, (functools.partial, functools.partialmethod)):
        value = value.func
    if isinstance(value, property):
        places = [_defined_in(f) for f in (value.fget, value.fset, value.fdel) if f is not None]
        return next((p for p in places if not known_module(p)), places[0] if places else None)
    if isinstance(value, types.FunctionType):
        return _defined_in(value)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return "builtins"
    if hasattr(type(value), "__get__") and not isinstance(value, type) and \
            not known_module(type(value).__module__):
        return type(value).__module__  # (a descriptor of the user's: its __get__ runs on each read)
    return None
