"""Which traced block's tensors the model's code reads in a folded forward (engine.trace.folded_trace).

A folded trace writes block j's events as those of one block of the N: the head's as the first blocks, the middle
ones' (the template's) as every block between, the tail's as the last. That holds while each op reads what the
block it stands for would read: its own block's tensors and the block's before it, the head's anywhere (they are
the first blocks in the full trace too), the tail's after the stack. An op that reads a middle block's tensor from
anywhere else (a skip from block 2 added after the stack, a torch.stack of every block's output) or reads the tail's
from inside the stack means a block the written trace cannot say: it is declined, and traced at the next rung (where
the last blocks are tail blocks) or in full.

Reads are what memory does not show: an add of a skip allocates the same bytes whichever block the skip is from,
but its gradient is summed into that block's backward (and a stack of every block's output is sized by the blocks
that ran)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .fold_plan import FoldDeclined
from .recorder import StorageRecorder, op_tensors

# (unit, position in it, the rest of the path) of a module inside the stack (DepthFold._tag), else None
Tag = Callable[[str], "tuple[int, int, str] | None"]


@dataclass
class StackReads:
    """rec.reader while a folded forward runs: each op's reads of the window's storages, as (the event index the op
    came at, its unit if it runs inside a traced block, the storage keys it reads)."""

    rec: StorageRecorder
    tag: Tag
    key_lo: int = 0  # the window's first storage key: storages made before it are no block's
    reads: list[tuple[int, int | None, list[int]]] = field(default_factory=list)

    def open(self, key_lo: int) -> None:
        self.key_lo = key_lo
        self.reads.clear()
        self.rec.reader = self

    def close(self) -> None:
        self.rec.reader = None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        rec = self.rec
        if rec.phase != "forward":
            return
        keys = [k for t in op_tensors((args, kwargs)) if (k := rec.key_of(t)) is not None and k >= self.key_lo]
        if keys:
            tag = self.tag(rec.module)
            self.reads.append((len(rec.events), None if tag is None else tag[0], keys))

    def check(self, lo: int, spans: list[tuple[int, int, int]], made_by: Callable[[int], int | None], head: int,
              tail: int, depth: int, units: int) -> None:
        """Raise FoldDeclined where an op of the forward at rec.events[lo:] (its units' `spans`, as (unit, start,
        end) in the window, in the order they ran) reads a unit's tensor (`made_by`: the unit of a storage made in
        the forward's units, else None) that the unit it stands for would not. `units`: the stack's, traced or not (a
        unit: `period` blocks)."""
        first, end = spans[0][1], spans[-1][2]
        before: dict[int, set[int]] = {j: set() for j, _, _ in spans if j >= head}  # unit -> pre-stack tensors read
        for at, unit, keys in self.reads:
            p = at - lo
            if p < 0:
                continue
            reader = unit
            if reader is None and first <= p < end:
                reader = next(j for j, u0, u1 in spans if u0 <= p < u1)
            for k in keys:
                src = made_by(k)
                if src is None and reader is not None and reader >= head and at < lo + end:
                    before[reader].add(k)
                if src is None or src < head:
                    continue
                if reader is None:
                    if p >= end and src >= depth - tail:
                        continue
                    where = "after the stack" if p >= end else "before the stack"
                elif reader - src in (0, 1):
                    continue
                else:
                    where = f"in block {reader}"
                raise FoldDeclined(f"the model's code {where} reads a tensor of block {src} (which of the N blocks "
                                   "it stands for would be a guess)")
        self._check_per_block(lo, first, before, units)

    def _check_per_block(self, lo: int, first: int, before: dict[int, set[int]], units: int) -> None:
        """A tensor made before the stack for one block (`zip(blocks, masks)`, Hugging Face's per-layer scalars):
        the blocks past the cut read others, which may differ (`masks[i]` wider from block 4 on). Each made by an op
        (and module) that made at least one tensor per unit (`units` of them) before the stack, all of the same
        size, is alike as far as memory goes; any other declines (fewer: the other blocks' may be another op's)."""
        sets = list(before.values())
        if not sets:
            return
        shared = set.intersection(*sets)
        own = set.union(*sets) - shared
        if not own:
            return
        sizes: dict[tuple[str, str], set[int]] = {}
        made_n: dict[tuple[str, str], int] = {}
        kind: dict[int, tuple[str, str]] = {}
        for e in self.rec.events[lo:lo + first]:
            if e.nbytes > 0:
                op = kind[e.storage] = (e.module, e.op)
                sizes.setdefault(op, set()).add(e.nbytes)
                made_n[op] = made_n.get(op, 0) + 1
        for k in own:
            made = kind.get(k)
            if made is None or len(sizes[made]) > 1 or made_n[made] < units:
                j = next(j for j, s in before.items() if k in s)
                what = f"made by {made[1]} in {made[0] or 'the model'}" if made else "made before its forward"
                why = (f"{made_n[made]} of them for the stack's {units} repeating units (the others' are made "
                       "otherwise)"
                       if made is not None and len(sizes[made]) == 1 else
                       "of other sizes for other blocks (those of the blocks not traced may differ)")
                raise FoldDeclined(f"block {j} reads a tensor of its own {what}, {why}")
