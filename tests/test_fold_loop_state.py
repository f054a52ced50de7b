"""State the blocks act on that no tensor shows, and loops that hand the stack to something that may stop early
(issue 24, trust in the fold): each of these models folded and was NOT the same as its full trace before its check
(engine.trace.fold_state: a count the loop carries, a block's plain arguments, what the loop indexes by the block's
index, an object the blocks hold between them and change; engine.trace.fold_loops._wrapped: the stack handed to
`islice` or a generator that filters it); each must now decline and so equal the full trace. The same things done
harmlessly still fold, event for event the full trace."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from torch import nn

import engine.trace.step_replay as step_replay
from tests.test_fold_declines import _Block, _Model, _traces


class _CountedArg(_Block):
    """A path of its own from the seventh block on, by a count the loop hands it and it hands back."""

    def forward(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        h = super().forward(x)
        if n > 6:
            h = h + self.extra(h)
        return h, n + 1


class _CountThrough(_Model):
    block = _CountedArg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = self.inp(x), 0
        for blk in self.blocks:
            x, n = blk(x, n)
        out: torch.Tensor = self.head(x).sum()
        return out


class _CounterInLoop(_Model):
    """The loop counts the blocks itself (not by enumerate) and detaches from the seventh on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = self.inp(x), 0
        for blk in self.blocks:
            n += 1
            x = blk(x) if n < 7 else blk(x).detach()
        out: torch.Tensor = self.head(x).sum()
        return out


class _ModelCounter(_Model):
    """The same count kept on the model (`self.seen`), read by the loop."""

    seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        self.seen = 0
        for blk in self.blocks:
            self.seen += 1
            x = blk(x) if self.seen < 7 else blk(x).detach()
        out: torch.Tensor = self.head(x).sum()
        return out


class _Sliced(_Model):
    """`itertools.islice(blocks, 8)`: the first 8 of 12 run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in itertools.islice(self.blocks, 8):
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _Filtered(_Model):
    """A generator over the stack that keeps the first 8 by their index."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in (b for j, b in enumerate(self.blocks) if j < 8):
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _Logging(_Block):
    """A path of its own every fourth call of any block, counted in a list every block holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(1)
        h = super().forward(x)
        if len(self.log) % 4 == 0:
            h = h + self.extra(h)
        return h


class _SharedLog(_Model):
    block = _Logging

    def __init__(self) -> None:
        super().__init__()
        log: list[int] = []
        for b in self.blocks:
            b.log = log


class _Tally:
    def __init__(self) -> None:
        self.calls = 0

    def tick(self) -> int:
        self.calls += 1
        return self.calls


class _Ticking(_Block):
    """The same count, kept by an object of the user's every block holds, changed through its method."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        if self.tally.tick() % 4 == 0:
            h = h + self.extra(h)
        return h


class _SharedTally(_Model):
    block = _Ticking

    def __init__(self) -> None:
        super().__init__()
        tally = _Tally()
        for b in self.blocks:
            b.tally = tally


class _ArgCount(_Block):
    """A path of its own from the seventh block on, by a number the loop hands it."""

    def forward(self, x: torch.Tensor, n: int = 0) -> torch.Tensor:  # type: ignore[override]
        h = super().forward(x)
        if n > 6:
            h = h + self.extra(h)
        return h


class _NextOfCounter(_Model):
    """The number made by `next(counter)` at each call: no local of the loop changes, the block's argument does."""

    block = _ArgCount

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, counter = self.inp(x), itertools.count()
        for blk in self.blocks:
            x = blk(x, next(counter))
        out: torch.Tensor = self.head(x).sum()
        return out


class _KeywordCount(_Model):
    """The number handed as a keyword from a dict the loop updates."""

    block = _ArgCount

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, kw = self.inp(x), {"n": 0}
        for blk in self.blocks:
            x = blk(x, **kw)
            kw["n"] += 1
        out: torch.Tensor = self.head(x).sum()
        return out


