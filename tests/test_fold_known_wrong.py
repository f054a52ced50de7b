"""Known wrong folds (issue 24, open): models a fuzz of folded against full traces found folded and NOT the same as the
full trace. Each is a strict xfail: it passes (and so fails the suite) the day the fold declines it or gets it right,
and then the mark comes off. Until then these patterns give a wrong figure without --full-trace."""

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
    def __init__(self, d: int, residual: bool = True) -> None:
        super().__init__()
        self.residual = residual
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(torch.relu(self.up(x)))
        return x + h if self.residual else h


class _LayerMix(nn.Module):
    """Code after the stack sized by the blocks that ran: torch.stack of every block's output (4 folded, 12 in full)."""

    def __init__(self, layers: int = 12, d: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        out: torch.Tensor = self.head(torch.stack(outs).mean(0)).sum()
        return out


class _LongSkip(nn.Module):
    """A traced middle block's output (block 2) kept and added after the stack: written as block N-2's."""

    def __init__(self, layers: int = 12, d: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d, residual=False) for _ in range(layers))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x
        for i, blk in enumerate(self.blocks):
            x = x + blk(x)
            if i == 2:
                skip = x
        out: torch.Tensor = self.head(x + skip).sum()
        return out


class _Src(ModelSource):
    kind = "function"

    def __init__(self, model: type[nn.Module]) -> None:
        self.name, self.model = model.__name__, model

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return self.model(), {"x": torch.randn(cfg.batch_size, 16, 32)}


@pytest.mark.xfail(strict=True, reason="known wrong fold (issue 24): the fold neither declines it nor gets it right")
@pytest.mark.parametrize("model", [_LayerMix, _LongSkip], ids=lambda m: m.__name__.strip("_"))
def test_a_folded_trace_is_the_full_trace_or_declines(model: type[nn.Module]) -> None:
    cfg = TrainConfig(batch_size=2, optimizer="adamw", device="cpu")
    folded, finfo = trace_model(_Src(model), cfg)
    full, info = trace_model(_Src(model), cfg.with_(full_trace=True))
    assert finfo.fold is not None
    if finfo.fold.folded:
        assert canonical_events(folded, finfo.storage_owner) == canonical_events(full, info.storage_owner)
