"""A long-lived engine process traces model after model: a trace leaves torch's globals as it found them.

A CUDA target's CudaKernelChoices patches torch.overrides.has_torch_function while it is entered, and enters itself
again inside its own handler for loss.backward(); the inner entry overwrote the one saved function, so the outer exit
left a wrapper in place: one more per trace (folded ones, retraced at the next rung, several), until after about a
thousand traces every call of it (nn.MultiheadAttention's fast-path check, torch's sym_* helpers) raised
RecursionError, whatever the target. And the rung memory of the tracer (which rung folded a kind of stack) does
not keep a user's model classes, and with them their module, alive after the model is gone."""

from __future__ import annotations

import gc
import weakref
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


def test_the_fold_rung_memory_lets_a_gone_models_classes_go() -> None:
    def made() -> type[nn.Module]:  # a user's model file loaded again: new classes each time
        class Block(_Block):
            pass

        class Stack(_Stack):
            def __init__(self) -> None:
                nn.Module.__init__(self)
                self.blocks = nn.ModuleList(Block(8) for _ in range(8))

        return Stack

    class Src(_Src):
        def __init__(self, model: type[nn.Module]) -> None:
            self.model = model

        def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
            return self.model(), {"x": torch.randn(cfg.batch_size, 4, 8)}

    model = made()
    _, info = trace_model(Src(model), TrainConfig(batch_size=1, optimizer="adamw", device="cpu", fold_own_code=True))
    assert info.fold is not None and info.fold.folded
    block = weakref.ref(type(model().blocks[0]))
    del model, info
    gc.collect()
    assert block() is None
