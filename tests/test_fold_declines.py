"""Models a fuzz of folded against full traces found folded and NOT the same as the full trace (issue 24): each must now
decline, by the check that sees what it does, and so equal the full trace. And models that do the same things
harmlessly still fold.

- the model's loop acts on the block's index (`if i == 8: break`, `if i == 7: x = x.detach()`), in its own methods
  or in a function it hands the stack to: the traced container stops at the cut, before the condition comes
  (engine.trace.fold_loops reads the loop, before the trace in the model's methods, at the loop where it runs);
- a block chooses its path by its index attribute (`if self.layer_idx % 4 == 0`), itself or in a function it hands
  the index (or a name holding it) to: the middle blocks compared do not show the period (engine.trace.fold_index
  watches the traced blocks' index attributes, and the index where it is handed on);
- a block's code changes state outside the modules (a global count of calls it branches on): each block past the cut
  would see another value (engine.trace.fold_state.state_reason);
- code after the stack reads a middle block's tensor (a torch.stack of every block's output, a skip taken from
  block 2): the written trace would say another block (engine.trace.fold_reads); or each block reads a tensor of its
  own made before the stack, of other sizes for the blocks past the cut (or made by another op);
- the model runs a part of the stack (`self.blocks[:8]`) or a block by index (`self.blocks[-1]`): the cut container
  answered for its traced blocks (engine.trace.fold_stack.cut_stack);
- the model sizes a tensor by the stack's length, or makes one per block by a loop that does not run them: the cut
  container's length and its blocks are the traced ones (the container checks where its length is taken,
  engine.trace.fold_loops.counted_loop, and that each block it hands out runs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from benchmarks.fold_identity import canonical_events
from engine.config.train_config import TrainConfig
from engine.models.source import ModelSource
from engine.trace.tracer import trace_model


class _Block(nn.Module):
    def __init__(self, d: int, index: int = 0) -> None:
        super().__init__()
        self.layer_idx = index
        self.up, self.down, self.extra = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(torch.relu(self.up(x)))
        return x + h


class _EveryFourth(_Block):
    """A path of its own every fourth block: blocks 1 and 2 (compared) do not take it, blocks 4 and 8 do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        if self.layer_idx % 4 == 0:
            h = h + self.extra(h)
        return h


def _every_fourth(h: torch.Tensor, lin: nn.Module, index: int) -> torch.Tensor:
    if index % 4 == 0:
        h = h + lin(h)
    return h


class _HelperByIndex(_Block):
    """The same path, chosen by a helper function the block hands its index to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _every_fourth(super().forward(x), self.extra, self.layer_idx)


def _by_name(h: torch.Tensor, lin: nn.Module, name: str) -> torch.Tensor:
    if name.endswith(("4", "8")):
        h = h + lin(h)
    return h


class _HelperByName(_Block):
    """The same path, chosen by a helper function the block hands a name holding its index to (`f"block{i}"`)."""

    def __init__(self, d: int, index: int = 0) -> None:
        super().__init__(d, index)
        del self.layer_idx
        self.tag = f"block{index}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _by_name(super().forward(x), self.extra, self.tag)


_CALLS = [0]  # a count of block calls across the stack, kept outside the modules


class _GlobalCount(_Block):
    """A path of its own every fourth call of any block, counted in a global."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CALLS[0] += 1
        h = super().forward(x)
        if _CALLS[0] % 4 == 0:
            h = h + self.extra(h)
        return h


class _OwnCount(_Block):
    """A count of its own calls, on the block itself (each block counts alike)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


class _Model(nn.Module):
    block: type[_Block] = _Block

    def __init__(self, layers: int = 12, d: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(self.block(d, i) for i in range(layers))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _BreakAt8(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, blk in enumerate(self.blocks):
            if i == 8:
                break
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _DetachAt7(_Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(len(self.blocks)):
            x = self.blocks[i](x)
            if i == 7:
                x = x.detach()
        out: torch.Tensor = self.head(x).sum()
        return out


class _PathByIndex(_Model):
    block = _EveryFourth


class _PathByHelper(_Model):
    block = _HelperByIndex


class _PathByName(_Model):
    block = _HelperByName


class _PathByGlobal(_Model):
    block = _GlobalCount

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CALLS[0] = 0
        return super().forward(x)


class _CountsOwnCalls(_Model):
    """Each block counts its calls on itself: folds."""

    block = _OwnCount


class _LayerMix(_Model):
    """torch.stack of every block's output after the stack (4 or 6 folded, 12 in full)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        outs = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        out: torch.Tensor = self.head(torch.stack(outs).mean(0)).sum()
        return out


