"""What every model source is: a name, a kind, and `build(cfg) -> (model, inputs)`."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config.train_config import TrainConfig


class ModelSource:
    """Where a model comes from. `build(cfg)` returns (model, inputs); it may run inside
    `with torch.device("meta"):` (the tracer) or for real on the CPU (the profiler)."""

    name: str = ""
    kind: str = ""  # "template" | "sketch" | "file" | "hf-config" | "object"

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name
