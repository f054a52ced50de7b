"""State a block could act on that no tensor shows (engine.trace.fold_plan, engine.trace.fold_stack): a global its
methods change, an object the blocks hold between them and change, a counter the model's loop carries from block
to block. Each block past the cut would see another value, and the traced blocks would not show it."""

from __future__ import annotations

import ast
import functools
import inspect
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .fold_loops import methods, source_tree


def state_reason(block: nn.Module) -> str | None:
    """Why a block's code may act on state outside the modules, or None: a method of a module in it (not
    `__init__`) that assigns a global or a closure's name (`global n; n += 1`) or stores into an object it
    reaches by one (`COUNT[0] += 1`, `STATE.calls += 1`). Each block's call would then see another value (a
    counter of calls across the blocks, `if COUNT[0] % 4 == 0`), which the traced blocks do not show."""
    for cls in dict.fromkeys(type(m) for m in block.modules()):
        if cls not in _STATE:
            _STATE[cls] = _read_state(cls)
        why = _STATE[cls]
        if why is not None:
            return why
    return None


_STATE: weakref.WeakKeyDictionary[type, str | None] = weakref.WeakKeyDictionary()


def _read_state(cls: type) -> str | None:
    # every class's own methods, overridden or not: a block's forward calls its base's by super()
    for base, name, func in methods(cls, resolved=False):
        read = source_tree(func.__code__)
        if read is None:
            continue  # (a method made at run time: its stores cannot be read; its loops are loop_reason's)
        tree, first = read
        store = _outside_store(tree)
        if store is not None:
            return (f"{base.__qualname__}.{name} changes state outside the modules ({ast.unparse(store)}, "
                    f"line {first + store.lineno}): the blocks past the cut would see other values")
    return None


def _outside_store(tree: ast.AST) -> ast.expr | None:
    """The first store into a global or closure name, or into an object reached by one, in a function's source."""
    declared = {n for node in ast.walk(tree) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}
    local: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            local.update(x.arg for x in a.posonlyargs + a.args + a.kwonlyargs)
            local.update(x.arg for x in (a.vararg, a.kwarg) if x is not None)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in declared:
            local.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local.update((al.asname or al.name).split(".")[0] for al in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in declared:
            return node
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            root = node.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name) and root.id not in local:
                return node
    return None


_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_VALUES = _SCALARS[:-1]  # a container's: a slot per block (None) filled with its tensor as each runs is no value


def _scalar(v: object) -> object:
    """What of a value the blocks could act on without a tensor showing it: a number, a string, a flag (as its
    repr: a NaN equals itself), or a list, tuple or dict of those (its tensors left out), else a marker."""
    t = type(v)
    if t in _SCALARS:
        return repr(v)
    if t in (list, tuple) and isinstance(v, (list, tuple)):
        return tuple(repr(x) for x in v[:64] if type(x) in _VALUES)
    if t is dict and isinstance(v, dict):
        return tuple((repr(k), repr(x)) for k, x in list(v.items())[:64] if type(x) in _VALUES)
    return _OTHER


_OTHER = object()


def loop_state(frame: types.FrameType, skip: frozenset[str], blocks: nn.Module) -> dict[str, object] | None:
    """The loop's state a block could see besides its tensors, from the locals of the function running the loop
    (`skip`: the loop's own names): each local scalar (a counter, `x, n = blk(x, n)`), and each public scalar of a
    module local (`self.seen += 1` in the model's loop) that is not one of the stack's `blocks` (a block taken by
    index, `blk = blocks[i]`: its own attributes are the fold's other checks'). None where the locals are not read
    (_locals)."""
    values = _locals(frame)
    if values is None:
        return None
    own = _ModuleSet(blocks._modules.values())
    out: dict[str, object] = {}
    for k, v in values.items():
        if k in skip:
            continue
        sig = _scalar(v)
        if sig is not _OTHER:
            out[k] = sig
        elif isinstance(v, nn.Module) and v not in own:
            for a, x in vars(v).items():
                if not a.startswith("_") and a != "training" and (sig := _scalar(x)) is not _OTHER:
                    out[f"{k}.{a}"] = sig
    return out


