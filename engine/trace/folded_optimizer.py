"""The optimizer step of a folded trace, run over the traced blocks' parameters only and written out for the rest.

A folded trace (engine.trace.folded_trace) runs a few (plan.depth) of the stack's N blocks in forward and backward and
writes the others out; stepping the optimizer over all N blocks' parameters would be most of a deep model's
trace then. Here the step (with its GradScaler) runs over the parameters of the blocks that were traced
(the head, the two middle ones, the tail) and of the rest of the model; while it runs, the recorder gives each
new storage the block of the op's inputs (a multi-tensor op's i-th output: its i-th input's). Then, in the events
it recorded:

- the events come in *passes* through the traced blocks, in parameter order (a multi-tensor op's outputs, a
  per-parameter loop) or back (a list freed from its end); an event's block is its storage's, or for a free the
  block of the op running when it came; a block's *unit* in a pass is its events and those after them up to the
  next block's, what lies between passes a *region* (the rest of the model's parameters);
- the two middle blocks' units must be the same events relative to their blocks in every pass;
- the blocks between are written there, in that order, each a copy of the template's unit (new storages; frees
  by the block they are relative to, so a loop that frees the previous parameter's temporary in the next one's
  update frees the right one), with the template's kernel costs; the state they leave alive (exp_avg, …) gets
  the template's role, owned by the copy's module.

The zero_grad after the step runs in such a window too: it frees the traced blocks' gradients, and the written-out
blocks', which are storages of the trace only (engine.trace.folded_trace.DepthFold.virtual), in their place.

An op that reads two blocks' tensors (a norm over all gradients), a block's run that frees what the window did not
make, or a run without its twin raise FoldDeclined: the model is traced in full. Only the optimizers of
engine.config.optimizers' table are stepped here (make_optimizer): their updates are per parameter.

Where the stack repeats with a period over 1 (engine.trace.fold_plan), a "block" here is a unit of the stack
(FoldPlan.units: its blocks' parameters, gradients and state).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..core.bookkeeping import bookkeeping
from .fold_plan import FoldDeclined
from .folded_trace import DepthFold
from .recorder import RawEvent

Code = tuple[Any, ...]


@dataclass
class _Pass:
    """One pass of the optimizer step through the traced blocks (up: in parameter order): each block's unit."""

    up: bool
    units: list[tuple[int, list[RawEvent]]]

    def close(self, owners: dict[int, int]) -> list[RawEvent]:
        """Ends the pass: the last unit's trailing events of no block are the region after it (returned)."""
        evs = self.units[-1][1]
        k = len(evs)
        while k > 1 and owners.get(evs[k - 1].storage) is None:
            k -= 1
        rest = evs[k:]
        del evs[k:]
        return rest


