"""Models a probe of the fold's blind spots found folded and NOT the same as their full trace (issue 24, trust in the
fold), each of which must now decline and so equal the full trace:

- the loop's function reads its own frame (`sys._getframe()`, `locals()`): the state the loop carries (a count it
  detaches by) could not be read, and was taken as unchanged (engine.trace.fold_state._locals);
- the loop's index is used after the loop (`x.new_zeros(i + 1, …)`), in the model's methods or in a helper it hands
  the stack to: it is left at the last traced block, not the last of the stack (engine.trace.fold_loops._after_loop);
- the blocks each hold an object of their own that holds one object between them, which they change
  (`self.holder.box.n += 1`): each block sees what the blocks before it did (engine.trace.fold_state.shared_reason
  looks past the first object).

The same things done harmlessly still fold, event for event the full trace."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.test_fold_declines import _Block, _Model, _traces


class _GetframeLoop(_Model):
    """A count the loop carries, detached by from the seventh block on, in a function that reads its own frame."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = self.inp(x), 0
        for blk in self.blocks:
            n += 1
            sys._getframe()
            x = blk(x) if n < 7 else blk(x).detach()
        out: torch.Tensor = self.head(x).sum()
        return out


class _GetframeByIndex(_Model):
    """The same count by a loop that takes the blocks by index."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = self.inp(x), 0
        for i in range(len(self.blocks)):
            n += 1
            sys._getframe()
            x = self.blocks[i](x) if n < 7 else self.blocks[i](x).detach()
        out: torch.Tensor = self.head(x).sum()
        return out


class _IndexPast(_Model):
    """A tensor sized by the loop's index after the loop (12 rows: the index is left at 11)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        i = 0
        for i in range(len(self.blocks)):
            x = self.blocks[i](x)
        out: torch.Tensor = self.head(x + x.new_zeros(i + 1, 1, 1).sum(0)).sum()
        return out


class _EnumPast(_Model):
    """The same by `for i, blk in enumerate(blocks)`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        i = 0
        for i, blk in enumerate(self.blocks):  # noqa: B007 (used after the loop)
            x = blk(x)
        out: torch.Tensor = self.head(x + x.new_zeros(i + 1, 1, 1).sum(0)).sum()
        return out


class _IndexInElse(_Model):
    """The same in the loop's `else:` (run once the loop ends)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(len(self.blocks)):
            x = self.blocks[i](x)
        else:
            x = x + x.new_zeros(i + 1, 1, 1).sum(0)
        out: torch.Tensor = self.head(x).sum()
        return out


