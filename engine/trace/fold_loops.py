"""Does the model's own loop over a stack act on which block it is at? (engine.trace.fold_plan)

A folded trace runs the stack's first few blocks (the container iterates as if it held those) and writes the rest
out. A loop that stops at a block (`if i == 8: break`), treats one block differently (`if i == k: x = x.detach()`,
`if i % 4 == 0`, `if i == 2: skip = x`) or hands the block its index (`blk(x, i)`) would run otherwise over the
blocks the trace cuts, and nothing in the blocks shows it. So the source of every method that names the stack, on
the modules from the model down to the stack's owner, is read: a `for` over the stack (its iterable names it, or its
body indexes it with the loop's variable) may use its index only to index something (`caches[i]`), may not test
the block (`if blk.layer_idx in …`), and may not `break` or `return` out of it. A method that names the stack but
whose source cannot be read is a reason too (a class made at run time). That is read before the trace; while it
runs, the cut container reads the loop that goes through it where it is (`loop_at`: also a helper function the
model hands the stack to) and where its length is taken (`counted_loop`)."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
import weakref
from collections.abc import Iterable, Iterator

from torch import nn


def loop_reason(model: nn.Module, path: str) -> str | None:
    """Why the loops over the stack at `path` (a module path in `model`) keep it from folding, or None."""
    parts = path.split(".")
    owners = [model]
    for name in parts[:-1]:
        owners.append(owners[-1].get_submodule(name))
    classes: list[type] = [type(mod) for mod in owners]
    for cls in dict.fromkeys(classes):
        why = _type_reason(cls, parts[-1])
        if why is not None:
            return why
    return None


# _type_reason's answers, by class held weakly (a user's model file loaded again lets its old classes go)
_REASONS: weakref.WeakKeyDictionary[type, dict[str, str | None]] = weakref.WeakKeyDictionary()


def _type_reason(cls: type, attr: str) -> str | None:
    """The reason of the first method of `cls` (as it resolves them: an override hides its base's) that loops over
    the stack named `attr` in a way a fold cannot follow."""
    known = _REASONS.setdefault(cls, {})
    if attr not in known:
        known[attr] = _read_type(cls, attr)
    return known[attr]


def methods(cls: type, resolved: bool) -> Iterator[tuple[type, str, types.FunctionType]]:
    """(defining class, name, function) of `cls`'s methods defined outside torch, `__init__` aside (it builds the
    stack, before any trace); `resolved`: only those `cls` resolves to (an override hides its base's)."""
    seen: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        for name, value in vars(base).items():
            if name == "__init__" or (resolved and name in seen):
                continue
            seen.add(name)
            if isinstance(value, types.FunctionType):
                yield base, name, inspect.unwrap(value)


def _read_type(cls: type, attr: str) -> str | None:
    for base, name, func in methods(cls, resolved=True):
        if not _names(func.__code__, attr):
            continue
        read = source_tree(func.__code__)
        if read is None:
            return f"the source of {base.__qualname__}.{name}, which uses {attr}, cannot be read"
        tree, first = read
        why = _function_reason(tree, attr, first)
        if why is not None:
            return f"{base.__qualname__}.{name}: {why}"
    return None


@functools.lru_cache(maxsize=1024)
def loop_at(code: types.CodeType, line: int, attr: str) -> str | None:
    """Why the loop that goes through the cut stack at `line` of `code`'s function (the caller of the container's
    `__iter__`: any function, the model's own methods or a helper it hands the stack to) cannot be followed, by
    the rules above, or None. A comprehension may not use the index or test the block either; going through the
    stack other than by a `for` or a comprehension (`iter(blocks)`, `list(blocks)`) is a reason too."""
    read = source_tree(code)
    name = code.co_name
    if read is None:
        return f"the source of {name}, which goes through the stack, cannot be read"
    tree, first = read
    at = line - first
    found = False  # every loop and comprehension whose iterable is on the line is read (`for b in (… for … in stack)`)
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and _on(node.iter, at):
            found = True
            where = f"{name}: its loop over the stack (line {first + node.lineno})"
            paired = _paired(node.iter, attr)
            if paired is not None:
                return f"{where} pairs it with `{paired}`"
            wrapped = _wrapped(node.iter, attr)
            if wrapped is not None:
                return f"{where} goes through it by `{wrapped}`"
            index, blocks = _target_roles(node.target, node.iter, attr, set())
            why = _body_reason(node, index, blocks, first) or _by_position(tree, node, first) or \
                _after_loop(tree, node, index, first)
            if why is not None:
                return f"{where} {why}"
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in node.generators:
                if _on(gen.iter, at):
                    found = True
                    wrapped = _wrapped(gen.iter, attr)
                    if wrapped is not None:
                        return f"{name}: its comprehension over the stack goes through it by `{wrapped}`"
                    index, blocks = _target_roles(gen.target, gen.iter, attr, set())
                    why = _comprehension_reason(node, gen, index, blocks, first)
                    if why is not None:
                        return f"{name}: {why}"
    return None if found else f"{name} goes through the stack other than by a for loop or a comprehension (line {line})"


@functools.lru_cache(maxsize=1024)
def loop_targets(code: types.CodeType, line: int) -> frozenset[str]:
    """The names the loops around `line` of `code`'s function bind (a `for`'s target, where the loop or its iterable
    spans the line; a comprehension's, where its iterable is on it): the block and its index, which change from
    block to block by design (loop_at reads what is done with them)."""
    read = source_tree(code)
    if read is None:
        return frozenset()
    tree, first = read
    at = line - first
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno <= at <= (node.end_lineno or node.lineno):
            names |= _flat(node.target)
        elif isinstance(node, ast.comprehension) and _on(node.iter, at):
            names |= _flat(node.target)
    return frozenset(names)


@functools.lru_cache(maxsize=1024)
def indexed_at(code: types.CodeType, line: int, attr: str) -> tuple[tuple[str, ...], ...]:
    """What the loop going through the stack at `line` (a `for`, or a comprehension, whose iterable is on the line:
    `enumerate(blocks)`, `range(len(blocks))`) indexes by the block's index, other than the stack: each as the chain
    of names it is reached by (`self.widths[i]` → ("self", "widths"), `masks[i]` → ("masks",)). The index may
    index something (loop_at), and the blocks past the cut get what those hold at their index (engine.trace.
    fold_state.indexed_reason reads it all)."""
    read = source_tree(code)
    if read is None:
        return ()
    tree, first = read
    at = line - first
    chains: dict[tuple[str, ...], None] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and _on(node.iter, at):
            index = _flat(node.target) if _counts(node.iter) else _target_roles(node.target, node.iter, attr, set())[0]
            parts: list[ast.AST] = list(_body_nodes(node))
        elif isinstance(node, ast.comprehension) and _on(node.iter, at):
            index, parts = _target_roles(node.target, node.iter, attr, set())[0], []
            for outer in ast.walk(tree):
                if isinstance(outer, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) and \
                        node in outer.generators:
                    parts = list(ast.walk(outer))
        else:
            continue
        for sub in parts:
            if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Load) and \
                    any(isinstance(n, ast.Name) and n.id in index for n in ast.walk(sub.slice)):
                chain = _chain(sub.value)
                if chain is not None and chain[-1] != attr:
                    chains[chain] = None
    return tuple(chains)


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    """`a.b.c` as ("a", "b", "c"); None for anything else (a call, a subscript)."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return (node.id, *reversed(names))


_PASS_THROUGH = ("enumerate", "zip")  # calls a loop may go through the stack by (zip: _paired's)


def _wrapped(it: ast.expr, attr: str) -> str | None:
    """The call a loop's iterable hands the stack to, other than `enumerate` or `zip` (`itertools.islice(blocks, 8)`,
    `filter(…, blocks)`, a generator of the user's): it may stop early or skip blocks past the cut, which the
    traced blocks do not show. None where the stack is iterated as it is (or through a comprehension, read as one)."""
    node: ast.expr = it
    while isinstance(node, ast.Call):
        f = node.func
        if not (isinstance(f, ast.Name) and f.id in _PASS_THROUGH):
            return ast.unparse(f)
        inner = [a for a in node.args if _stack(a, attr, set())] or node.args[:1]
        if not inner:
            return None
        node = inner[0]
    return None


def _paired(it: ast.expr, attr: str) -> str | None:
    """The source of a sequence a `zip` pairs the stack with (not a count), or None: the cut stack ends the zip at
    the traced blocks, so the items left bound after the loop are a traced block's, not the last block's (a tensor
    of each block's, `zip(blocks, masks)`, is then freed in another order), and those past the cut are not seen."""
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip"):
        return None
    others = [a for a in it.args if not _counts(a) and not _stack(a, attr, set())]
    if len(others) == len(it.args):  # none names the stack (a helper's parameter): the first is taken for it
        others = others[1:]
    return ast.unparse(others[0]) if others else None


def _on(node: ast.expr, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def _target_roles(target: ast.AST, it: ast.AST, attr: str, aliases: set[str]) -> tuple[set[str], set[str]]:
    """(index names, block names) of a loop's target going through the stack: `enumerate`'s count is the index; of
    a `zip`'s, a count's names are an index and the stack's (or, where no argument names it, every other) blocks;
    the other names go along."""
    names = _flat(target)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and isinstance(target, ast.Tuple):
        elts = target.elts
        if it.func.id == "enumerate" and len(elts) == 2:
            return _flat(elts[0]), _flat(elts[1])
        if it.func.id == "zip":
            pairs = list(zip(it.args, elts, strict=False))
            index = {n for a, e in pairs if _counts(a) for n in _flat(e)}
            named = {n for a, e in pairs if _stack(a, attr, aliases) for n in _flat(e)}
            return index, named or names - index
    return set(), names


def _comprehension_reason(node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp,
                          gen: ast.comprehension, index: set[str], blocks: set[str], first: int) -> str | None:
    parts: list[ast.AST] = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    parts += [g for g in node.generators if g is not gen] + list(gen.ifs)
    tests = {id(n) for c in gen.ifs for n in ast.walk(c)}
    for part in parts:
        slices = {id(n) for sub in ast.walk(part) if isinstance(sub, ast.Subscript) for n in ast.walk(sub.slice)}
        why = _name_reason(ast.walk(part), index, blocks, slices, tests, first)
        if why is not None:
            return f"its comprehension over the stack {why}"
    return None


def _name_reason(nodes: Iterable[ast.AST], index: set[str], blocks: set[str], slices: set[int], tests: set[int],
                 first: int) -> str | None:
    """The first read of the loop's index other than in a subscript (or in a test), or of a block in a test."""
    for n in nodes:
        if not isinstance(n, ast.Name) or not isinstance(n.ctx, ast.Load):
            continue
        if n.id in index and (id(n) not in slices or id(n) in tests):
            return f"uses the block's index `{n.id}` (line {first + n.lineno})"
        if n.id in blocks and id(n) in tests:
            return f"tests the block `{n.id}` (line {first + n.lineno})"
    return None


@functools.lru_cache(maxsize=1024)
def counted_loop(code: types.CodeType, line: int, attr: str) -> bool:
    """Is every `len(…)` on `line` of `code`'s function the bound of a `for` over the stack named `attr` (`for i in
    range(len(self.attr))` whose body indexes the stack by `i`) or the length of a list of Nones (`[None] *
    len(self.attr)`: a slot per block, filled as each runs)? A folded trace's cut stack measures as the blocks it
    runs: such a loop runs those, as iterating it does; anywhere else its length would be those, not all N."""
    read = source_tree(code)
    if read is None:
        return False
    tree, first = read
    loops = {id(n.iter.args[0]): n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor)) and
             isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Name) and n.iter.func.id == "range" and
             len(n.iter.args) == 1 and not n.iter.keywords}
    slots = {id(side) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
             for side, other in ((n.left, n.right), (n.right, n.left)) if _nones(other)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and
             n.func.id == "len" and first + n.lineno <= line <= first + (n.end_lineno or n.lineno)]
    for call in calls:
        if len(call.args) != 1 or not _stack(call.args[0], attr, set()):
            return False
        if id(call) in slots:
            continue
        loop = loops.get(id(call))
        if loop is None:
            return False
        if not _indexes_stack(loop, _flat(loop.target), attr, set()):
            return False
    return bool(calls)


