"""Depth-independent tracing: a stack of identical blocks traced at a few blocks' depth, the rest written out.

A decoder stack is N copies of one block: in forward and in backward, each block allocates the same sizes in
the same order as its neighbour, shifted by one block. Where the model's largest stack of repeated blocks
passes engine.trace.fold_plan's checks, only its first few blocks run in each forward (the plan's depth: 4, or 6
at the second rung of fold_plan.RUNGS; the container iterates, slices and indexes as if it held those;
named_modules, the parameters and the optimizer still see all N). When a step's forward and backward end,
`DepthFold` reads the recorded window:

- each block's events are one contiguous run in forward (0, 1, …) and in backward (…, 1, 0); a block's *unit*
  is its run and the events up to the next block's run; what comes before the first and after the last is a
  *region* (the embedding, the head, the loss);
- every event of a unit is encoded relative to its block: the module path with the block's index as an offset,
  each free as (segment, block offset, ordinal of the allocation in that block's unit; where the first unit holds
  more blocks than the others, a stack's remainder at a period over 1, another block's counted from its end);
- the two middle units (the two blocks after the plan's head) must encode identically in both segments, with the
  same kernel costs and the same gradients left alive;
- the window is rewritten for N blocks: the head blocks and the middle ones as traced, the last middle unit's
  encoding (the template) decoded for each block up to N-tail-1, the tail's traced blocks as the last
  blocks. A region's events that go through every block (a KV cache freed layer by layer) are written for every
  block; the region's own storages freed among them (gemma-2's cache: a sliding layer's window tensor, made for
  every layer before the stack, also for those not traced) are freed by the written blocks in the order they were
  made. The gradients the written-out blocks leave are storages of the trace only (`virtual`) when an optimizer
  step follows: it is folded too (engine.trace.folded_optimizer: stepped over the traced blocks, its zero_grad
  frees them), and the replayed second step (engine.trace.step_replay) gives each its new storage; the traced
  tail's move to the last blocks (and back before the next micro-step's forward, to accumulate into). Without an
  optimizer step they are made as real (fake) tensors. Every written storage must be freed at most once, and
  exactly the traced storages plus the new gradients may be left alive (so a backward that frees every block's
  leftovers at its end, as non-reentrant checkpointing of a Hugging Face model does, is traced in full).

Where the stack's blocks repeat with a period p > 1 (engine.trace.fold_plan: gemma-2's sliding and full layers),
"block" above means a *unit* of p blocks (FoldPlan.units): a module path inside it is encoded by (unit offset,
position in the unit, the rest of the path), its gradients are its blocks' ("position.name"), and plan.cut blocks
are traced. At period 1 a unit is its block.

Anything else (events out of order, a unit that frees what an earlier step made, the model's code referring to
a middle block's tensor, the model indexing a block past the traced ones) raises FoldDeclined, and the step is
traced again at the next rung, or in full after the last (engine.trace.tracer), extra.trace_fold saying why.
TrainConfig.full_trace (--full-trace) turns folding off; generation (its KV cache has a slot per layer) is always
traced in full.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cuda.kernels import KernelCost
from .fold_index import IndexWatch
from .fold_plan import FoldDeclined, FoldPlan
from .fold_reads import StackReads
from .fold_stack import cut_stack
from .fold_state import ArgWatch
from .recorder import RawEvent, StorageRecorder

SEGMENTS = ("forward", "backward")
# an event encoded relative to its unit's block (see the module docstring)
Code = tuple[Any, ...]
Module = tuple[str, int, int, str] | tuple[str, str]


class _PlacedCosts(list[KernelCost]):
    """A recorder's kernel costs, each with the index of the event recorded next when it was costed."""

    def __init__(self, rec: StorageRecorder) -> None:
        super().__init__()
        self.rec = rec
        self.at: list[int] = []
        self.owner: list[int | None] = []  # the block of the op costed (the recorder's owner_now)

    def append(self, cost: KernelCost) -> None:
        self.at.append(len(self.rec.events))
        self.owner.append(self.rec.owner_now)
        super().append(cost)

    def copied(self, costs: list[KernelCost]) -> None:
        """A written-out block's kernel calls: the template block's."""
        self.at.extend([len(self.rec.events)] * len(costs))
        self.owner.extend([None] * len(costs))
        super().extend(costs)