class _ModuleSet:
    """Modules by identity (`in` on a list of modules would compare them with ==, which a module may define)."""

    def __init__(self, modules: Iterable[nn.Module | None]) -> None:
        self.ids = {id(m) for m in modules}

    def __contains__(self, m: object) -> bool:
        return id(m) in self.ids


def _locals(frame: types.FrameType) -> dict[str, Any] | None:
    """A copy of a function's locals, or None where they are not read: a function that takes its own locals
    (`locals()`, `vars()`, a frame: frame_reason), which share the copy Python keeps.

    Up to Python 3.12 a function's `f_locals` is a copy kept on the frame: it would keep the locals' tensors alive
    past their last use (and so move their frees in the trace), so it is emptied once read. A module's or class's
    namespace (not CO_OPTIMIZED) is the namespace itself: read, never emptied."""
    code = frame.f_code
    if not code.co_flags & inspect.CO_OPTIMIZED:
        return dict(frame.f_locals)
    if frame_reason(code) is not None:
        return None
    values = frame.f_locals
    try:
        return dict(values)
    finally:
        if type(values) is dict:  # (3.13 on: a view of the frame, holding nothing)
            values.clear()


_OWN_LOCALS = frozenset({"locals", "vars", "_getframe", "currentframe", "f_locals"})


def frame_reason(code: types.CodeType) -> str | None:
    """Why the state of a loop over the stack in `code`'s function cannot be read, or None: the function takes its
    own locals or frame (`locals()`, `vars()`, `sys._getframe()`), which share the copy _locals would empty. A count
    it carries from block to block (`if n > 6`) could not be seen, so the fold is refused."""
    if not code.co_flags & inspect.CO_OPTIMIZED or not _OWN_LOCALS & set(code.co_names):
        return None
    used = ", ".join(sorted(_OWN_LOCALS & set(code.co_names)))
    return (f"the loop's function {code.co_name} reads its own frame ({used}): the state it carries from block to "
            "block cannot be read")


def indexed_reason(frame: types.FrameType, chains: tuple[tuple[str, ...], ...], count: int,
                   place: Callable[[int], tuple[int, int]]) -> str | None:
    """Why what the loop indexes by the block's index (engine.trace.fold_loops.indexed_at: `self.widths[i]`,
    `masks[i]`) keeps the stack from folding, or None: a list, tuple or dict whose entries for the `count` blocks
    differ (plain values by value, tensors by shape and dtype, anything else by class) between blocks in the same
    place of their units (`place`: FoldPlan.unit_of; unit 0 aside, traced as itself) gives the blocks past the cut
    other values than the traced ones had. Reached only through plain attributes (no property runs)."""
    if not chains:
        return None
    values = _locals(frame)
    if values is None:
        return frame_reason(frame.f_code)
    for chain in chains:
        held = _reached(values.get(chain[0], frame.f_globals.get(chain[0])), chain[1:])
        if not isinstance(held, (list, tuple, dict)):
            continue
        first: dict[int, tuple[int, object]] = {}
        for j in range(count):
            unit, position = place(j)
            if unit == 0:
                continue
            entry = _entry(held.get(j, _OTHER) if isinstance(held, dict) else held[j] if j < len(held) else _OTHER)
            if position not in first:
                first[position] = (j, entry)
            elif first[position][1] != entry:
                i, before = first[position]
                return (f"the loop indexes `{'.'.join(chain)}` by the block's index, and it holds other values for "
                        f"blocks {i} and {j} ({before}, then {entry}): the blocks past the cut would get other values "
                        "than the traced ones")
    return None


def _reached(obj: object, path: tuple[str, ...]) -> object:
    for name in path:
        try:
            obj = vars(obj).get(name, _OTHER)
        except TypeError:
            return _OTHER
    return obj