@functools.lru_cache(maxsize=1024)
def counted_after(code: types.CodeType, line: int, attr: str) -> str | None:
    """Why a `for i in range(len(stack))` on `line` of `code`'s function (counted_loop's) cannot be followed for
    what it leaves after it (_after_loop), or None."""
    read = source_tree(code)
    if read is None:
        return None  # (counted_loop has refused it)
    tree, first = read
    at = line - first
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and _counts(node.iter) and _on(node.iter, at):
            why = _after_loop(tree, node, _flat(node.target), first)
            if why is not None:
                return f"{code.co_name}: its loop over the stack (line {first + node.lineno}) {why}"
    return None


def _after_loop(tree: ast.AST, loop: ast.For | ast.AsyncFor, index: set[str], first: int) -> str | None:
    """A read of the loop's index outside the loop (`x.new_zeros(i + 1, …)` after it or in its `else:`, or anywhere
    in a loop around it), or None: the cut stack ends the loop at the traced blocks, so the index is left at the last
    traced block, not the stack's last. A read the function binds the name anew before (`i = 3`), or a comprehension
    or another loop's own name, is not the loop's."""
    if not index:
        return None
    # (its `else:` runs after the loop: not inside)
    inside = {id(n) for part in (loop.target, loop.iter, *loop.body) for n in ast.walk(part)}
    end = max([loop.iter.end_lineno or loop.iter.lineno, *((st.end_lineno or st.lineno) for st in loop.body)])
    around = any(isinstance(n, _LOOPS) and n is not loop and id(n) not in inside and id(loop) in
                 {id(x) for x in ast.walk(n)} for n in ast.walk(tree))
    for name in sorted(index):
        own = {id(x) for n in ast.walk(tree) if _binds(n, name) and n is not loop for x in ast.walk(n)}
        stores = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and
                  isinstance(n.ctx, ast.Store) and id(n) not in inside and id(n) not in own]
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)) or id(n) in inside or \
                    id(n) in own:
                continue
            if n.lineno < loop.lineno and not around:
                continue  # (before the loop: what it was bound to then)
            if not around and any(end < s < n.lineno for s in stores):
                continue  # (bound anew after the loop)
            return f"uses `{name}` after the loop (line {first + n.lineno}): it is left at the last traced block"
    return None


