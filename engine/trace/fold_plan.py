"""Which stack of repeated blocks a trace folds (engine.trace.folded_trace), and why a model's blocks cannot be folded.

Blocks 1..N-1 of the model's largest ModuleList or Sequential must be the same computation: one class, the same
submodules, parameters and buffers (shapes, strides, dtypes, requires_grad), the same hooks and forward
overrides (by their code), and the same attributes, a block index aside (layer_idx, layer_number, a path naming
the block). Block 0 may differ (it is traced). What the checks cannot see (a forward that reads its layer index
to choose a path) is caught by the trace itself when it shows in the two middle blocks compared.

Where they are not all alike but repeat with a period p (2 to MAX_PERIOD: gemma-2's sliding and full attention
layers alternate), block i being the same computation as block i+p for every i >= p, the stack is folded over
*units* of p blocks: a unit plays the part a block plays at period 1 (FoldPlan.units; the folded trace works on
units only). Unit 0 holds blocks 0..p-1 and the remainder of N by p (blocks p..p+r-1; it is traced as it runs,
like any head unit), unit u >= 1 the p blocks from r + u*p: every unit after the first is then alike, and the
traced units are the first units of the stack. At period 1 a unit is its block.
"""

from __future__ import annotations

import functools
import re
import types
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core.grad_hooks import grad_hooks, has_grad_hooks
from ..results.estimate_fields import TraceFold
from .fold_known import own_code_reason
from .fold_loops import loop_reason
from .fold_state import shared_reason, state_reason

# Blocks traced, a rung of the ladder: `head` written as they ran (the first block may do what no other does),
# two middle ones compared with each other (the second is the template of every block written out), `tail` written
# as the last blocks (the last may do what no other does: a residual's gradient passed through). A block next to an
# odd one may refer to its odd allocations, and then the two middle ones differ: the next rung traces two more
# (a BERT or ResNet stack's last block is odd in backward), and a stack that differs there too is traced in full.
RUNGS = ((1, 1), (2, 2))  # (head, tail)


# The shortest stack folded: at the first rung a stack of 5 or 6 blocks would save a block or two, and where the
# first rung declines it (a ResNet stage's odd last block) the attempt would cost as much as the full trace.
MIN_BLOCKS = 7
# The longest period looked for (gemma-3: five sliding layers and a full one).
MAX_PERIOD = 8


def min_blocks(rung: int, period: int = 1) -> int:
    """The shortest stack folded at `rung` when its blocks repeat every `period`: one unit more than are traced."""
    head, tail = RUNGS[rung]
    return max(MIN_BLOCKS, (head + 2 + tail + 1) * period)


class FoldDeclined(Exception):
    """The recorded blocks do not repeat as folding needs: trace every block (the message says why)."""


@dataclass
class FoldPlan:
    """Which stack is folded: the container's module path, the container and its blocks, and the units they are
    folded by (see the module docstring)."""

    path: str
    model: nn.Module
    container: nn.Module
    blocks: list[nn.Module]
    rung: int = 0  # of RUNGS: how many units are traced
    period: int = 1  # blocks per unit (unit 0 also holds the remainder)
    # the attributes that hold a block's index (they differ from block to block by it), by submodule path in the
    # block: the folded trace declines when the traced blocks read them (engine.trace.fold_index)
    indexed: dict[str, frozenset[str]] = field(default_factory=dict)
    own_code: bool = False  # may the user's own code go through the stack (TrainConfig.fold_own_code: fold_known)
    units: list[nn.Module] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        p = self.period
        if p == 1:
            self.units = list(self.blocks)
            return
        starts = [0, *range(p + self.remainder, len(self.blocks), p)]
        self.units = [nn.ModuleList(self.blocks[a:b]) for a, b in zip(starts, [*starts[1:], len(self.blocks)],
                                                                          strict=True)]

    @property
    def remainder(self) -> int:
        """Blocks past a whole number of periods, held by unit 0."""
        return len(self.blocks) % self.period

    def block(self, unit: int, position: int) -> int:
        """The index in the stack of a unit's block at `position` (of the stack as traced or as written: their
        units are numbered alike)."""
        return position if unit == 0 else self.remainder + unit * self.period + position

    def unit_of(self, block: int) -> tuple[int, int]:
        """(unit, position in it) of a block index."""
        first = self.period + self.remainder
        if block < first:
            return 0, block
        unit, position = divmod(block - self.remainder, self.period)
        return unit, position

    @property
    def cut(self) -> int:
        """The blocks traced: those of the traced units."""
        return self.block(self.depth, 0)

    @property
    def prefix(self) -> str:
        return f"{self.path}." if self.path else ""

    @property
    def head(self) -> int:
        return RUNGS[self.rung][0]

    @property
    def tail(self) -> int:
        return RUNGS[self.rung][1]

    @property
    def depth(self) -> int:
        """The units traced."""
        return self.head + 2 + self.tail

    def at_rung(self, rung: int) -> FoldPlan | None:
        """The same stack at another rung, or None when there is no such rung or the stack is too short for it."""
        if rung >= len(RUNGS) or len(self.blocks) < min_blocks(rung, self.period):
            return None
        return replace(self, rung=rung)

    @property
    def kind(self) -> tuple[str, type[nn.Module], int]:
        """What a rung found for this stack holds for the same stack of another trace: its path, block class and
        length (engine.trace.tracer remembers the rung that folded it; which rung it starts at changes the time a
        trace takes, never its events)."""
        return self.path, type(self.blocks[-1]), len(self.blocks)