def _run_all(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    for i in range(len(model.blocks)):
        x = model.blocks[i](x)
    return x, i


class _HelperIndexPast(_Model):
    """The same index, handed back by a helper function the model hands itself to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, i = _run_all(self, self.inp(x))
        out: torch.Tensor = self.head(x + x.new_zeros(i + 1, 1, 1).sum(0)).sum()
        return out


def _run_each(blocks: nn.ModuleList, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    i = 0
    for i, blk in enumerate(blocks):  # noqa: B007 (used after the loop)
        x = blk(x)
    return x, i


class _HelperEnumPast(_HelperIndexPast):
    """The same by enumerate in the helper."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, i = _run_each(self.blocks, self.inp(x))
        out: torch.Tensor = self.head(x + x.new_zeros(i + 1, 1, 1).sum(0)).sum()
        return out


class _BlockPast(_Model):
    """The last block run again after the loop, by the loop's name for it (the fold writes the last traced block's
    events out as the last block's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
        out: torch.Tensor = self.head(blk.extra(x)).sum()
        return out


class _Box:
    def __init__(self) -> None:
        self.n = 0


class _Holder:
    def __init__(self, box: _Box) -> None:
        self.box = box

    def bump(self) -> int:
        self.box.n += 1
        return self.box.n


class _DeepCount(_Block):
    """A path of its own from the seventh call of any block on, by a count kept two objects down."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.holder.box.n += 1
        h = super().forward(x)
        if self.holder.box.n > 6:
            h = h + self.extra(h)
        return h


class _ThirdObject(_Model):
    """Each block holds an object of its own, and those hold one `_Box` between them."""

    block = _DeepCount

    def __init__(self) -> None:
        super().__init__()
        box = _Box()
        for b in self.blocks:
            b.holder = _Holder(box)


class _Bumping(_Block):
    """The same count, changed by a method of the block's own object."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        if self.holder.bump() > 6:
            h = h + self.extra(h)
        return h


class _ThirdObjectByMethod(_ThirdObject):
    block = _Bumping


class _DeepList(_Block):
    """The same count, as the length of a list kept in a dict of the block's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state["log"].append(1)
        h = super().forward(x)
        if len(self.state["log"]) > 6:
            h = h + self.extra(h)
        return h


class _ListInOwnDict(_Model):
    block = _DeepList

    def __init__(self) -> None:
        super().__init__()
        log: list[int] = []
        for b in self.blocks:
            b.state = {"log": log}


def _line(f: Callable[..., object], below: int) -> int:
    """The file's line `below` lines under `f`'s `def`."""
    return inspect.getsourcelines(f)[1] + below


@pytest.mark.parametrize(("model", "why"), [
    (_GetframeLoop, "the loop's function forward reads its own frame (_getframe)"),
    (_GetframeByIndex, "the loop's function forward reads its own frame (_getframe)"),
    (_IndexPast, "uses `i` after the loop (line"),
    (_EnumPast, "uses `i` after the loop (line"),
    (_IndexInElse, "uses `i` after the loop (line"),
    (_HelperIndexPast, f"_run_all: its loop over the stack (line {_line(_run_all, 1)}) uses `i` after the loop "
                       f"(line {_line(_run_all, 3)})"),
    (_HelperEnumPast, f"_run_each: its loop over the stack (line {_line(_run_each, 2)}) uses `i` after the loop "
                      f"(line {_line(_run_each, 4)})"),
    (_ThirdObject, "the blocks hold one _Box `holder.box` between them, and _DeepCount.forward changes it"),
    (_ThirdObjectByMethod, "the blocks hold one _Box `holder.box` between them, and _Bumping.forward changes it "
                           "(self.holder.bump()"),
    (_ListInOwnDict, "the blocks hold one list `state['log']` between them, and _DeepList.forward changes it"),
], ids=lambda m: m.__name__.strip("_") if isinstance(m, type) else "")
def test_a_blind_spot_declines_and_equals_the_full_trace(model: type[nn.Module], why: str) -> None:
    reason, same = _traces(model)
    assert reason is not None and why in reason, reason
    assert same


class _GetframeOutside(_Model):
    """The model's forward reads its own frame, outside a function with a loop over the stack."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._run(self.inp(x))
        sys._getframe()
        out: torch.Tensor = self.head(x).sum()
        return out

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


class _IndexRebound(_Model):
    """The loop's name bound anew after the loop before it is used."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):  # noqa: B007
            x = blk(x)
        i = 3
        out: torch.Tensor = self.head(x + x.new_zeros(i, 1, 1).sum(0)).sum()
        return out


class _NameInComprehension(_Model):
    """The loop's name used after the loop only as a comprehension's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):  # noqa: B007
            x = blk(x)
        out: torch.Tensor = self.head(x + sum(x.new_zeros(1) for i in range(2))).sum()
        return out


class _DeepReadOnly(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        return h + x if self.holder.box.n == 0 else h


class _SharedDeepSettings(_Model):
    """Each block holds an object of its own holding one object between them, only read."""

    block = _DeepReadOnly

    def __init__(self) -> None:
        super().__init__()
        box = _Box()
        for b in self.blocks:
            b.holder = _Holder(box)


@pytest.mark.parametrize("model", [_GetframeOutside, _IndexRebound, _NameInComprehension, _SharedDeepSettings,
                                   _BlockPast],
                         ids=lambda m: m.__name__.strip("_"))
def test_the_same_things_done_harmlessly_still_fold_and_equal_the_full_trace(model: type[nn.Module]) -> None:
    reason, same = _traces(model)
    assert reason is None, reason
    assert same