class _Widths(_Model):
    """A width per block kept in a list (32 for the first six, 16 after), taken by the block's index."""

    def __init__(self) -> None:
        super().__init__()
        self.widths = [32] * 6 + [16] * 6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            h = blk(x)
            x = torch.cat([h[..., : self.widths[i]], h[..., self.widths[i]:].detach()], -1)
        out: torch.Tensor = self.head(x).sum()
        return out


class _CountedWidths(_Widths):
    """The same by `for i in range(len(blocks))`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(len(self.blocks)):
            h = self.blocks[i](x)
            x = torch.cat([h[..., : self.widths[i]], h[..., self.widths[i]:].detach()], -1)
        out: torch.Tensor = self.head(x).sum()
        return out


class _Masked(_Block):
    def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x) + (m * 2).sum()


class _MaskPerBlock(_Model):
    """A tensor per block kept in a list before the step (4 elements for the first six, 4,096 after)."""

    block = _Masked

    def __init__(self) -> None:
        super().__init__()
        self.masks = [torch.ones(4) for _ in range(6)] + [torch.ones(4096) for _ in range(6)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, self.masks[i])
        out: torch.Tensor = self.head(x).sum()
        return out


class _Ticked(_Block):
    """A path of its own from the seventh call of any block on, by a function the blocks hold between them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        if self.tick() > 6:
            h = h + self.extra(h)
        return h


def _counter() -> Callable[[], int]:
    n = 0

    def tick() -> int:
        nonlocal n
        n += 1
        return n

    return tick


class _SharedClosure(_Model):
    block = _Ticked

    def __init__(self) -> None:
        super().__init__()
        tick = _counter()
        for b in self.blocks:
            b.tick = tick


class _SharedNext(_Model):
    """The same by `itertools.count().__next__`, looked up for each block (a new bound method each time)."""

    block = _Ticked

    def __init__(self) -> None:
        super().__init__()
        counter = itertools.count()
        for b in self.blocks:
            b.tick = counter.__next__


class _LengthOfOutputs(_Model):
    """Each block's output kept in a list, and a tensor sized by the list's length after the loop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        outs: list[torch.Tensor] = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x.detach())
        out: torch.Tensor = self.head(x + x.new_zeros(len(outs), 1, 1).sum(0)).sum()
        return out


class _AliasLogging(_Block):
    """`_Logging` through a local name bound to the shared list."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log = self.log
        log.append(1)
        h = super().forward(x)
        if len(log) % 4 == 0:
            h = h + self.extra(h)
        return h


class _SharedLogByAlias(_Model):
    block = _AliasLogging

    def __init__(self) -> None:
        super().__init__()
        log: list[int] = []
        for b in self.blocks:
            b.log = log


