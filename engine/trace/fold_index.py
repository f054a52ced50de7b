"""The traced blocks' index attributes, watched while a folded step runs (engine.trace.folded_trace).

engine.trace.fold_plan lets blocks differ by an attribute that holds their index (layer_idx, layer_number, a path
naming the block). A forward that reads it may choose a path by it (`if self.layer_idx % 4 == 0`, the last layer's
`if self.layer_idx == n - 1`) that the two middle blocks compared do not show, and the tail's traced blocks hold
their own index, not the last blocks' they stand for. So while a folded step runs, each traced block's module that
holds one is of a subclass whose property for it notes the read, and a read declines the fold (a module's own
attribute only: fold_plan declines an index held inside another object) unless the code that read it only passes
it along to another object's method or a function (Hugging Face's `cache.update(k, v, self.layer_idx)`: the cache's
slots are the region's, which the fold follows layer by layer). Read in a test, in arithmetic, as a subscript or
handed to the module's own method, it declines; so does a read whose source cannot be seen. An int index handed on
is a _PassedIndex: compared or computed with where it went (a helper's `if idx % 4 == 0`), it declines too, except
in Hugging Face's cache code; any other index handed on (a name, `f"block{i}"`: what is done with a string
cannot all be watched) declines."""

from __future__ import annotations

import ast
import functools
import sys
import types
from typing import Any

from torch import nn

from .fold_loops import source_tree


class IndexWatch:
    """Swaps the modules' classes for watching ones (`start`) and back (`stop`); `read` names the first read."""

    def __init__(self, watched: list[tuple[nn.Module, frozenset[str]]]) -> None:
        self.read: str | None = None
        made: dict[tuple[type, frozenset[str]], type] = {}
        self._swaps: list[tuple[nn.Module, type, type]] = []
        for module, attrs in watched:
            cls = type(module)
            key = (cls, attrs)
            if key not in made:
                made[key] = self._watching(cls, attrs)
            self._swaps.append((module, cls, made[key]))

    def _watching(self, cls: type, attrs: frozenset[str]) -> type:
        watch = self

        def prop(name: str) -> property:
            def get(module: nn.Module) -> Any:
                value = module.__dict__[name]
                if watch.read is None:
                    caller = sys._getframe(1)
                    if not _passed_along(caller.f_code, caller.f_lineno, name):
                        watch.read = f"{cls.__name__}.{name}, line {caller.f_lineno} of {caller.f_code.co_filename}"
                    elif type(value) is int:  # passed along: where it goes, it may still be tested or computed with
                        return _PassedIndex(value, watch, f"{cls.__name__}.{name}")
                    else:  # a name (`f"block{i}"`) handed on: where it goes, a test of it cannot be seen
                        watch.read = (f"{cls.__name__}.{name} (a {type(value).__name__}) handed on, line "
                                      f"{caller.f_lineno} of {caller.f_code.co_filename}")
                return value

            def put(module: nn.Module, value: Any) -> None:
                module.__dict__[name] = value

            return property(get, put)

        body: dict[str, Any] = {name: prop(name) for name in sorted(attrs)}
        body["__qualname__"] = cls.__qualname__
        body["__module__"] = cls.__module__
        return type(cls.__name__, (cls,), body)

    def start(self) -> None:
        for module, _cls, watching in self._swaps:
            module.__class__ = watching

    def stop(self) -> None:
        for module, cls, _watching in self._swaps:
            module.__class__ = cls


# Where a block's index passed along may be compared and computed with: Hugging Face's caches, whose slots are
# the region's (the fold follows them layer by layer). Elsewhere (a helper of the model's: `if idx % 4 == 0`) a use
# declines, as a read in the forward itself does.
_INDEX_USERS = ("/transformers/cache_utils.py",)


class _PassedIndex(int):
    """A traced block's index as handed to another object's method or a function: the int itself, noting in its
    watch (IndexWatch.read) a comparison or arithmetic done with it outside _INDEX_USERS. What it gives is a plain
    int; indexing a list with it (`self.layers[layer_idx]`) is not a use (Python reads an int subclass as itself)."""

    watch: IndexWatch
    name: str
    __hash__ = int.__hash__

    def __new__(cls, value: int, watch: IndexWatch, name: str) -> _PassedIndex:
        made = super().__new__(cls, value)
        made.watch, made.name = watch, name
        return made


def _noting(op: str) -> Any:
    plain = getattr(int, op)

    def use(self: _PassedIndex, *other: Any) -> Any:
        if self.watch.read is None:
            caller = sys._getframe(1)
            if not caller.f_code.co_filename.replace("\\", "/").endswith(_INDEX_USERS):
                self.watch.read = (f"{self.name} handed on, then used ({op}) at line {caller.f_lineno} of "
                                   f"{caller.f_code.co_filename}")
        return plain(int(self), *other)

    return use


for _op in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__add__", "__radd__",
            "__sub__", "__rsub__", "__mul__", "__rmul__", "__mod__", "__rmod__", "__floordiv__", "__rfloordiv__",
            "__truediv__", "__rtruediv__", "__pow__", "__neg__", "__and__", "__or__", "__xor__", "__lshift__",
            "__rshift__", "__divmod__"):
    setattr(_PassedIndex, _op, _noting(_op))


@functools.lru_cache(maxsize=1024)
def _passed_along(code: types.CodeType, line: int, attr: str) -> bool:
    """Does every `….attr` on `line` of `code`'s function only go as an argument to a call of something other than
    `self`'s own method (and not inside a test or arithmetic)?"""
    read = source_tree(code)
    if read is None:
        return False
    tree, first = read
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == attr and
            isinstance(n.ctx, ast.Load) and first + n.lineno == line]
    return bool(uses) and all(_argument(n, parents) for n in uses)


def _argument(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    call = parents.get(id(node))
    if isinstance(call, ast.keyword):
        call = parents.get(id(call))
    if not isinstance(call, ast.Call) or node is call.func:
        return False
    root = call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id == "self":
        return False  # the module's own method: it may choose a path by it
    up = parents.get(id(call))
    while up is not None:  # the call's answer itself must not be tested or computed with
        if isinstance(up, (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.If, ast.While,
                           ast.Subscript, ast.Assert)):
            return False
        if isinstance(up, ast.stmt):
            return True
        up = parents.get(id(up))
    return True