def _binds(node: ast.AST, name: str) -> bool:
    """Is `node` a comprehension or a `for` whose own target binds `name` (its reads of it are its own)?"""
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return any(name in _flat(g.target) for g in node.generators)
    return isinstance(node, (ast.For, ast.AsyncFor)) and name in _flat(node.target)


def _nones(node: ast.AST) -> bool:
    """Is `node` a list literal of Nones (`[None]`)?"""
    return isinstance(node, ast.List) and bool(node.elts) and \
        all(isinstance(e, ast.Constant) and e.value is None for e in node.elts)


def source_tree(code: types.CodeType) -> tuple[ast.AST, int] | None:
    """The parsed source of a function's code and the line before its first in the file (an AST line n is the
    file's line n + that), or None when it cannot be read (made at run time)."""
    try:
        lines, first = inspect.getsourcelines(code)
        return ast.parse(textwrap.dedent("".join(lines))), first - 1
    except (OSError, TypeError, SyntaxError):
        return None


def _names(code: types.CodeType, attr: str) -> bool:
    """Does `code` (or a function or comprehension inside it) load the attribute `attr`?"""
    return attr in code.co_names or any(isinstance(c, types.CodeType) and _names(c, attr) for c in code.co_consts)


def _function_reason(tree: ast.AST, attr: str, first: int) -> str | None:
    """Why a method's loop over the stack cannot be followed (`first`: the line before the method's in its file)."""
    aliases = _aliases(tree, attr)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        roles = _roles(node, attr, aliases)
        if roles is None:
            continue
        index, blocks = roles
        why = _body_reason(node, index, blocks, first) or _by_position(tree, node, first) or \
            _after_loop(tree, node, index, first)
        if why is not None:
            return f"its loop over {attr} (line {first + node.lineno}) {why}"
    return None