def plan_fold(model: nn.Module, cfg: TrainConfig) -> FoldPlan | str:
    """The stack to fold in `model`'s trace, or why none is."""
    if cfg.full_trace:
        return "the full trace was asked for"
    if cfg.generating:
        return "generation is traced in full (its KV cache holds a slot per layer)"
    if cfg.compile:
        return "a compiled step is traced in full (torch.compile's graphs span the whole stack)"
    modules = dict(model.named_modules(remove_duplicate=False))
    if len(modules) != len({id(m) for m in modules.values()}):
        return "a module appears twice in the model"
    uses: dict[int, int] = {}
    for t in (*dict(model.named_parameters(remove_duplicate=False)).values(),
              *dict(model.named_buffers(remove_duplicate=False)).values()):
        uses[id(t)] = uses.get(id(t), 0) + 1
    candidates = []
    for path, mod in modules.items():
        if type(mod) not in (nn.ModuleList, nn.Sequential) or len(mod) < MIN_BLOCKS:
            continue
        names = list(mod._modules)
        if names != [str(i) for i in range(len(names))]:
            continue
        candidates.append((len(names), path, mod))
    if not candidates:
        return f"no ModuleList or Sequential of {MIN_BLOCKS} or more blocks"
    reasons = []
    for _size, path, mod in sorted(candidates, key=lambda c: -c[0]):
        blocks = [b for b in mod._modules.values() if b is not None]
        indexed: set[tuple[Any, ...]] = set()
        period = _period(blocks, uses, indexed)
        if isinstance(period, int):
            why = (None if cfg.fold_own_code else own_code_reason(model, blocks)) or _unwatchable(indexed) or \
                (loop_reason(model, path) if path else None) or state_reason(blocks[1]) or shared_reason(blocks)
            if why is None:
                attrs: dict[str, set[str]] = {}
                for name, key, *_inside in indexed:  # (_unwatchable: a module's own attributes only)
                    attrs.setdefault(name, set()).add(key)
                return FoldPlan(path, model, mod, blocks, period=period,
                                indexed={k: frozenset(v) for k, v in attrs.items()}, own_code=cfg.fold_own_code)
            period = why
        reasons.append(f"{path or 'the model'}: {period}")
    return "; ".join(reasons)


def _unwatchable(indexed: set[tuple[Any, ...]]) -> str | None:
    """Why a block index held inside another object (a list, a dict, a settings object) keeps the stack from
    folding: only a module's own attribute can be watched for reads (engine.trace.fold_index). (A name held inside
    one is not in `indexed`: see _differs.)"""
    for name, key, *path in indexed:
        if path:
            where = ".".join(str(x) for x in (name, key, *path) if x != "")
            return f"the blocks hold their index inside {where}, where a read of it cannot be seen"
    return None