@dataclass
class _Unit:
    codes: list[Code] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # its allocations' storage keys, in order
    kept: list[tuple[int, str]] = field(default_factory=list)  # (ordinal, parameter name): gradients left alive
    costs: list[KernelCost] = field(default_factory=list)

    def signature(self) -> tuple[Any, ...]:
        return tuple(self.codes), tuple(self.kept), tuple(self.costs)

    def diff(self, other: _Unit) -> str:
        """Where this unit first differs from `other`, for the debug field."""
        for i, (a, b) in enumerate(zip(self.codes, other.codes, strict=False)):
            if a != b:
                return f" at its event {i}: {a} vs {b}"
        if len(self.codes) != len(other.codes):
            return f": {len(self.codes)} events vs {len(other.codes)}"
        return ": in the gradients it leaves" if self.kept != other.kept else ": in its kernels' costs"


class DepthFold:
    """Runs a step with `plan`'s stack cut to plan.depth blocks and writes the rest into `rec`'s events.

    `open()` as each forward begins, `close()` when its step's forward and backward have ended (training: before
    the gradients are read), `discard()` instead when the window was copied by engine.trace.step_replay, `restore()`
    always at the end."""

    def __init__(self, plan: FoldPlan, rec: StorageRecorder, virtual_grads: bool = False) -> None:
        self.plan = plan
        self.rec = rec
        # virtual_grads (the optimizer step is folded too: engine.trace.folded_optimizer): the written-out blocks'
        # gradients are storages of the trace only, no tensors: (block, parameter name) -> storage key
        self.virtual_grads = virtual_grads
        self.virtual: dict[tuple[int, str], int] = {}
        self.depth = plan.depth
        self.head, self.tail = plan.head, plan.tail
        self.count = len(plan.units)
        self._class = type(plan.container)
        self.refused: list[str] = []  # why the cut container refused the model's slice or index
        self._entries: dict[str, int] = {}
        self._taken: list[tuple[str, int]] = []
        self._cut = cut_stack(self._class, plan.cut, len(plan.blocks), self.refused, plan.prefix, self._entries,
                               self._taken, plan.unit_of, plan.own_code)
        self.costs = _PlacedCosts(rec)
        rec.kernel_costs = self.costs
        self._lo: int | None = None
        self._key_lo = 0
        self._tags: dict[str, tuple[int, int, str] | None] = {}
        self._names: dict[tuple[Module, int], str] = {}
        self._params: dict[int, dict[str, torch.nn.Parameter]] = {}  # _grads' (emptied as each _expand begins)
        # A unit frees another's storage by its ordinal there; where unit 0 holds a remainder (more blocks than the
        # others), counted from that unit's end (the unit after it frees its output as the next one frees theirs)
        self.from_end = plan.remainder > 0
        self.reads = StackReads(rec, self._tag)
        self.index = IndexWatch([(block.get_submodule(path), attrs) for block in plan.blocks[:plan.cut]
                                 for path, attrs in plan.indexed.items()])
        self.args = ArgWatch(plan.blocks[:plan.cut], plan.unit_of)

    def open(self) -> None:
        self.close()
        if self.virtual_grads:  # the traced tail accumulates into the last blocks' gradients (a micro-step's)
            shift = self.count - self.depth
            for j in range(self.depth - self.tail, self.depth):
                last = self._grads(j + shift)
                for name, p in self._grads(j).items():
                    p.grad = last[name].grad
        rec = self.rec
        self._lo = len(rec.events)
        self._key_lo = 1 + max((e.storage for e in rec.events), default=-1)
        self.reads.open(self._key_lo)
        self.index.start()
        self.args.start()
        self._entries.clear()
        self._taken.clear()
        rec.entries = self._entries
        self.plan.container.__class__ = self._cut

    def discard(self) -> None:
        self.restore()
        self._lo = None

    def restore(self) -> None:
        self.rec.entries = None
        self.reads.close()
        self.index.stop()
        self.args.stop()
        self.plan.container.__class__ = self._class

    def close(self) -> None:
        self.restore()
        lo, self._lo = self._lo, None
        if lo is not None and lo < len(self.rec.events):
            self._expand(lo)

    # -- reading the window -------------------------------------------------------------------------------------

    def _tag(self, module: str) -> tuple[int, int, str] | None:
        """(unit, the block's position in it, the rest of the path) of a module inside the stack, else None."""
        if module in self._tags:
            return self._tags[module]
        tag = None
        prefix = self.plan.prefix
        if module.startswith(prefix) and module:
            head, dot, tail = module[len(prefix):].partition(".")
            if head.isdigit():
                tag = (*self.plan.unit_of(int(head)), dot + tail)
        self._tags[module] = tag
        return tag

    def _expand(self, lo: int) -> None:
        depth = self.depth
        self._params.clear()
        if self.refused:
            raise FoldDeclined(self.refused[0])
        if self.index.read is not None:
            raise FoldDeclined(f"the traced blocks read their index ({self.index.read}): a block may choose its path "
                               "by it")
        called = self.args.reason()
        if called is not None:
            raise FoldDeclined(called)
        window = self.rec.events[lo:]
        step = window[0].step
        if any(e.step != step for e in window):
            raise FoldDeclined("a step's window holds events of another step")
        segments = [s for s in SEGMENTS if any(e.phase == s for e in window)]
        bounds = []
        start = 0
        for s in segments:
            end = start
            while end < len(window) and window[end].phase == s:
                end += 1
            bounds.append((start, end))
            start = end
        if start != len(window) or any(a == b for a, b in bounds):
            raise FoldDeclined("the window holds other phases than one forward and its backward")
        self._alloc_at: dict[int, tuple[int, int, int]] = {}  # key -> (segment, block, ordinal)
        self._made: dict[tuple[int, int], int] = {}  # (segment, block) -> its allocations read so far
        self._region_keys: set[int] = set()
        self._freed: set[int] = set()
        units: dict[tuple[int, int], _Unit] = {}
        layout: list[tuple[bool, list[int], Region, Region]] = []
        for si, (a, b) in enumerate(bounds):
            backward = segments[si] == "backward"
            spans = self._spans(window, a, b, backward)
            pre = self._read_region(window[a:spans[0][1]], end_side=backward)
            for j, u0, u1 in spans:
                units[si, j] = self._read_unit(window[u0:u1], si, j)
            if not backward:
                self.reads.check(lo, spans, self._made_in_forward, self.head, self.tail, depth, self.count)
            post = self._read_region(window[spans[-1][2]:b], end_side=not backward)
            layout.append((backward, [j for j, _, _ in spans], pre, post))
            for j, u0, u1 in spans:
                units[si, j].costs = [c for c, at in zip(self.costs, self.costs.at, strict=True)
                                      if lo + u0 <= at < lo + u1]
        self._check_kept(units)
        for si in range(len(segments)):
            ref = units[si, self.head]
            for j in range(self.head + 1, depth - self.tail):
                if units[si, j].signature() != ref.signature():
                    raise FoldDeclined(f"block {j}'s {segments[si]} differs from block {self.head}'s"
                                       f"{units[si, j].diff(ref)}")
        alive = sum(1 for k in [*self._alloc_at, *self._region_keys] if k not in self._freed)
        written = self._written(layout, units, step, alive)
        self.rec.events[lo:] = written
        template = [c for si in range(len(segments)) for c in units[si, self.template].costs]
        for _ in range(self.count - depth):
            self.costs.copied(template)

    def _spans(self, window: list[RawEvent], a: int, b: int, backward: bool) -> list[tuple[int, int, int]]:
        """(block, start, end) of each block's unit in window[a:b], in the order they ran: its own events and
        those after them, up to the next block's."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i in range(a, b):
            tag = self._tag(window[i].module)
            if tag is None:
                continue
            j = tag[0]
            if j >= self.depth:
                raise FoldDeclined(f"block {self.plan.block(j, tag[1])} ran, past the {self.plan.cut} traced")
            first.setdefault(j, i)
            last[j] = i
        order = list(range(self.depth))
        if backward:
            order.reverse()
        if sorted(first) != order[::-1 if backward else 1]:
            raise FoldDeclined("a traced block recorded nothing")
        for x, y in zip(order, order[1:], strict=False):
            if last[x] >= first[y]:
                raise FoldDeclined("the blocks' events interleave")
        return [(j, first[j], first[order[k + 1]] if k + 1 < len(order) else last[j] + 1)
                for k, j in enumerate(order)]

    def _made_in_forward(self, k: int) -> int | None:
        """The unit whose forward made storage k, or None."""
        at = self._alloc_at.get(k)
        return at[1] if at is not None and SEGMENTS[at[0]] == "forward" else None

    def _is_new(self, k: int) -> bool:
        return k >= self._key_lo and k not in self._alloc_at and k not in self._region_keys and k not in self._freed

    def _read_region(self, events: list[RawEvent], end_side: bool) -> Region:
        """Events outside the blocks' units. A run of them that goes through the blocks' storages block by block
        (a KV cache freed layer by layer) is written for every block; a lone reference may be to the first two
        blocks before the stack, to the last two after it (written as blocks N-2 and N-1), to no other: which
        block of the N it means would be a guess."""
        refs: list[tuple[RawEvent, tuple[int, int, int] | None]] = []
        for e in events:
            k = e.storage
            if self._is_new(k):
                self._region_keys.add(k)
                refs.append((e, None))
                continue
            self._freed.add(k)
            refs.append((e, self._alloc_at.get(k)))
        out: Region = []
        i = 0
        while i < len(refs):
            e, at = refs[i]
            if at is None:
                out.append(e)
                i += 1
                continue
            end = i  # a run of references to the blocks' storages, the region's own frees among them
            while end < len(refs) and (refs[end][1] is not None or self._region_free(refs[end][0])):
                end += 1
            while refs[end - 1][1] is None:
                end -= 1
            run = refs[i:end]
            blocks = [r[1][1] for r in run if r[1] is not None]
            if len(set(blocks)) == self.depth:
                item = self._block_run(run)
                out.append(item)
                end += self._own_frees(item, out, refs, end)
            else:
                for e2, at2 in run:
                    if at2 is None:
                        out.append(e2)
                        continue
                    out.append(_Ref(e2, (at2[0], self._lone(at2[1], end_side), at2[2])))
            i = end
        return out

    def _lone(self, j: int, end_side: bool) -> int:
        """The block as written of traced unit j, whose storage a region's lone reference frees: the head's and the
        tail's are the first and the last blocks on either side (a gradient summed in place along a residual, made
        by the tail's backward, is freed by the embedding's); otherwise the first two before the stack, the last two
        after it, whatever the rung: at the first, the second and the last but one are middle blocks, written as
        themselves and as block N-2 (_written checks it adds up)."""
        shift = self.count - self.depth
        if j < self.head:
            return j
        if j >= self.depth - self.tail:
            return j + shift
        if end_side and j >= self.depth - 2:
            return j + shift
        if not end_side and j < 2:
            return j
        raise FoldDeclined("the model's code outside the blocks refers to a middle block's tensor")

    def _region_free(self, e: RawEvent) -> bool:
        """Is `e` a free of a storage the window's regions made (a KV cache layer's own tensor)?"""
        return e.nbytes < 0 and e.storage in self._region_keys and e.storage not in self._alloc_at

    def _own_frees(self, item: _BlockRun, out: Region, refs: list[tuple[RawEvent, tuple[int, int, int] | None]],
                   end: int) -> int:
        """A run through the blocks whose blocks' parts free storages of the region too (a cache made for every
        layer before the stack, its sliding layers holding a tensor of their own; a block's part: its references
        and the region's frees after them): those of the blocks not traced (before the run going down, after it
        going up: taken from `out` or from refs[end:]) join item.extras, in the order they came, which the written
        blocks free in turn, and so do the tail's going up (after its references, the run's end). They must have
        been made in that order (down: the last block's first), so that each written block frees the one made for
        its place. Going down, the first block's (after the run) stay the region's: it is written as traced. The
        refs taken (returned)."""
        slots = [e for e, s, _o in item.per[self.template] if s < 0]
        if not slots:
            return 0
        untraced = len(slots) * (self.count - self.depth)
        before = untraced if item.down else 0
        after = 0 if item.down else len(slots) + untraced
        lead = out[max(0, len(out) - 1 - before):-1] if before else []
        trail = [e for e, _at in refs[end:end + after]]
        got = [*lead, *trail]
        if len(lead) != before or len(trail) != after or not all(isinstance(e, RawEvent) and self._region_free(e)
                                                                 for e in got):
            raise FoldDeclined("the model's code outside the blocks frees its own storages along the blocks unevenly")

        def shape(e: RawEvent) -> tuple[Any, ...]:
            return e.nbytes, e.phase, e.module, e.op

        for q in range(0, len(got), len(slots)):
            if [shape(e) for e in got[q:q + len(slots)]] != [shape(e) for e in slots]:  # type: ignore[arg-type]
                raise FoldDeclined("the model's code outside the blocks frees other storages along the untraced "
                                   "blocks")
        item.per[self.depth - 1] += [(e, -1, -1) for e in trail[:len(slots)]]  # (going up; none going down)
        lead_keys = [e.storage for e in lead]  # type: ignore[union-attr]
        item.extras = [*lead_keys, *item.extras, *(e.storage for e in trail)]
        if item.extras != sorted(item.extras, reverse=item.down):
            raise FoldDeclined("the model's code outside the blocks frees its own storages along the blocks out of "
                               "the order it made them")
        del out[len(out) - 1 - before:-1]
        return after

    def _block_run(self, run: list[tuple[RawEvent, tuple[int, int, int] | None]]) -> _BlockRun:
        """Region events going through every traced block's storages in order (up or down), the same for each; the
        region's own frees among them are each its block's (those after its references: see _own_frees)."""
        per: dict[int, list[tuple[RawEvent, int, int]]] = {}
        order: list[int] = []
        extras: list[int] = []
        for e, at in run:
            if at is None:
                per[order[-1]].append((e, -1, -1))
                extras.append(e.storage)
                continue
            if not order or order[-1] != at[1]:
                if at[1] in per:
                    raise FoldDeclined("the model's code outside the blocks goes back and forth between blocks")
                order.append(at[1])
                per[at[1]] = []
            per[at[1]].append((e, at[0], at[2]))
        up = list(range(self.depth))
        if order not in (up, up[::-1]):
            raise FoldDeclined("the model's code outside the blocks goes through the blocks out of order")

        def shape(j: int) -> list[tuple[Any, ...]]:
            return [(e.nbytes, e.phase, e.module, e.op, s, o) for e, s, o in per[j]]

        if any(shape(j) != shape(self.head) for j in range(self.head + 1, self.depth - self.tail)):
            raise FoldDeclined("the model's code outside the blocks treats the middle blocks differently")
        return _BlockRun(order[0] != 0, per, extras)

    def _read_unit(self, events: list[RawEvent], si: int, j: int) -> _Unit:
        unit = _Unit()
        for e in events:
            k = e.storage
            mod = self.module_code(e.module, j)
            if self._is_new(k):
                self._alloc_at[k] = (si, j, len(unit.keys))
                self._made[si, j] = len(unit.keys) + 1
                unit.keys.append(k)
                unit.codes.append(("a", e.nbytes, e.phase, mod, e.op))
                continue
            if k < self._key_lo:
                raise FoldDeclined(f"block {j} frees a storage made before its step")
            self._freed.add(k)
            at = self._alloc_at.get(k)
            if at is None:  # made by the model's code before the stack: the same storage for every block
                unit.codes.append(("F", k, e.nbytes, e.phase, mod, e.op))
            else:
                o = at[2]
                if self.from_end and (at[0], at[1]) != (si, j):  # another unit's, complete: from its end
                    o -= self._made[at[0], at[1]]
                b = at[1]
                if j < self.head and b >= self.depth - self.tail:
                    # a head block freeing a tail block's storage: the last blocks', written as the tail's, not the
                    # block that many after it (a residual added in the model's own loop: the gradient autograd
                    # sums in place is made in the last block's backward and freed in the first's)
                    unit.codes.append(("t", e.nbytes, e.phase, mod, e.op, at[0], b - self.depth, o))
                elif j >= self.depth - self.tail and b < self.head:  # a tail block freeing a head block's storage
                    unit.codes.append(("h", e.nbytes, e.phase, mod, e.op, at[0], b, o))
                else:
                    unit.codes.append(("f", e.nbytes, e.phase, mod, e.op, at[0], b - j, o))
        return unit

    def module_code(self, module: str, j: int) -> Module:
        tag = self._tag(module)
        return ("=", module) if tag is None else ("b", tag[0] - j, tag[1], tag[2])

    def module_name(self, code: Module, j: int) -> str:
        """The module path of `code` (module_code's) in unit j (made once per code and unit: a written-out
        block's events name a few modules many times)."""
        key = (code, j)
        name = self._names.get(key)
        if name is None:
            if code[0] == "=":
                name = str(code[1])
            else:
                _b, dj, position, rest = code  # type: ignore[misc]
                name = f"{self.plan.prefix}{self.plan.block(j + dj, position)}{rest}"
            self._names[key] = name
        return name

    def idle_modules(self) -> set[int]:
        """The ids of the modules of the units past the cut (theirs and their submodules): they never run here, as
        the cut container holds the first `depth` units only."""
        return {id(m) for u in range(self.depth, self.count) for m in self.plan.units[u].modules()}

    def virtual_params(self) -> Iterator[tuple[int, torch.nn.Parameter]]:
        """(storage key, parameter) of each gradient in `virtual`."""
        by_block: dict[int, dict[str, torch.nn.Parameter]] = {}
        for (j, name), k in self.virtual.items():
            if j not in by_block:
                by_block[j] = self._grads(j)
            yield k, by_block[j][name]

    def _grads(self, j: int) -> dict[str, torch.nn.Parameter]:
        """Unit j's parameters by name (at a period over 1: "position.name"), read once per `_expand`."""
        params = self._params.get(j)
        if params is None:
            params = self._params[j] = dict(self.plan.units[j].named_parameters())
        return params

    def _check_kept(self, units: dict[tuple[int, int], _Unit]) -> None:
        """What the window leaves alive must be gradients. A middle block's must be made in its own unit (the
        template's are made again for each block written out); the head's, the tail's and the rest of the model's
        anywhere (written as traced; the tail's move with their blocks: `_moves`)."""
        rec = self.rec
        owner: dict[int, tuple[int | None, str]] = {}  # gradient key -> (block or None, parameter name)
        in_stack = {id(p) for b in self.plan.blocks for p in b.parameters()}
        for name, p in self.plan.model.named_parameters():
            if p.grad is not None and rec.tracks(p.grad) and id(p) not in in_stack:
                owner[rec.track(p.grad)] = (None, name)
        for j in range(self.depth):
            for name, p in self._grads(j).items():
                if p.grad is not None and rec.tracks(p.grad):
                    owner[rec.track(p.grad)] = (j, name)
        middle = range(self.head, self.depth - self.tail)
        self._moves: list[tuple[int, str]] = []
        for (_si, j), unit in units.items():
            for o, k in enumerate(unit.keys):
                if k in self._freed:
                    continue
                who = owner.get(k)
                if who is None or (who[0] in middle and who[0] != j):
                    raise FoldDeclined(f"block {j} leaves a tensor alive that is not one of its gradients "
                                       f"({unit.codes[self._code_of(unit, o)]})")
                if who[0] in middle:
                    unit.kept.append((o, who[1]))
                elif who[0] is not None and who[0] >= self.depth - self.tail:
                    self._moves.append((who[0], who[1]))
        for k in self._region_keys:
            if k in self._freed:
                continue
            who = owner.get(k)
            if who is not None and who[0] in middle:
                raise FoldDeclined(f"block {who[0]}'s gradient of {who[1]} is made outside its own events")
            if who is not None and who[0] is not None and who[0] >= self.depth - self.tail:
                self._moves.append((who[0], who[1]))

    @staticmethod
    def _code_of(unit: _Unit, ordinal: int) -> int:
        """The index in unit.codes of its `ordinal`-th allocation."""
        seen = -1
        for i, code in enumerate(unit.codes):
            if code[0] == "a":
                seen += 1
                if seen == ordinal:
                    return i
        raise IndexError(ordinal)

    # -- writing N blocks ---------------------------------------------------------------------------------------

    def _written(self, layout: list[tuple[bool, list[int], Region, Region]], units: dict[tuple[int, int], _Unit],
                 step: int, window_alive: int) -> list[RawEvent]:
        count, rec = self.count, self.rec
        new_grads = self._new_grads(units)
        keys: dict[tuple[int, int], list[int]] = {}
        sizes: dict[int, int] = {}
        out: list[RawEvent] = []

        def region(events: Region) -> None:
            for item in events:
                if isinstance(item, RawEvent):
                    out.append(item)
                elif isinstance(item, _Ref):
                    out.append(item.event._replace(storage=self._key(keys, item.at, item.event.nbytes, sizes)))
                else:
                    extras = iter(item.extras)
                    for jn in (range(count - 1, -1, -1) if item.down else range(count)):
                        src = self._source(jn)
                        for e, s2, o in item.per[src]:
                            if s2 < 0:  # the region's own storage, the next of those freed along the blocks
                                k = next(extras, None)
                                if k is None or rec.nbytes[k] != -e.nbytes:
                                    raise FoldDeclined("a written block would free a storage it does not hold")
                                out.append(e._replace(storage=k))
                                continue
                            out.append(e._replace(storage=self._key(keys, (s2, jn, o), e.nbytes, sizes)))
                    if next(extras, None) is not None:
                        raise FoldDeclined("the written blocks would leave storages alive that the traced ones free")

        for si, (backward, _order, pre, post) in enumerate(layout):
            region(pre)
            for jn in (range(count - 1, -1, -1) if backward else range(count)):
                src = self._source(jn)
                unit = units[si, src]
                mine = keys[si, jn] = []
                for code in unit.codes:
                    kind = code[0]
                    if kind == "a":
                        _, nbytes, phase, mod, op = code
                        o = len(mine)
                        if src == jn or jn >= count - self.tail:
                            k = unit.keys[o]
                        else:
                            k = new_grads[si, jn, o] if (si, jn, o) in new_grads else rec.copied(nbytes)
                        mine.append(k)
                        sizes[k] = nbytes
                        out.append(RawEvent(k, nbytes, step, phase, self.module_name(mod, jn), op))
                    elif kind in ("f", "t", "h"):
                        _, nbytes, phase, mod, op, s2, b, o2 = code  # b: an offset (f), from the end (t), a block (h)
                        at = jn + b if kind == "f" else count + b if kind == "t" else b
                        k = self._key(keys, (s2, at, o2), nbytes, sizes)
                        out.append(RawEvent(k, nbytes, step, phase, self.module_name(mod, jn), op))
                    else:
                        _, k, nbytes, phase, mod, op = code
                        out.append(RawEvent(k, nbytes, step, phase, self.module_name(mod, jn), op))
            region(post)
        self._check_written(out, units, window_alive)
        return out

    def _check_written(self, out: list[RawEvent], units: dict[tuple[int, int], _Unit], traced_alive: int) -> None:
        """Each storage written is freed at most once, and as many are left alive as traced, plus the gradients of
        the blocks written out: nothing a written block made is left behind."""
        made: set[int] = set()
        freed: set[int] = set()
        for e in out:
            k = e.storage
            if k >= self._key_lo and k not in made:
                made.add(k)
            elif k in freed:
                raise FoldDeclined("a written storage would be freed twice")
            else:
                freed.add(k)
        grads = sum(len(u.kept) for (_s, j), u in units.items() if j == self.template)
        if len(made - freed) != traced_alive + grads * (self.count - self.depth):
            raise FoldDeclined("the written blocks would leave storages alive that the traced ones free")

    @property
    def template(self) -> int:
        """The traced block whose events every written-out block repeats: the last middle one."""
        return self.depth - self.tail - 1

    def _source(self, jn: int) -> int:
        """The traced block whose events are written as block jn: itself for the head and the middle ones, the
        tail for the last blocks, else the template."""
        if jn < self.depth - self.tail:
            return jn
        if jn >= self.count - self.tail:
            return jn - (self.count - self.depth)
        return self.template

    @staticmethod
    def _key(keys: dict[tuple[int, int], list[int]], at: tuple[int, int, int], nbytes: int,
             sizes: dict[int, int]) -> int:
        """The storage a free refers to in the written blocks; its size must be the free's."""
        mine = keys.get((at[0], at[1]))
        if mine is None or not -len(mine) <= at[2] < len(mine) or sizes[mine[at[2]]] != -nbytes:
            raise FoldDeclined("a written block would free a storage it does not hold")
        return mine[at[2]]

    def _new_grads(self, units: dict[tuple[int, int], _Unit]) -> dict[tuple[int, int, int], int]:
        """The gradients of the written-out blocks, made for real: the tail's become the last blocks', the blocks
        between get new ones like the template's (virtual_grads: storages only, in `virtual`).
        (segment, block, ordinal) → storage key."""
        depth, count, rec = self.depth, self.count, self.rec
        shift = count - depth
        for j, name in sorted(self._moves, reverse=True):  # the last first: its place may be another's source
            self._grads(j + shift)[name].grad = self._grads(j)[name].grad
        template = self._grads(self.template)
        made: dict[tuple[int, int, int], int] = {}
        if self.virtual_grads:
            for jn in range(depth - self.tail, count - self.tail):
                for p in self.plan.units[jn].parameters():
                    p.grad = None  # (the blocks cut from the trace may hold those moved to the tail)
        for (si, j), unit in units.items():
            if j != self.template:
                continue
            for jn in range(depth - self.tail, count - self.tail):
                params = self._grads(jn)
                for o, name in unit.kept:
                    g0 = template[name].grad
                    assert g0 is not None  # kept: _check_kept found it
                    p = params[name]
                    if self.virtual_grads:
                        made[si, jn, o] = self.virtual[jn, name] = rec.copied(g0.untyped_storage().nbytes())
                        continue
                    g = torch.empty_strided(tuple(g0.size()), g0.stride(), dtype=g0.dtype, device=p.device)
                    nbytes = g0.untyped_storage().nbytes()
                    if g.untyped_storage().nbytes() != nbytes:  # the template's was a view of a larger buffer
                        g = torch.empty(nbytes, dtype=torch.uint8, device=p.device).view(g0.dtype).as_strided(
                            tuple(g0.size()), g0.stride())
                    made[si, jn, o] = rec.track(g, "grad")
                    p.grad = g
        return made


@dataclass
class _Ref:
    """A region's event that frees a block's storage: (segment, block as written, ordinal)."""

    event: RawEvent
    at: tuple[int, int, int]


@dataclass
class _BlockRun:
    """A region's events going through every block (down: from the last), as traced per block:
    (event, segment, ordinal of the block's storage it frees; -1, -1: a free of the region's own storage, the next of
    `extras`, the keys of those freed along the blocks in the order they came)."""

    down: bool
    per: dict[int, list[tuple[RawEvent, int, int]]]
    extras: list[int]


Region = list[RawEvent | _Ref | _BlockRun]