class OptimizerFold:
    """`window(opt)` around each optimizer step of a folded trace and around its zero_grad (which frees the
    written-out blocks' gradients, storages of the trace only: DepthFold.virtual); `copy_roles(roles, owner)` once
    the real state's roles are set (record_step's after_optimizer)."""

    def __init__(self, fold: DepthFold) -> None:
        self.fold = fold
        self.rec = fold.rec
        count, depth = fold.count, fold.depth
        self.template = fold.template
        tail = fold.tail
        self.twin = self.template - 1  # the other middle block (the head's last + 1 when two are compared)
        assert self.twin >= fold.head
        self.traced = [*range(depth - tail), *range(count - tail, count)]
        self.written = range(depth - tail, count - tail)
        self.skipped = {id(p) for j in self.written for p in fold.plan.units[j].parameters()}
        self.copies: dict[int, tuple[int, int]] = {}  # a written storage -> (the template's storage, its block)
        self._gone: set[int] = set()  # the written-out blocks' gradients freed (by zero_grad)

    @contextmanager
    def window(self, opt: torch.optim.Optimizer) -> Iterator[None]:
        rec = self.rec
        with bookkeeping():
            groups = [g["params"] for g in opt.param_groups]
            owners = self._owners(opt, with_params=True)
            self._slot_key = {(j, name): rec.track(p.grad) for j in self.traced
                              for name, p in self.fold.plan.units[j].named_parameters()
                              if p.grad is not None and rec.tracks(p.grad)}
            self._slot = {k: slot for slot, k in self._slot_key.items()}
            lo, key_lo, costs_lo = len(rec.events), rec.next_key, len(self.fold.costs)
            for g in opt.param_groups:
                g["params"] = [p for p in g["params"] if id(p) not in self.skipped]
        rec.owners, rec.owner_now, rec.owners_mixed = owners, None, False
        try:
            yield  # (the optimizer's step or zero_grad: seen by every mode)
        finally:
            rec.owners, rec.owner_now = None, None
            for g, params in zip(opt.param_groups, groups, strict=True):
                g["params"] = params
        if rec.owners_mixed:
            raise FoldDeclined("the optimizer step reads several blocks' tensors in one op")
        with bookkeeping():
            for k, j in self._owners(opt, with_params=False).items():  # the state made in the window: a step
                owners.setdefault(k, j)  # counter is made before its parameter is seen
            rec.events[lo:] = self._written(rec.events[lo:], lo, owners, key_lo)
            rec.free_actor.clear()
            self._copy_costs(costs_lo)

    def _owners(self, opt: torch.optim.Optimizer, with_params: bool) -> dict[int, int]:
        """The traced blocks' storages: their parameters and gradients (with_params) and optimizer state, by key;
        one that several blocks hold (bitsandbytes' quantization maps, in every parameter's state) is no block's."""
        rec = self.rec
        owners: dict[int, int] = {}
        shared: set[int] = set()
        for j in self.traced:
            for p in self.fold.plan.units[j].parameters():
                mine = (p, p.grad) if with_params else ()
                for t in (*mine, *opt.state.get(p, {}).values()):
                    if isinstance(t, torch.Tensor) and rec.tracks(t):
                        k = rec.track(t)
                        if owners.setdefault(k, j) != j:
                            shared.add(k)
        for k in shared:
            del owners[k]
        return owners

    # -- reading the window ------------------------------------------------------------------------------------

    def _passes(self, window: list[RawEvent], lo: int, owners: dict[int, int]) -> list[list[RawEvent] | _Pass]:
        """The window as regions (events of no block) and passes through the traced blocks, each block's unit its
        events and those after them up to the next block's. An event's block: a free's, the op's that was running
        when it came (a loop's update freeing the previous parameter's temporary), else its storage's."""
        rec, traced = self.rec, self.traced
        actors: list[int | None] = []
        for i, e in enumerate(window):
            a = rec.free_actor.get(lo + i) if e.nbytes < 0 else None
            actors.append(a if a is not None else owners.get(e.storage))
        after: list[int | None] = [None] * len(window)  # the block of the next event of another block
        first: int | None = None  # the next event's block (of those with one)
        second: int | None = None  # the next one's after it of another block
        for i in range(len(window) - 1, -1, -1):
            after[i] = first if first != actors[i] else second
            a = actors[i]
            if a is not None and a != first:
                first, second = a, first
        items: list[list[RawEvent] | _Pass] = []
        region: list[RawEvent] = []
        cur: _Pass | None = None
        gap = False  # events of no block since the current unit's last own event
        for i, e in enumerate(window):
            a = actors[i]
            complete = cur is not None and len(cur.units) == len(traced)
            if cur is not None and a is not None and complete:
                last = cur.units[-1][0]
                turns = (traced[-2] if last == traced[-1] else traced[1] if last == traced[0] else None)
                if a == turns and not gap:  # back through the blocks at once: the last one's events split anywhere
                    cur = _Pass(not cur.up, [(last, []), (a, [e])])
                    items += [[], cur]
                    continue
                if a != last or (gap and after[i] == turns):  # the next pass begins
                    region = cur.close(owners)
                    cur = None
            if cur is None:
                if a is None:
                    region.append(e)
                    continue
                items.append(region)
                region = []
                if a not in (traced[0], traced[-1]):
                    raise FoldDeclined("the optimizer step's events begin in the middle of the stack")
                cur = _Pass(a == traced[0], [(a, [e])])
                items.append(cur)
                gap = False
                continue
            gap = a is None
            if a is None or a == cur.units[-1][0]:
                cur.units[-1][1].append(e)
                continue
            order = traced if cur.up else traced[::-1]
            if a != order[len(cur.units)]:
                raise FoldDeclined("the optimizer step goes through the blocks out of order")
            cur.units.append((a, [e]))
        if cur is not None:
            region = cur.close(owners)
            if len(cur.units) != len(traced):
                raise FoldDeclined("the optimizer step's last pass through the blocks misses some")
        items.append(region)
        return items

    def _written(self, window: list[RawEvent], lo: int, owners: dict[int, int], key_lo: int) -> list[RawEvent]:
        items = self._passes(window, lo, owners)
        pos = {b: q for q, b in enumerate(self.traced)}
        made: dict[int, tuple[int, int]] = {}  # a storage made in the window -> (its block, ordinal)
        keys: dict[int, list[int]] = {b: [] for b in self.traced}  # each block's storages, in order
        coded: list[list[RawEvent] | tuple[bool, dict[int, list[Code]]]] = []
        for item in items:
            if isinstance(item, list):
                coded.append(item)
                continue
            units = {b: self._codes(evs, b, pos, made, keys, key_lo) for b, evs in item.units}
            if units[self.twin] != units[self.template]:
                raise FoldDeclined("the optimizer step treats the middle blocks differently")
            if any(c[0] == "F" for c in units[self.template]):
                raise FoldDeclined("the optimizer step's middle blocks free a storage of no block")
            coded.append((item.up, units))
        for b in self.written:
            keys[b] = []
        self._seen: dict[int, int] = {}
        out: list[RawEvent] = []
        freed: set[int] = set()
        for entry in coded:
            if isinstance(entry, list):
                out += entry
                continue
            up, units = entry
            blocks = range(self.fold.count) if up else range(self.fold.count - 1, -1, -1)
            for jb in blocks:
                src = jb if jb in units else self.template
                out += self._decode(units[src], jb, src, keys, freed)
        alive = {b: sum(1 for k in ks if k not in freed) for b, ks in keys.items()}
        if any(alive[b] != alive[self.template] for b in self.written):
            raise FoldDeclined("a written block's optimizer step would leave other storages alive than the template")
        return out

    def _codes(self, events: list[RawEvent], b: int, pos: dict[int, int], made: dict[int, tuple[int, int]],
               keys: dict[int, list[int]], key_lo: int) -> list[Code]:
        """Block b's unit relative to its block: allocations by size, frees by (the block's offset from b, the
        ordinal of that block's allocation; another block's counted from its end so far where the fold says so:
        DepthFold.from_end), a storage of no block by its key."""
        mine = keys[b]
        codes: list[Code] = []
        for e in events:
            mod = self.fold.module_code(e.module, b)
            k = e.storage
            if e.nbytes >= 0 and k >= key_lo and k not in made:  # (a free of what a region made is no block's)
                made[k] = (b, len(mine))
                mine.append(k)
                codes.append(("a", e.nbytes, e.phase, mod, e.op))
                continue
            at = made.get(k)
            if at is None:
                if k < key_lo:
                    slot = self._slot.get(k)
                    if slot is None or slot[0] != b:
                        raise FoldDeclined(f"block {b}'s optimizer step frees a storage made before it")
                    codes.append(("g", e.nbytes, e.phase, mod, e.op, slot[1]))  # its gradient (zero_grad)
                else:
                    codes.append(("F", k, e.nbytes, e.phase, mod, e.op))
            else:
                o = at[1]
                if self.fold.from_end and at[0] != b:  # another block's, by its place from its end so far
                    o -= len(keys[at[0]])
                codes.append(("f", e.nbytes, e.phase, mod, e.op, pos[at[0]] - pos[b], o))
        return codes

    def _decode(self, codes: list[Code], jb: int, src: int, keys: dict[int, list[int]],
                freed: set[int]) -> list[RawEvent]:
        """Block jb's unit from its source's codes (jb's own when traced, else the template's)."""
        rec, fold, out = self.rec, self.fold, []
        traced = jb == src
        mine = keys[jb]
        n = self._seen.get(jb, 0)  # the block's allocations decoded in earlier passes
        for code in codes:
            kind = code[0]
            if kind == "a":
                _, nbytes, phase, mod, op = code
                if traced:
                    k = mine[n]
                else:
                    k = rec.copied(nbytes)
                    self.copies[k] = (keys[src][n], jb)
                    mine.append(k)
                n += 1
                out.append(RawEvent(k, nbytes, rec.step, phase, fold.module_name(mod, jb), op))
                continue
            if kind == "f":
                _, nbytes, phase, mod, op, dj, o = code
                theirs = keys.get(jb + dj, [])
                if not -len(theirs) <= o < len(theirs) or rec.nbytes[theirs[o]] != -nbytes:
                    raise FoldDeclined("a written block's optimizer step would free a storage it does not hold")
                k = theirs[o]
            elif kind == "g":
                _, nbytes, phase, mod, op, name = code
                found = self._slot_key.get((jb, name)) if traced else fold.virtual.get((jb, name))
                if found is None or rec.nbytes[found] != -nbytes or found in self._gone:
                    raise FoldDeclined("a written block would free a gradient it does not have")
                k = found
            else:
                _, k, nbytes, phase, mod, op = code
            if k in freed:
                raise FoldDeclined("a written storage would be freed twice")
            freed.add(k)
            if kind == "g" and not traced:
                self._gone.add(k)
            out.append(RawEvent(k, nbytes, rec.step, phase, fold.module_name(mod, jb), op))
        self._seen[jb] = n
        return out

    def _copy_costs(self, lo: int) -> None:
        """The template's kernel costs in the window, once for each block written out."""
        costs = self.fold.costs
        mine = [c for c, o in zip(costs[lo:], costs.owner[lo:], strict=True) if o == self.template]
        if len(mine) != sum(1 for o in costs.owner[lo:] if o == self.twin):
            raise FoldDeclined("the optimizer step's kernels differ between the middle blocks")
        for _ in self.written:
            costs.copied(mine)

    def copy_roles(self, roles: dict[int, str], owner: dict[int, str]) -> None:
        """The written storages' roles and owning modules (those written since the last call): their template's,
        in their own block."""
        for k, (tk, jn) in self.copies.items():
            if tk in roles:
                roles[k] = roles[tk]
            if tk in owner:
                owner[k] = self.fold.module_name(self.fold.module_code(owner[tk], self.template), jn)
        self.copies.clear()