class _Plain(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(torch.relu(self.up(x)))
        return h


class _LongSkip(_Model):
    """Block 2's output kept (the loop's residual around each block) and added after the stack: a folded trace
    wrote it as block N-2's."""

    block = _Plain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        skip = x
        for i, blk in enumerate(self.blocks):
            x = x + blk(x)
            if i == 2:
                skip = x
        out: torch.Tensor = self.head(x + skip).sum()
        return out


class _ThirdOutput(_LongSkip):
    """The same skip taken from the list of the blocks' outputs after the loop: no index in the loop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        outs = []
        for blk in self.blocks:
            x = x + blk(x)
            outs.append(x)
        out: torch.Tensor = self.head(x + outs[2]).sum()
        return out


class _FirstEight(_Model):
    """A slice of the stack: the cut container's slice of its traced blocks took them all (4 or 6, not 8)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks[:8]:
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _LastAgain(_Model):
    """The last block by index after the loop: the cut container's [-1] was the last traced block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x[..., :32]) * 0 + self.inp(x)
        out: torch.Tensor = self.head(self.blocks[-1](x)).sum()
        return out


def _run_until(blocks: nn.ModuleList, x: torch.Tensor, stop: int) -> torch.Tensor:
    for i, blk in enumerate(blocks):
        if i == stop:
            break
        x = blk(x)
    return x


def _run_all(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for blk in blocks:
        x = blk(x)
    return x


class _HelperBreak(_Model):
    """The stack handed to a helper function whose loop stops at block 6 (the model's own methods hold no loop)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(_run_until(self.blocks, self.inp(x), 6)).sum()
        return out


class _HelperLoop(_Model):
    """The stack handed to a helper function that runs every block: folds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(_run_all(self.blocks, self.inp(x))).sum()
        return out


class _WithInput(_Block):
    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x + torch.cat([x, e], -1)[..., :x.shape[-1]]


class _InputPerBlock(_Model):
    """A tensor per block made before the stack, wider from block 4 on: the blocks past the cut would allocate
    more than the traced ones. (Taken one after the other from an iterator: taken by the block's index, the loop's
    check of what it indexes sees it first, engine.trace.fold_state.indexed_reason.)"""

    block = _WithInput

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        extra = iter([x.new_zeros(*x.shape[:-1], 1 if i < 4 else 64) for i in range(12)])
        for blk in self.blocks:
            x = blk(x, next(extra))
        out: torch.Tensor = self.head(x).sum()
        return out


class _InputPerBlockByAnotherOp(_Model):
    """The same, the wider ones made by another op: the traced blocks' tensors are all alike, those of the blocks past
    the cut are not among them."""

    block = _WithInput

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        extra = iter([x.new_zeros(*x.shape[:-1], 1) for _ in range(4)] +
                     [x.new_ones(*x.shape[:-1], 64) for _ in range(8)])
        for blk in self.blocks:
            x = blk(x, next(extra))
        out: torch.Tensor = self.head(x).sum()
        return out


class _ZippedInputs(_Model):
    """Alike tensors per block paired with the blocks by zip: the cut stack ends the zip at the traced blocks."""

    block = _WithInput

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        extra = [x.new_zeros(*x.shape[:-1], 8) for _ in range(12)]
        for blk, e in zip(self.blocks, extra, strict=False):
            x = blk(x, e)
        out: torch.Tensor = self.head(x).sum()
        return out


class _AlikeInputPerBlock(_Model):
    """The same with every block's tensor alike (Hugging Face's per-layer scalars): folds. (Taken by index: a loop
    variable bound to one would hold the last traced block's after the loop, not the last block's, and free it
    last: the same bytes, in another order.)"""

    block = _WithInput

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        extra = [x.new_zeros(*x.shape[:-1], 8) for _ in range(12)]
        for i, blk in enumerate(self.blocks):
            x = blk(x, extra[i])
        out: torch.Tensor = self.head(x).sum()
        return out


class _SizedByLength(_Model):
    """A tensor sized by the stack's length: the cut stack's would be the traced blocks' count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        acc = x.new_zeros(len(self.blocks), *x.shape)
        for blk in self.blocks:
            x = blk(x)
        out: torch.Tensor = self.head(x).sum() + acc.sum()
        return out


class _TensorPerBlock(_Model):
    """A tensor made for each block by a loop that does not run them: the cut stack gives one per traced block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        bufs = [torch.zeros_like(x) for _ in self.blocks[:]]
        for i, blk in enumerate(self.blocks):
            x = blk(x) + bufs[i]
        out: torch.Tensor = self.head(x).sum()
        return out


class _TensorPerIndex(_Model):
    """The same by index (`for i in range(len(blocks))` reading `blocks[i]` without running it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        bufs = {}
        for i in range(len(self.blocks)):
            bufs[self.blocks[i].up] = torch.zeros_like(x)
        for blk in self.blocks:
            x = blk(x) + bufs[blk.up]
        out: torch.Tensor = self.head(x).sum()
        return out


class _EveryBlockSliced(_Model):
    """A slice of every block (Hugging Face's `self.layers[: config.num_hidden_layers]`): folds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks[:12]:
            x = blk(x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _LastTwo(_Model):
    """The last two blocks' outputs read after the stack: the tail's, at the second rung (folds)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        outs = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        out: torch.Tensor = self.head(outs[-1] + outs[-2]).sum()
        return out


class _IndexedCaches(_Model):
    """The loop's index only indexes a list (a slot per layer, `[None] * len(blocks)`), and the block's index is
    never read: folds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        caches: list[torch.Tensor | None] = [None] * len(self.blocks)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            caches[i] = x
        out: torch.Tensor = self.head(x).sum()
        return out


class _CountedLoop(_Model):
    """`for i in range(len(blocks))` running `blocks[i]`: the length bounds a loop over the blocks: folds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(len(self.blocks)):
            x = self.blocks[i](x)
        out: torch.Tensor = self.head(x).sum()
        return out


class _Src(ModelSource):
    kind = "function"

    def __init__(self, model: type[nn.Module]) -> None:
        self.name, self.model = model.__name__, model

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return self.model(), {"x": torch.randn(cfg.batch_size, 16, 32)}


def _traces(model: type[nn.Module]) -> tuple[str | None, bool]:
    """(why the fold declined, or None when it folded; whether it equals the full trace event for event)."""
    cfg = TrainConfig(batch_size=2, optimizer="adamw", device="cpu", fold_own_code=True)  # (the checks at work)
    folded, finfo = trace_model(_Src(model), cfg)
    full, info = trace_model(_Src(model), cfg.with_(full_trace=True))
    assert finfo.fold is not None
    same = canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
    return (None if finfo.fold.folded else finfo.fold.reason), same


@pytest.mark.parametrize(("model", "why"), [
    (_BreakAt8, ") breaks out of it"),
    (_DetachAt7, "uses the block's index `i`"),
    (_PathByIndex, "the traced blocks read their index (_EveryFourth.layer_idx, line"),
    (_PathByHelper, "(_HelperByIndex.layer_idx handed on, then used (__mod__) at line"),
    (_PathByName, "(_HelperByName.tag (a str) handed on, line"),
    (_PathByGlobal, "_GlobalCount.forward changes state outside the modules (_CALLS[0], line"),
    (_LayerMix, "the model's code after the stack reads a tensor of block 2"),
    (_LongSkip, "uses the block's index `i`"),
    (_ThirdOutput, "keeps each block's output in `outs` and takes one by its position"),
    (_FirstEight, "the model runs blocks [:8] of the 12, not every block"),
    (_LastAgain, "the model's code indexes block -1 of the 12, past the"),
    (_HelperBreak, "_run_until: its loop over the stack (line"),
    (_SizedByLength, "the model's code takes the stack's length (line"),
    (_InputPerBlock, "reads a tensor of its own made by new_zeros.default in the model, of other sizes for other"),
    (_InputPerBlockByAnotherOp, "reads a tensor of its own made by new_zeros.default in the model, 4 of them for the "
                                "stack's 12 repeating units"),
    (_ZippedInputs, ") pairs it with `extra`"),
    (_TensorPerBlock, "the model's code goes through the stack without running each block (blocks.0)"),
    (_TensorPerIndex, "the model's code takes block blocks.0 of the stack by index without running it"),
], ids=lambda m: m.__name__.strip("_") if isinstance(m, type) else "")
def test_a_fold_that_would_be_wrong_declines_and_equals_the_full_trace(model: type[nn.Module], why: str) -> None:
    reason, same = _traces(model)
    assert reason is not None and why in reason
    assert same


@pytest.mark.parametrize("model", [_Model, _LastTwo, _IndexedCaches, _CountedLoop, _EveryBlockSliced, _HelperLoop,
                                   _AlikeInputPerBlock, _CountsOwnCalls],
                         ids=lambda m: m.__name__.strip("_"))
def test_the_same_things_done_harmlessly_still_fold_and_equal_the_full_trace(model: type[nn.Module]) -> None:
    reason, same = _traces(model)
    assert reason is None
    assert same
