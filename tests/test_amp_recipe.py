"""AMP as PyTorch's recipe runs it: the forward and the loss under autocast, on the model's device; the backward
and the optimizer step outside it. The real GPU runs (validate_gpu.py, `vramscope calibrate`, the measured
profile) use run_steps as the tracer does, so they measure the same recipe the estimate models."""

from __future__ import annotations

import torch
from torch import nn

from engine.config.train_config import TrainConfig
from engine.trace.step import run_steps


def test_only_the_forward_runs_under_autocast_on_the_models_device():
    seen: list[tuple[str, bool]] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            seen.append(("forward", torch.is_autocast_enabled("cpu")))
            out = self.lin(x)
            out.register_hook(lambda grad: seen.append(("backward", torch.is_autocast_enabled("cpu"))))
            return out

    model = Probe()
    run_steps(model, torch.randn(4, 8), TrainConfig(device="cpu", batch_size=4, optimizer="adam",
                                                     precision="amp-bf16"), lambda s, p: None)
    assert ("forward", True) in seen and ("backward", False) in seen
    assert all(on for phase, on in seen if phase == "forward") and not any(on for phase, on in seen
                                                                          if phase == "backward")
