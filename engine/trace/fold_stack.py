"""The cut stack of a folded trace (engine.trace.folded_trace): the stack's container class made to iterate, slice
and index as if it held the traced blocks, refusing the fold wherever the model's code would see the difference."""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from .fold_known import own_caller_reason
from .fold_loops import counted_after, counted_loop, indexed_at, loop_at, loop_targets
from .fold_plan import FoldDeclined
from .fold_state import frame_reason, indexed_reason, loop_state, state_change


def cut_stack(cls: type[nn.Module], depth: int, count: int, refused: list[str], prefix: str,
               entries: dict[str, int], taken: list[tuple[str, int]], place: Callable[[int], tuple[int, int]],
               own_code: bool = False) -> type[nn.Module]:
    """`cls` (ModuleList or Sequential) iterating, slicing and indexing as if it held `depth` blocks.

    Of its `count` blocks, an index names the same block as in the whole stack (`[-1]` is the last of the N, not of
    those traced) and a slice must take them all (`[: config.num_hidden_layers]`, itself a cut container). Each
    block handed out must run before the next is (`entries`: the recorder's count of each module's forwards; a
    loop over the stack that makes a tensor per block without running them, `[torch.zeros_like(x) for _ in
    blocks]`, would make `depth`, not `count`), and the loop that goes through it must be one the fold can follow
    (engine.trace.fold_loops.loop_at, read where it runs: a helper's `if i == 6: break` would stop past the
    cut); `taken`: the block last taken by index and its count then. Its
    length may only bound a loop over the stack's blocks (engine.trace.fold_loops.counted_loop): elsewhere
    (`x.new_zeros(len(blocks), …)`) it would be `depth`. Any other use refuses the fold, noted in `refused` (the
    model's code may catch the exception raised). Unless `own_code` (TrainConfig.fold_own_code), the code that goes
    through it must be a known library's (engine.trace.fold_known)."""
    attr = prefix[:-1].rpartition(".")[2]
    indexed: list[tuple[int, dict[str, object] | None]] = []  # (block taken by index, the loop's state then)

    def kept(self: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(prefix + k, m) for k, m in self._modules.items() if m is not None][:depth]

    def refuse(why: str) -> FoldDeclined:
        refused.append(why)
        return FoldDeclined(why)

    def whose(caller: types.FrameType) -> str | None:
        return None if own_code else own_caller_reason(caller)

    def __iter__(self: nn.Module) -> Iterator[nn.Module]:
        caller = sys._getframe(1)
        why = whose(caller) or loop_at(caller.f_code, caller.f_lineno, attr) or frame_reason(caller.f_code) or \
            indexed_reason(caller, indexed_at(caller.f_code, caller.f_lineno, attr), count, place)
        if why is not None:
            raise refuse(why)

        skip = loop_targets(caller.f_code, caller.f_lineno)

        def run() -> Iterator[nn.Module]:
            states: list[dict[str, object] | None] = []  # the loop's state as block 1, 2, … is handed out, at its end
            for n, (name, block) in enumerate(kept(self)):
                if n:
                    states.append(loop_state(sys._getframe(1), skip, self))
                seen = entries.get(name, 0)
                yield block
                if entries.get(name, 0) == seen:
                    raise refuse(f"the model's code goes through the stack without running each block ({name})")
            states.append(loop_state(sys._getframe(1), skip, self))
            changed = state_change(states)
            if changed is not None:
                raise refuse(changed)

        return run()

    def __len__(self: nn.Module) -> int:
        caller = sys._getframe(1)
        why = whose(caller)
        if why is not None:
            raise refuse(why)
        if not counted_loop(caller.f_code, caller.f_lineno, attr):
            raise refuse(f"the model's code takes the stack's length (line {caller.f_lineno} of "
                         f"{caller.f_code.co_filename}) other than to loop over its blocks")
        why = counted_after(caller.f_code, caller.f_lineno, attr) or frame_reason(caller.f_code) or \
            indexed_reason(caller, indexed_at(caller.f_code, caller.f_lineno, attr), count, place)
        if why is not None:
            raise refuse(why)
        return len(kept(self))

    def __getitem__(self: nn.Module, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            if range(count)[idx] != range(count):
                bounds = (idx.start, idx.stop) if idx.step is None else (idx.start, idx.stop, idx.step)
                part = ":".join("" if v is None else str(v) for v in bounds)
                raise refuse(f"the model runs blocks [{part}] of the {count}, not every block")
            return copy.copy(self)  # (the same blocks under the same names: all N, cut alike)
        why = whose(sys._getframe(1))
        if why is not None:
            raise refuse(why)
        i = idx + count if idx < 0 else idx
        if not 0 <= i < depth:
            raise refuse(f"the model's code indexes block {idx} of the {count}, past the {depth} traced")
        name, block = kept(self)[i]
        if taken and taken[0][0] != name and entries.get(taken[0][0], 0) == taken[0][1]:
            raise refuse(f"the model's code takes block {taken[0][0]} of the stack by index without running it")
        taken[:] = [(name, entries.get(name, 0))]
        # A loop taking the blocks by index (`for i in range(len(blocks))`): its state as each block is taken, from
        # block 1 on (taken again from block 0: a new pass)
        if i == 0:
            indexed.clear()
        elif not indexed or indexed[-1][0] != i:
            caller = sys._getframe(1)
            why = frame_reason(caller.f_code)
            if why is not None:
                raise refuse(why)
            indexed.append((i, loop_state(caller, loop_targets(caller.f_code, caller.f_lineno), self)))
            changed = state_change([st for _, st in indexed[-2:]]) if len(indexed) > 1 else None
            if changed is not None:
                raise refuse(changed)
        return block

    return type(f"First{depth}{cls.__name__}", (cls,),
                {"__iter__": __iter__, "__len__": __len__, "__getitem__": __getitem__})
