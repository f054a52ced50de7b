"""A long-lived engine process traces model after model: a trace leaves torch's globals as it found them.

A CUDA target's CudaKernelChoices patches torch.overrides.has_torch_function while it is entered, and enters itself
again inside its own handler for loss.backward(); the inner entry overwrote the one saved function, so the outer exit
left a wrapper in place: one more per trace (folded ones, retraced at the next rung, several), until after about a
thousand traces every call of it (nn.MultiheadAttention's fast-path check, torch's sym_* helpers) raised
RecursionError, whatever the target."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.config.train_config import TrainConfig
from engine.cuda.target import CudaKernelChoices
from engine.models.source import ModelSource
from engine.trace.tracer import trace_model


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(torch.relu(self.up(x)))
        return x + h


class _Stack(nn.Module):
    def __init__(self, layers: int = 8, d: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x.sum()


class _Src(ModelSource):
    kind = "function"
    name = "stack"

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return _Stack(), {"x": torch.randn(cfg.batch_size, 4, 8)}


def test_a_reentered_cuda_mode_restores_has_torch_function() -> None:
    original = torch.overrides.has_torch_function
    mode = CudaKernelChoices()
    with mode:
        with mode:  # as its _backward does, inside its own handler
            assert torch.overrides.has_torch_function is not original
        assert torch.overrides.has_torch_function is not original
    assert torch.overrides.has_torch_function is original


def test_cuda_target_traces_leave_has_torch_function_as_they_found_it() -> None:
    original = torch.overrides.has_torch_function
    cfg = TrainConfig(batch_size=1, optimizer="adamw", device="cuda", gpu="h100")
    for c in (cfg, cfg.with_(full_trace=True)):  # folded (its loss.backward() under the mode) and full
        trace_model(_Src(), c)
        assert torch.overrides.has_torch_function is original
