"""The optimizer step of a folded trace (engine.trace.folded_optimizer): stepped over the traced blocks' parameters
only and written out for the rest, it gives the full trace's events and figures for every optimizer of the table, on
a CPU target (per-parameter loops) and a CUDA one (multi-tensor ops, fused kernels, the GradScaler); an optimizer
step that reads several blocks' tensors in one op is traced in full and says why."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.config.train_config import TrainConfig
from engine.trace import step as step_module
from engine.trace.recorder import StorageRecorder
from tests.test_folded_trace import LAYERS, _assert_folded, _both, _llama

CASES = [
    TrainConfig(batch_size=2, optimizer="sgd", device="cpu"),
    TrainConfig(batch_size=2, optimizer="sgd-momentum", device="cpu"),
    TrainConfig(batch_size=2, optimizer="rmsprop", device="cpu"),
    TrainConfig(batch_size=2, optimizer="adagrad", gpu="A100 80GB"),
    TrainConfig(batch_size=2, optimizer="adamw", fused=True, gpu="H100"),
    TrainConfig(batch_size=2, optimizer="adamw", precision="amp-fp16", gpu="A100 80GB"),
    TrainConfig(batch_size=2, optimizer="adamw8bit", precision="bf16", device="cpu"),
    TrainConfig(batch_size=2, optimizer="paged-adamw8bit", precision="bf16", gpu="A100 80GB"),
]


@pytest.mark.parametrize("cfg", CASES, ids=["sgd-cpu", "momentum-cpu", "rmsprop-cpu", "adagrad-cuda",
                                            "fused-adamw-cuda", "amp-fp16-scaler-cuda", "adamw8bit-cpu",
                                            "paged-adamw8bit-cuda"])
def test_every_optimizer_folds_to_the_full_trace(cfg):
    fold, _, _ = _both(_llama(), cfg)
    _assert_folded(fold, LAYERS)


def test_the_folded_step_runs_over_the_traced_blocks_only(monkeypatch):
    """What makes it fast: the optimizer steps the 4 traced blocks of 8 (the first rung: engine.trace.fold_plan) and
    the rest of the model's parameters, and the four blocks written out hold no gradient tensors (their gradients are
    storages of the trace only)."""
    models: list[nn.Module] = []
    seen: list[tuple[int, list[int]]] = []
    real = torch.optim.AdamW.step

    def step(self: torch.optim.Optimizer, *a: Any, **kw: Any) -> Any:
        grads = [sum(p.grad is not None for p in block.parameters()) for block in models[-1].layers]
        seen.append((sum(len(g["params"]) for g in self.param_groups), grads))
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    _both(_llama(tweak=models.append), TrainConfig(batch_size=2, optimizer="adamw", device="cpu"))
    model = models[0]
    every, per_block = len(list(model.parameters())), len(list(model.layers[0].parameters()))
    folded = (every - 4 * per_block, [per_block] * 3 + [0] * 4 + [per_block])
    full = (every, [per_block] * LAYERS)
    assert seen == [folded, folded, full, full]


def test_an_optimizer_reading_several_blocks_at_once_is_traced_in_full(monkeypatch):
    """A step that takes one norm over all gradients (clipping's) cannot be written block by block."""
    real = step_module.make_optimizer

    def clipped(params: Any, cfg: TrainConfig) -> torch.optim.Optimizer | None:
        opt = real(params, cfg)
        assert opt is not None
        inner = opt.step

        def step(*a: Any, **kw: Any) -> Any:
            grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
            torch.stack([g.norm() for g in grads]).norm()
            return inner(*a, **kw)

        opt.step = step  # type: ignore[method-assign]
        return opt

    monkeypatch.setattr(step_module, "make_optimizer", clipped)
    fold, _, _ = _both(_llama(), TrainConfig(batch_size=2, optimizer="sgd", device="cpu"))
    assert fold["folded"] is False and "several blocks' tensors" in fold["reason"], fold


def test_the_recorder_gives_each_output_its_inputs_block():
    """A multi-tensor op's i-th output belongs to its i-th input's block; any other op's to its inputs' one block."""
    rec = StorageRecorder()
    a, b = torch.zeros(4), torch.zeros(4)
    rec.owners = {rec.track(a): 3, rec.track(b): 5}
    assert rec.set_owner(([a, b],), None) == [3, 5]
    rec.set_owner((a, a), None)
    assert rec.owner_now == 3 and not rec.owners_mixed
    rec.set_owner((a, b), None)
    assert rec.owners_mixed
    rec.owner_now = 3
    c = torch.zeros(2)
    assert rec.owners[rec.track(c)] == 3


def test_a_period_two_stacks_optimizer_swap_folds_and_equals_a_fresh_estimate(monkeypatch):
    """The planner's optimizer swap (engine.planning.reuse) steps gemma-2's stack folded by pairs of layers too (its
    gradients and state by unit), and gives the fresh estimate's figures."""
    from benchmarks.fold_identity import comparable_figures
    from engine.models.hf_source import HFConfigSource
    from engine.planning import reuse as plan_reuse
    from tests.test_folded_trace import GEMMA2_16

    src = HFConfigSource(dict(GEMMA2_16), "gemma2", "test")
    cfg = TrainConfig(batch_size=2, seq_len=16, optimizer="adamw", device="cpu")
    _est, step = plan_reuse.traced_step(src, cfg)
    unfolded: list[bool] = []
    real = plan_reuse._optimizer_phases

    def phases(source: Any, c: TrainConfig, cancel: Any, fold: bool = True) -> Any:
        if not fold:
            unfolded.append(True)  # the folded steps declined
        return real(source, c, cancel, fold)

    monkeypatch.setattr(plan_reuse, "_optimizer_phases", phases)
    for change in (dict(optimizer="sgd-momentum"), dict(optimizer="adagrad")):
        new = cfg.with_(**change)
        reused = plan_reuse.with_optimizer(src, step, new)
        fresh, _ = plan_reuse.traced_step(src, new)
        assert reused is not None and not unfolded, change
        a, b = comparable_figures(reused), comparable_figures(fresh)
        a["notes"].remove(plan_reuse.NOTE)
        assert a == b, change