def _entry(v: object) -> object:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    sig = _scalar(v)
    return type(v).__name__ if sig is _OTHER else sig


def state_change(states: list[dict[str, object] | None]) -> str | None:
    """Why the loop's state (loop_state, as each block after the first is handed out and when the loop ends)
    changes from block to block, or None: a counter or flag carried through the loop would have other values at
    the blocks past the cut (`if n > 6`), which the traced blocks do not show."""
    for before, after in zip(states, states[1:], strict=False):
        if before is None or after is None:
            continue  # (not read: loop_state)
        for k in before.keys() | after.keys():
            if before.get(k) != after.get(k):
                return (f"the loop's `{k}` changes from block to block ({before.get(k, 'unset')}, then "
                        f"{after.get(k, 'unset')}): the blocks past the cut would see other values")
    return None


_MUTATORS = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault",
                       "add", "discard", "appendleft", "extendleft", "sort", "reverse", "__setitem__"})


def shared_reason(blocks: list[nn.Module]) -> str | None:
    """Why blocks holding one object between them (the same list, dict or object of the user's, by identity, in two
    blocks or more, held by a module's attribute or inside what it holds, a few objects down: `self.holder.box`,
    `self.state["log"]`) keep the stack from folding, or None: where a method of the module changes it through
    `self` (`self.log.append(1)`, `self.stats["n"] += 1`, `self.log += [1]`, `self.holder.box.n += 1`) or calls a
    method of the object's own class that stores into it, each block's call sees what the blocks before it did
    (`if len(self.log) > 6`), which the traced blocks do not show. So is a function they hold between them that
    keeps state: a closure that assigns its enclosing function's names (`nonlocal n; n += 1`), a method of an object
    that stores into it, a builtin's bound method (`itertools.count().__next__`). Modules, tensors, plain values,
    classes and plain functions are not."""
    holders: dict[object, set[int]] = {}  # object -> the blocks holding it
    held: dict[object, list[tuple[type, str, str, tuple[type, ...], object]]] = {}
    inside: dict[int, list[tuple[str, tuple[type, ...], object]]] = {}  # (what is held inside an object, by its id)
    for j, block in enumerate(blocks):
        for m in block.modules():
            for key, v in vars(m).items():
                if key.startswith("_") or _plain(v):
                    continue
                for shown, types_, x in [("", (type(v),), v), *_within(v, inside, _DEPTH)]:
                    k = _identity(x)
                    holders.setdefault(k, set()).add(j)
                    held.setdefault(k, []).append((type(m), key, key + shown, types_, x))
    for k, js in holders.items():
        if len(js) < 2:
            continue
        for cls, key, shown, types_, x in {(c, a, id(x)): (c, a, p, t, x) for c, a, p, t, x in held[k]}.values():
            why = (_stateful(x) if _reads(cls, key) else None) if callable(x) else _changes(cls, key, types_)
            if why is not None:
                return f"the blocks hold one {type(x).__name__} `{shown}` between them, and {why}: each block " \
                       "would see what the blocks before it did, the blocks past the cut other values"
    return None


_DEPTH = 2  # objects down from a module's attribute that shared_reason looks into


def _plain(v: object) -> bool:
    """Is `v` nothing a block could change in common: a module, a tensor, a class, a Python module, a plain value?"""
    return isinstance(v, (nn.Module, torch.Tensor, type, types.ModuleType, *_SCALARS))


def _identity(x: object) -> object:
    # (a bound method is made anew at each lookup: held in common is its object)
    return (id(x.__self__), getattr(x, "__name__", "")) if hasattr(x, "__self__") else id(x)


