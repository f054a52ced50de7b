"""engine.optimizers' table against torch itself: every entry builds its optimizer, keeps the state it declares
after a real step, has the fused kernel it claims, and appears wherever an optimizer can be chosen.

An optimizer added to the table with a wrong or missing figure fails here.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.analytic import optimizer_state_bytes
from engine.config import OPTIMIZERS, TrainConfig
from engine.optimizers import OPTIMIZER_TABLE
from engine.step import make_optimizer

ENTRIES = list(OPTIMIZER_TABLE.values())


def _stepped(name: str, **cfg) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    opt = make_optimizer(model.parameters(), TrainConfig(optimizer=name, device="cpu", **cfg))
    model(torch.randn(3, 8)).sum().backward()
    if opt is not None:
        opt.step()
    return model, opt


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_entry_is_complete(spec):
    assert spec.label and spec.state_what
    assert spec.torch_class is None or isinstance(getattr(torch.optim, spec.torch_class), type)
    assert spec.name in OPTIMIZERS  # the config (and so the CLI's --optimizer and the app's menu) accepts it


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_state_per_parameter_is_what_torch_keeps(spec):
    model, opt = _stepped(spec.name)
    if spec.torch_class is None:
        assert opt is None and spec.state_per_param == 0
        return
    assert type(opt).__name__ == spec.torch_class
    for p in model.parameters():
        full = [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.shape == p.shape]
        assert len(full) == spec.state_per_param, (spec.name, [k for k in opt.state[p]])
    n = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(n, spec.name) == spec.state_per_param * n * 4


@pytest.mark.parametrize("spec", [o for o in ENTRIES if o.fused], ids=[o.name for o in ENTRIES if o.fused])
def test_fused_entries_build_a_fused_step(spec):
    _model, opt = _stepped(spec.name, fused=True)
    assert opt is not None and opt.defaults.get("fused") is True


@pytest.mark.parametrize("spec", ENTRIES, ids=[o.name for o in ENTRIES])
def test_adaptive_means_second_moments(spec):
    # the planner offers SGD with momentum instead of an optimizer that keeps more than one buffer or a moment
    assert spec.adaptive == (spec.cpu_step_temporaries > 0)
    if spec.adaptive:
        assert spec.state_per_param >= 1 and spec.name != "sgd-momentum"