def _by_position(tree: ast.AST, loop: ast.For | ast.AsyncFor, first: int) -> str | None:
    """A list the loop adds to each block's output (`outs.append(x)`), indexed anywhere by a position from its
    start or by a variable (`outs[4]`): the traced blocks' list holds only those, so `outs[4]` is a traced block
    that may stand for another. From its end (`outs[-1]`, `outs[-2]`) is the last blocks' in both."""
    kept: set[str] = set()
    for n in _body_nodes(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr in ("append", "extend", "insert") and isinstance(n.func.value, ast.Name):
            kept.add(n.func.value.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and \
                isinstance(n.value, (ast.Tuple, ast.List)):  # `hidden += (x,)`
            kept.add(n.target.id)
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in kept and \
                isinstance(n.ctx, ast.Load) and not _from_end(n.slice):
            line = first + n.lineno
            return f"keeps each block's output in `{n.value.id}` and takes one by its position (line {line})"
        counted = _counted_list(n, kept)
        if counted is not None:
            name, at = counted
            return f"keeps each block's output in `{name}` and {_HOW[type(n) is ast.Call]} (line {first + at})"
    return None


_HOW = {True: "takes its length", False: "goes through it"}


def _counted_list(n: ast.AST, kept: set[str]) -> tuple[str, int] | None:
    """The list of each block's outputs that `n` measures (`len(outs)`) or goes through (`for o in outs`, a
    comprehension over it, through `enumerate`/`zip`/`reversed`) and its line, or None: it holds the traced blocks'
    outputs only, so its length and the passes over it are the traced blocks' count, not the stack's."""
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len" and len(n.args) == 1 and \
            isinstance(n.args[0], ast.Name) and n.args[0].id in kept:
        return n.args[0].id, n.lineno
    it = n.iter if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) else None
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "zip", "reversed"):
        it = next((a for a in it.args if isinstance(a, ast.Name) and a.id in kept), it.args[0] if it.args else None)
    return (it.id, it.lineno) if isinstance(it, ast.Name) and it.id in kept else None