def _period(blocks: list[nn.Module], uses: dict[int, int], indexed: set[tuple[Any, ...]]) -> int | str:
    """The smallest period p the blocks repeat with (block i the same computation as block i+p for every i >= p;
    1: blocks 1..N-1 alike, the first may differ, it is traced), or why they cannot be folded. `indexed` gets the
    signature entries (submodule, attribute, path in it) that differ by the block index at that period."""
    if len(blocks) < MIN_BLOCKS:
        return "a block is missing"
    for b in blocks:
        for m in b.modules():
            for t in (*m._parameters.values(), *m._buffers.values()):
                if t is not None and uses.get(id(t), 0) != 1:
                    return "a block shares a parameter or buffer with another module"
    sigs = [_signature(b) for b in blocks]
    first = _differs(sigs, 1, indexed)
    if first is None:
        return 1
    why = first[1]
    furthest: tuple[int, int, str] | None = None  # (the blocks that repeat before it breaks, period, where)
    tried = 1
    for p in range(2, MAX_PERIOD + 1):
        if len(blocks) < 2 * p + 1:  # nothing to compare
            break
        tried = p
        indexed.clear()
        broken = _differs(sigs, p, indexed)
        if broken is None:
            if len(blocks) < min_blocks(0, p):
                return (f"{why}; the blocks repeat every {p}, but {len(blocks)} blocks are too few to fold by "
                        f"{p} ({min_blocks(0, p)} or more)")
            return p
        if furthest is None or broken[0] - 2 * p > furthest[0]:  # (blocks 2p.. are compared)
            furthest = (broken[0] - 2 * p, p, broken[1])
    if furthest is None:
        return why
    return (f"{why}; nor do they repeat with a period of 2 to {tried} blocks (the longest run, every {furthest[1]}, "
            f"breaks at {furthest[2]})")


def _differs(sigs: list[list[tuple[Any, ...]]], p: int, indexed: set[tuple[Any, ...]]) -> tuple[int, str] | None:
    """Where blocks 2p.. first differ from their like in blocks p..2p-1 (block i's is p + (i - p) % p), as (block,
    why), or None when every block from p on repeats with period `p`; `indexed` gets the entries that differ by a
    block index, but a name held inside another object (peft's `kwargs["target_name"]`, the module's path): a name
    is for messages, not for choosing a path, and only a module's own attribute can be watched."""
    for i in range(2 * p, len(sigs)):
        r = p + (i - p) % p
        ref, sig = sigs[r], sigs[i]
        if len(sig) != len(ref):
            return i, f"block {i} has other submodules, parameters or attributes than block {r}"
        for a, c in zip(ref, sig, strict=True):
            if a == c:
                continue
            # a layer index (layer_idx, layer_number, a path naming the block) grows with the block
            if a[:-1] == c[:-1] and _indexed(a[-1], c[-1], i - r):
                if len(a) == 3 or not isinstance(a[-1], str):  # (submodule, attribute, value): its own attribute
                    indexed.add(a[:-1])
                continue
            return i, f"block {i} differs from block {r} at {'.'.join(str(x) for x in c[:2] if x)}"
    return None


def _indexed(a: object, c: object, shift: int) -> bool:
    """Are `a` (block 1's) and `c` (another block's) the same but for a block index grown by `shift`?"""
    if isinstance(a, bool) or isinstance(c, bool):
        return False
    if isinstance(a, int) and isinstance(c, int):
        return c - a == shift
    if isinstance(a, str) and isinstance(c, str):
        ta, tc = re.split(r"(\d+)", a), re.split(r"(\d+)", c)
        return len(ta) == len(tc) and all(x == y or (k % 2 == 1 and int(y) - int(x) == shift)
                                          for k, (x, y) in enumerate(zip(ta, tc, strict=True)))
    return False


_SKIPPED = frozenset({"_parameters", "_buffers", "_modules", "forward"})
_PLAIN = (bool, int, float, str, bytes, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)