class _CountedLoopCounter(_Model):
    """A count carried by a loop that takes the blocks by index."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, n = self.inp(x), 0
        for i in range(len(self.blocks)):
            n += 1
            x = self.blocks[i](x) if n < 7 else self.blocks[i](x).detach()
        out: torch.Tensor = self.head(x).sum()
        return out


@pytest.mark.parametrize(("model", "why"), [
    (_CountThrough, "the loop's `n` changes from block to block (1, then 2)"),
    (_CounterInLoop, "the loop's `n` changes from block to block (1, then 2)"),
    (_ModelCounter, "the loop's `self.seen` changes from block to block (1, then 2)"),
    (_Sliced, "goes through it by `itertools.islice`"),
    (_Filtered, "its comprehension over the stack uses the block's index `j`"),
    (_SharedLog, "the blocks hold one list `log` between them, and _Logging.forward changes it (self.log.append(1)"),
    (_SharedTally, "the blocks hold one _Tally `tally` between them, and _Ticking.forward changes it"),
    (_SharedClosure, "the blocks hold one function `tick` between them, and _counter.<locals>.tick assigns names of "
                     "the function it was made in"),
    (_SharedNext, "the blocks hold one method-wrapper `tick` between them, and count.__next__ is a builtin's method"),
    (_LengthOfOutputs, "keeps each block's output in `outs` and takes its length"),
    (_SharedLogByAlias, "the blocks hold one list `log` between them, and _AliasLogging.forward changes it "
                        "(log.append(1)"),
    (_CountedLoopCounter, "the loop's `n` changes from block to block (2, then 3)"),
    (_NextOfCounter, "blocks 1 and 2 are called with other values besides their tensors (…, 1, then …, 2)"),
    (_KeywordCount, "the loop's `kw` changes from block to block"),
    (_Widths, "the loop indexes `self.widths` by the block's index, and it holds other values for blocks 1 and 6 (32, "
              "then 16)"),
    (_CountedWidths, "the loop indexes `self.widths` by the block's index"),
    (_MaskPerBlock, "the loop indexes `self.masks` by the block's index, and it holds other values for blocks 1 and 6"),
], ids=lambda m: m.__name__.strip("_") if isinstance(m, type) else "")
def test_state_no_tensor_shows_declines_and_equals_the_full_trace(model: type[nn.Module], why: str) -> None:
    reason, same = _traces(model)
    assert reason is not None and why in reason, reason
    assert same


class _FirstScaled(_Model):
    """A flag the loop clears after the first block, steady from then on (block 0 is traced as itself)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, first = self.inp(x), True
        for blk in self.blocks:
            x = blk(x) * (2.0 if first else 1.0)
            first = False
        out: torch.Tensor = self.head(x).sum()
        return out


class _Settings:
    def __init__(self) -> None:
        self.residual = True


class _Reading(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        return h + x if self.settings.residual else h


class _SharedSettings(_Model):
    """One settings object every block holds and only reads."""

    block = _Reading

    def __init__(self) -> None:
        super().__init__()
        settings = _Settings()
        for b in self.blocks:
            b.settings = settings


class _KeptOutputs(_Model):
    """Each block's output kept in a list (tensors: the trace holds them), the last one used."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        outs: list[torch.Tensor] = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        out: torch.Tensor = self.head(outs[-1]).sum()
        return out


class _UniformScales(_Model):
    """A scale per block kept in a list, the same for every block, taken by the block's index."""

    def __init__(self) -> None:
        super().__init__()
        self.scales = [0.5] * 12

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x) * self.scales[i]
        out: torch.Tensor = self.head(x).sum()
        return out


class _TakenByIndex(_Model):
    """Each block taken by index into a local (`blk = blocks[i]`): the local's own attributes (its `layer_idx`) change
    from block to block, as the block does; still folds (the fuzz, benchmarks/fold_fuzz.py, found it declined)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(len(self.blocks)):
            blk = self.blocks[i]
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


@pytest.mark.parametrize("model", [_FirstScaled, _SharedSettings, _KeptOutputs, _UniformScales, _TakenByIndex],
                         ids=lambda m: m.__name__.strip("_"))
def test_steady_state_still_folds_and_equals_the_full_trace(model: type[nn.Module]) -> None:
    reason, same = _traces(model)
    assert reason is None, reason
    assert same


def test_the_watch_on_the_blocks_calls_leaves_the_second_step_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold's watch on each traced block's arguments (a forward pre-hook, registered as each window opens) is no
    change of the model's state: the second step is still copied from the first (engine.trace.step_replay), as
    without it."""
    seen: list[bool] = []
    real_call = step_replay.StepReplay.__call__

    def spy(self: step_replay.StepReplay, step: int) -> bool:
        seen.append(real_call(self, step))
        return seen[-1]

    monkeypatch.setattr(step_replay.StepReplay, "__call__", spy)
    reason, same = _traces(_Model)
    assert reason is None and same
    assert seen and all(seen), seen
