"""Which stack of repeated blocks a trace folds (engine.trace.folded_trace), and why a model's blocks cannot be folded.

Blocks 1..N-1 of the model's largest ModuleList or Sequential must be the same computation: one class, the same
submodules, parameters and buffers (shapes, strides, dtypes, requires_grad), the same hooks and forward
overrides (by their code), and the same attributes, a block index aside (layer_idx, layer_number, a path naming
the block). Block 0 may differ (it is traced). What the checks cannot see (a forward that reads its layer index
to choose a path) is caught by the trace itself when it shows in the two middle blocks compared.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..results.estimate_fields import TraceFold

# Blocks traced, a rung of the ladder: `head` written as they ran (the first block may do what no other does),
# two middle ones compared with each other (the second is the template of every block written out), `tail` written
# as the last blocks (the last may do what no other does: a residual's gradient passed through). A block next to an
# odd one may refer to its odd allocations, and then the two middle ones differ: the next rung traces two more
# (a BERT or ResNet stack's last block is odd in backward), and a stack that differs there too is traced in full.
RUNGS = ((1, 1), (2, 2))  # (head, tail)


# The shortest stack folded: at the first rung a stack of 5 or 6 blocks would save a block or two, and where the
# first rung declines it (a ResNet stage's odd last block) the attempt would cost as much as the full trace.
MIN_BLOCKS = 7


def min_blocks(rung: int) -> int:
    """The shortest stack folded at `rung`."""
    head, tail = RUNGS[rung]
    return max(MIN_BLOCKS, head + 2 + tail + 1)
SEGMENTS = ("forward", "backward")

@dataclass
class FoldPlan:
    """Which stack is folded: the container's module path, the container and its blocks."""

    path: str
    model: nn.Module
    container: nn.Module
    blocks: list[nn.Module]
    rung: int = 0  # of RUNGS: how many blocks are traced

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
        """The blocks traced."""
        return self.head + 2 + self.tail

    def at_rung(self, rung: int) -> FoldPlan | None:
        """The same stack at another rung, or None when there is no such rung or the stack is too short for it."""
        if rung >= len(RUNGS) or len(self.blocks) < min_blocks(rung):
            return None
        return replace(self, rung=rung)

    @property
    def kind(self) -> tuple[str, type[nn.Module], int]:
        """What a rung found for this stack holds for the same stack of another trace: its path, block class and
        length (engine.trace.tracer remembers the rung that folded it)."""
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
        why = _blocks_differ(blocks, uses)
        if why is None:
            return FoldPlan(path, model, mod, blocks)
        reasons.append(f"{path or 'the model'}: {why}")
    return "; ".join(reasons)


def _blocks_differ(blocks: list[nn.Module], uses: dict[int, int]) -> str | None:
    """Why blocks 1..N-1 are not the same computation (the first may differ: it is traced), or None."""
    if len(blocks) < MIN_BLOCKS:
        return "a block is missing"
    for b in blocks:
        for t in (*b.parameters(), *b.buffers()):
            if uses.get(id(t), 0) != 1:
                return "a block shares a parameter or buffer with another module"
    ref = _signature(blocks[1])
    for i, b in enumerate(blocks[2:], start=2):
        sig = _signature(b)
        if len(sig) != len(ref):
            return f"block {i} has other submodules, parameters or attributes than block 1"
        for a, c in zip(ref, sig, strict=True):
            if a == c:
                continue
            # a layer index (layer_idx, layer_number, a path naming the block) grows with the block
            if a[:-1] == c[:-1] and _indexed(a[-1], c[-1], i - 1):
                continue
            return f"block {i} differs from block 1 at {'.'.join(str(x) for x in c[:2] if x)}"
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


_SKIPPED = ("_parameters", "_buffers", "_modules", "forward")
_PLAIN = (bool, int, float, str, bytes, type(None))


def _signature(block: nn.Module) -> list[tuple[Any, ...]]:
    """What makes a block's computation: per submodule its class, forward override, hooks, parameters,
    buffers and attributes (plain values as they are, tensors by shape, other objects by class and plain
    fields)."""
    out: list[tuple[Any, ...]] = []
    for name, m in block.named_modules():
        out.append((name, "class", type(m)))
        out.append((name, "forward", _callable(vars(m).get("forward"))))
        for key, value in vars(m).items():
            if key in _SKIPPED:
                continue
            if "hook" in key and isinstance(value, dict):
                out.append((name, key, tuple(_callable(h) for h in value.values())))
                continue
            out.extend((name, key, *path, v) for path, v in _fields(value))
        for pname, p in m._parameters.items():
            out.append((name, pname, None if p is None else
                        (tuple(p.shape), p.stride(), p.dtype, p.requires_grad, type(p))))
        for bname, b in m._buffers.items():
            out.append((name, bname, None if b is None else (tuple(b.shape), b.stride(), b.dtype)))
    return out


def _fields(value: object, depth: int = 0) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, leaf) pairs describing an attribute's value."""
    if isinstance(value, _PLAIN):
        yield (), value
    elif isinstance(value, torch.Tensor):
        yield (), ("tensor", tuple(value.shape), value.dtype)
    elif isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
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
    """A function by its code (one closure per block is the same function), anything else by its class."""
    if f is None:
        return None
    if isinstance(f, types.MethodType):
        return ("method", _callable(f.__func__))
    if isinstance(f, types.FunctionType):
        return ("function", f.__code__)
    return ("object", type(f))


def fold_debug(fold: FoldPlan | str) -> TraceFold:
    """What the estimate says about folding (Estimate.trace_fold): the stack and its depth, or why every block was
    traced."""
    if isinstance(fold, FoldPlan):
        return TraceFold(True, fold.path, len(fold.blocks), fold.depth)
    return TraceFold(False, reason=fold)