def _within(v: object, inside: dict[int, list[tuple[str, tuple[type, ...], object]]], depth: int
            ) -> list[tuple[str, tuple[type, ...], object]]:
    """What `v` holds, `depth` objects down (the entries of a list, tuple or dict, the attributes of an object of the
    user's; 64 of each at most): each as how it is reached from `v` (`.box`, `['log']`), the classes along the way
    (from `v`'s) and itself."""
    if depth == 0 or callable(v):
        return []
    if id(v) in inside:
        return inside[id(v)]
    items: list[tuple[str, object]]
    if isinstance(v, (list, tuple)):
        items = [(f"[{i}]", x) for i, x in enumerate(v[:64])]
    elif isinstance(v, dict):
        items = [(f"[{k!r}]", x) for k, x in list(v.items())[:64]]
    else:
        try:
            items = [(f".{a}", x) for a, x in list(vars(v).items())[:64] if not a.startswith("__")]
        except TypeError:
            items = []
    out: list[tuple[str, tuple[type, ...], object]] = []
    inside[id(v)] = out  # (set before looking down: an object holding itself)
    for shown, x in items:
        if _plain(x):
            continue
        out.append((shown, (type(v), type(x)), x))
        out += [(shown + deeper, (type(v), *kinds), y) for deeper, kinds, y in _within(x, inside, depth - 1)]
    return out


def _reads(cls: type, key: str) -> bool:
    """Does a method of `cls` read `self.key` (a function it holds and may call)? One it never reads is no state."""
    known = _READS.setdefault(cls, {})
    if key not in known:
        known[key] = _read_reads(cls, key)
    return known[key]


_READS: weakref.WeakKeyDictionary[type, dict[str, bool]] = weakref.WeakKeyDictionary()


def _read_reads(cls: type, key: str) -> bool:
    for _base, _name, func in methods(cls, resolved=False):
        read = source_tree(func.__code__)
        if read is None or any(_is_self_attr(n, key) for n in ast.walk(read[0])):
            return True
    return False


def _stateful(f: object) -> str | None:
    """Why a function the blocks hold between them may keep state from call to call, or None."""
    if isinstance(f, types.FunctionType):
        code = f.__code__
        read = source_tree(code) if code.co_freevars else None
        if read is not None and any(isinstance(n, ast.Nonlocal) for n in ast.walk(read[0])):
            return f"{f.__qualname__} assigns names of the function it was made in"
        return None
    owner = getattr(f, "__self__", None)  # (a bound method's object, of any class)
    if owner is None or isinstance(owner, (nn.Module, types.ModuleType, type, *_SCALARS, tuple, frozenset)):
        return None
    name = getattr(f, "__name__", "")
    if isinstance(f, types.MethodType):
        return f"{type(owner).__name__}.{name} stores into its object" if _stores_into_self(type(owner), name) \
            else None
    return f"{type(owner).__name__}.{name} is a builtin's method of an object they share"


_CHANGES: weakref.WeakKeyDictionary[type, dict[tuple[str, tuple[type, ...]], str | None]] = \
    weakref.WeakKeyDictionary()


def _changes(cls: type, key: str, held: tuple[type, ...]) -> str | None:
    """Where a method of `cls` changes what `self.key` holds (itself, or through a local name bound to it: `log =
    self.log; log.append(1)`), or what is reached through it (`self.holder.box.n += 1`, `self.state["log"].append(1)`),
    or None; `held`: the classes of `self.key` and of the objects down to the one held in common, whose own methods
    may store into it (`self.holder.bump()`). (Read once per class, key and held classes.)"""
    known = _CHANGES.setdefault(cls, {})
    if (key, held) not in known:
        known[(key, held)] = _read_changes(cls, key, held)
    return known[(key, held)]