def _from_end(index: ast.AST) -> bool:
    """Is a subscript's index a constant counted from the end (`-1`, `-2`)?"""
    return isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and \
        isinstance(index.operand, ast.Constant) and isinstance(index.operand.value, int)


def _stack(node: ast.AST, attr: str, aliases: set[str]) -> bool:
    """Does expression `node` name the stack (`….attr`, or a local name bound to it)?"""
    return any((isinstance(n, ast.Attribute) and n.attr == attr) or (isinstance(n, ast.Name) and n.id in aliases)
               for n in ast.walk(node))


def _aliases(tree: ast.AST, attr: str) -> set[str]:
    """Local names bound to an expression that names the stack (`layers = self.layers[:n]`)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _stack(node.value, attr, out):
            out.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return out


def _roles(node: ast.For | ast.AsyncFor, attr: str, aliases: set[str]) -> tuple[set[str], set[str]] | None:
    """(index names, block names) of a loop over the stack, or None when it is not one."""
    target, it = node.target, node.iter
    names = _flat(target)
    if not _counts(it) and _stack(it, attr, aliases):
        return _target_roles(target, it, attr, aliases)
    # `for i in range(…)` whose body indexes the stack with the loop's variable
    return (set(names), set()) if _indexes_stack(node, names, attr, aliases) else None


def _indexes_stack(loop: ast.For | ast.AsyncFor, names: set[str], attr: str, aliases: set[str]) -> bool:
    """Does the loop's body index the stack with one of `names` (its variable: `self.blocks[i]`)?"""
    return any(isinstance(sub, ast.Subscript) and _stack(sub.value, attr, aliases) and
               any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(sub.slice))
               for sub in _body_nodes(loop))


def _counts(node: ast.AST) -> bool:
    """Is `node` a count (`range(…)`, `itertools.count(…)`)?"""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id in ("range", "count")) or (isinstance(f, ast.Attribute) and
                                                                         f.attr == "count")


def _flat(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _body_nodes(loop: ast.For | ast.AsyncFor, stop: tuple[type[ast.AST], ...] = _DEFINITIONS) -> Iterator[ast.AST]:
    """The nodes of a loop's body, not inside a function or class defined in it (`stop`: the nodes not looked
    into; with _LOOPS too, the nodes that belong to this loop, not to a loop inside it, where a `break` ends the
    inner one)."""
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, stop):
            todo.extend(ast.iter_child_nodes(node))


def _body_reason(loop: ast.For | ast.AsyncFor, index: set[str], blocks: set[str], first: int) -> str | None:
    body = list(_body_nodes(loop))
    slices = {id(n) for sub in body if isinstance(sub, ast.Subscript) for n in ast.walk(sub.slice)}
    tests = {id(n) for sub in body if isinstance(sub, (ast.If, ast.While, ast.IfExp, ast.Assert))
             for n in ast.walk(sub.test)}
    tests |= {id(n) for sub in body if isinstance(sub, (ast.Compare, ast.BoolOp)) for n in ast.walk(sub)}
    if any(isinstance(n, ast.Return) for n in body):
        return "returns from inside it"
    if any(isinstance(n, ast.Break) for n in _body_nodes(loop, _DEFINITIONS + _LOOPS)):
        return "breaks out of it"
    return _name_reason(body, index, blocks, slices, tests, first)