def _signature(block: nn.Module) -> list[tuple[Any, ...]]:
    """What makes a block's computation: per submodule its class, forward override, hooks, parameters (with their
    gradient hooks), buffers and attributes (plain values as they are, tensors by shape, other objects by class and
    plain fields)."""
    out: list[tuple[Any, ...]] = []
    for name, m in block.named_modules():
        out.append((name, "class", type(m)))
        out.append((name, "forward", _callable(vars(m).get("forward"))))
        for key, value in vars(m).items():
            if key in _SKIPPED:
                continue
            kind = type(value)
            if kind in _PLAIN_TYPES:  # (most attributes: _fields' first case, inline; a subclass goes there)
                out.append((name, key, value))
                continue
            if (kind is dict or kind is OrderedDict) and not value:  # (nn.Module's hook dicts, most empty)
                out.append((name, key, () if "hook" in key else (kind, ())))
                continue
            if kind is set and not value:  # (nn.Module's _non_persistent_buffers_set, most empty)
                out.append((name, key, set))
                continue
            if "hook" in key and isinstance(value, dict):
                out.append((name, key, tuple(_callable(h) for h in value.values())))
                continue
            out.extend((name, key, *path, v) for path, v in _fields(value))
        for pname, p in m._parameters.items():
            out.append((name, pname, None if p is None else
                        (tuple(p.shape), p.stride(), p.dtype, p.requires_grad, type(p),
                         tuple(_callable(h) for h in grad_hooks(p))  # (its gradient hooks run in backward)
                         if has_grad_hooks(p) else ())))
        for bname, b in m._buffers.items():
            out.append((name, bname, None if b is None else (tuple(b.shape), b.stride(), b.dtype)))
    return out


def _fields(value: object, depth: int = 0) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, leaf) pairs describing an attribute's value."""
    if isinstance(value, _PLAIN):
        yield (), value
    elif isinstance(value, torch.Tensor):
        yield (), ("tensor", tuple(value.shape), value.dtype)
    elif isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)):
        yield (), _callable(value)
    elif depth < 2 and isinstance(value, (list, tuple)):
        yield (), (type(value), len(value))
        for i, v in enumerate(value):
            for path, leaf in _fields(v, depth + 1):
                yield (i, *path), leaf
    elif depth < 2 and isinstance(value, dict):
        yield (), (type(value), tuple(str(k) for k in value))
        for k, v in value.items():
            for path, leaf in _fields(v, depth + 1):
                yield (str(k), *path), leaf
    elif depth < 1 and not isinstance(value, type) and _plain_fields(value) is not None:
        yield (), type(value)
        for k, v in (_plain_fields(value) or {}).items():
            yield (k,), v
    else:
        yield (), type(value)


def _plain_fields(value: object) -> dict[str, Any] | None:
    """An object's own plain-valued fields (a per-layer settings object), or None when it has no __dict__."""
    try:
        fields = vars(value)
    except TypeError:
        return None
    return {k: v for k, v in fields.items() if isinstance(v, _PLAIN)}


def _callable(f: object) -> object:
    """A function by its code and the plain values it holds (one closure per block is the same function, unless it
    closes over a value of its block's: `k=24` in the last two), a partial by its function and arguments, anything
    else by its class and plain fields."""
    if f is None:
        return None
    if isinstance(f, types.MethodType):
        return ("method", _callable(f.__func__))
    if isinstance(f, types.FunctionType):
        cells = []
        for cell in f.__closure__ or ():
            try:
                cells.append(_held(cell.cell_contents))
            except ValueError:  # (a cell not filled yet)
                cells.append(None)
        return ("function", f.__code__, tuple(cells), tuple(_held(d) for d in f.__defaults__ or ()),
                tuple(sorted((k, _held(v)) for k, v in (f.__kwdefaults__ or {}).items())))
    if isinstance(f, functools.partial):
        return ("partial", _callable(f.func), tuple(_held(a) for a in f.args),
                tuple(sorted((k, _held(v)) for k, v in f.keywords.items())))
    fields = _plain_fields(f)
    return ("object", type(f), tuple(sorted(fields.items())) if fields else ())


def _held(v: object) -> object:
    """A value a function holds, as a signature compares it: plain values as they are, tensors by shape, functions
    by their code, anything else by its class."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    if isinstance(v, types.FunctionType):
        return ("function", v.__code__)
    return ("object", type(v))


def fold_debug(fold: FoldPlan | str) -> TraceFold:
    """What the estimate says about folding (Estimate.trace_fold): the stack and its depth, or why every block was
    traced."""
    if isinstance(fold, FoldPlan):
        return TraceFold(True, fold.path, len(fold.blocks), fold.cut, period=fold.period)
    return TraceFold(False, reason=fold)
