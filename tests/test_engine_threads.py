"""Two estimates on two threads of one process (the app's engine jobs when no engine process can be started, and
its tests) leave each other alone: the recorder's module hooks are global to torch, so each must act on its own
model's modules and its own thread only. A cancelled estimate's hook raised Cancelled in the other thread's model
(an app test hung: the next model's estimate was cancelled by the snapshot job it replaced)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import vramscope
from engine.core.errors import Cancelled
from engine.trace.recorder import ModuleScopes, StorageRecorder


def test_a_cancelled_recorder_stops_its_own_model_only():
    mine, other = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    cancel = threading.Event()
    cancel.set()
    rec = StorageRecorder(cancel=cancel)
    with ModuleScopes(mine, rec):
        other(torch.zeros(1, 4))  # another estimate's model: not this recorder's to stop
        assert rec.module_stack == []
        with pytest.raises(Cancelled):
            mine(torch.zeros(1, 4))


def test_another_threads_forward_does_not_move_a_users_step_to_its_forward():
    def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, other_thread: bool) -> None:
        model(x).sum().backward()
        opt.step()
        if other_thread:  # in the optimizer phase, before zero_grad's frees, another thread's model runs a forward
            t = threading.Thread(target=lambda: nn.Linear(8, 8)(torch.zeros(2, 8)))
            t.start()
            t.join()
        opt.zero_grad()

    def phases(other_thread: bool) -> Any:
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        opt = torch.optim.Adam(model.parameters())
        est = vramscope.estimate_step(lambda m, o, x: step(m, o, x, other_thread), model, opt, torch.randn(16, 64),
                                      device="cpu")
        j = est.to_json()
        return j["phases"], j["timeline"], est.peak_bytes

    assert phases(True) == phases(False)