def _read_changes(cls: type, key: str, held: tuple[type, ...]) -> str | None:
    for base, name, func in methods(cls, resolved=False):
        read = source_tree(func.__code__)
        if read is None:
            continue
        tree, first = read
        aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_self_attr(n.value, key)
                   for t in n.targets if isinstance(t, ast.Name)}

        def held_here(node: ast.AST, aliases: set[str] = aliases) -> bool:
            return _is_self_attr(node, key) or (isinstance(node, ast.Name) and node.id in aliases)

        for node in ast.walk(tree):
            target: ast.expr | ast.stmt | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                down, inner = 0, node.func.value  # (how many objects down from `self.key` the method's object is)
                while isinstance(inner, (ast.Subscript, ast.Attribute)) and not held_here(inner):
                    down, inner = down + 1, inner.value
                if held_here(inner) and (node.func.attr in _MUTATORS or
                                         (down < len(held) and _stores_into_self(held[down], node.func.attr))):
                    target = node
            elif isinstance(node, ast.AugAssign) and held_here(node.target):
                target = node
            elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                inner = node.value
                while isinstance(inner, (ast.Subscript, ast.Attribute)) and not held_here(inner):
                    inner = inner.value
                if held_here(inner):
                    target = node
            if target is not None:
                return f"{base.__qualname__}.{name} changes it ({ast.unparse(target)}, line {first + target.lineno})"
    return None


def _is_self_attr(node: ast.AST, key: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == key and isinstance(node.value, ast.Name) and \
        node.value.id == "self"


def _stores_into_self(cls: type, method: str) -> bool:
    """Does `cls`'s method `method` (a class of the user's, not a builtin) store into its own object?"""
    func = getattr(cls, method, None)  # (the held object's class: the user's, any)
    if not isinstance(func, types.FunctionType):
        return False
    read = source_tree(func.__code__)
    if read is None:
        return True  # (cannot be read: taken to change it)
    tree, _first = read
    args = func.__code__.co_varnames[:1]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            inner = node.value if isinstance(node, ast.Subscript) else node
            while isinstance(inner, (ast.Subscript, ast.Attribute)):
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in args:
                return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            inner = node.func.value
            while isinstance(inner, (ast.Subscript, ast.Attribute)):
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in args:
                return True
    return False


class ArgWatch:
    """The plain values each traced block is called with: its arguments that are not tensors (a count the loop
    hands it and it hands back, `x, n = blk(x, n)`; a flag; a number made by `next(counter)`), by position and by
    name. Blocks in the same place of their units (engine.trace.fold_plan.FoldPlan.unit_of; unit 0 aside, traced as
    itself) must be called alike, call for call: a block past the cut would otherwise be called with values the
    traced blocks do not show (`if n > 6`)."""

    def __init__(self, blocks: list[nn.Module], place: Callable[[int], tuple[int, int]]) -> None:
        self.blocks, self.place = blocks, place
        self.calls: dict[int, list[tuple[object, ...]]] = {}
        self._handles: list[RemovableHandle] = []

    def start(self) -> None:
        self.stop()
        self.calls = {}
        for j, block in enumerate(self.blocks):
            if self.place(j)[0] > 0:
                self._handles.append(block.register_forward_pre_hook(functools.partial(self._note, j),
                                                                     with_kwargs=True))

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _note(self, j: int, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.setdefault(j, []).append((*(_shown(a) for a in args), *((k, _shown(v)) for k, v in kwargs.items())))

    def reason(self) -> str | None:
        """Why the traced blocks were called with other plain values from unit to unit, or None."""
        first: dict[int, tuple[int, list[tuple[object, ...]]]] = {}  # place in a unit -> its first block's calls
        for j in sorted(self.calls):
            unit, position = self.place(j)
            calls = self.calls[j]
            if position not in first:
                first[position] = (j, calls)
            elif first[position][1] != calls:
                i, before = first[position]
                a, b = next(((x, y) for x, y in zip(before, calls, strict=False) if x != y), (before, calls))
                return (f"blocks {i} and {j} are called with other values besides their tensors ({_listed(a)}, "
                        f"then {_listed(b)}): the blocks past the cut would be called otherwise")
        return None


def _shown(v: object) -> object:
    sig = _scalar(v)
    return "…" if sig is _OTHER else sig


def _listed(call: object) -> str:
    return ", ".join(str(x) for x in call) if isinstance(call, tuple) else str(call)
