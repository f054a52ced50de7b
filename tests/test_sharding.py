"""Per-rank memory of ZeRO / FSDP / DDP / TP against the ZeRO paper's published model-state figures."""

import pytest

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.parallel.sharding import plan_for, shard, sharded_estimate, zero_model_state_bytes
from engine.results.types import Estimate, ModuleRow, TimelinePoint

PSI = 7_500_000_000  # the ZeRO paper's 7.5B-parameter example
LAYERS = 32
ACT = 10 * 10**9  # activations of one GPU's micro-batch at the end of forward


def _estimate(cfg, psi=PSI, k=12):
    """Mixed-precision Adam as the ZeRO paper counts it: fp16 params 2Ψ, fp16 grads 2Ψ, K·Ψ optimizer state."""
    P, G, OPT = 2 * psi, 2 * psi, k * psi

    def pt(i, phase, params, grads, opt, act):
        return TimelinePoint(i, 1, phase, "", "", {"parameters": params, "gradients": grads,
                                                    "optimizer_state": opt, "activations": act})

    timeline = (
        pt(0, "setup", P, 0, OPT, 0),
        pt(1, "forward", P, 0, OPT, ACT),
        pt(2, "backward", P, G, OPT, ACT // 2),
        pt(3, "optimizer", P, G, OPT, 0),
    )
    rows = tuple(
        ModuleRow(f"blocks.{i}", "Block", P // 2 // LAYERS, P // LAYERS, 0, 0, 0, 0, 0.0) for i in range(LAYERS)
    ) + (ModuleRow("blocks", "ModuleList", 0, 0, 0, 0, 0, 0, 0.0),)
    peak = P + G + OPT + ACT // 2
    return Estimate(
        model_name="zero-paper", config=cfg, parameters=psi, trainable_parameters=psi, peak_bytes=peak,
        peak_index=2, peak_step=1, peak_phase="backward", peak_module="", peak_op="",
        breakdown_at_peak={"parameters": P, "gradients": G, "optimizer_state": OPT, "activations": ACT // 2},
        per_module=rows, timeline=timeline, phases=(),
    )


def test_zero_paper_formulas():
    # ZeRO paper, Figure 1: 7.5B parameters, 64 GPUs → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU
    assert zero_model_state_bytes(PSI, 0, 64) == 120_000_000_000
    assert round(zero_model_state_bytes(PSI, 1, 64) / 1e9, 1) == 31.4
    assert round(zero_model_state_bytes(PSI, 2, 64) / 1e9, 1) == 16.6
    assert round(zero_model_state_bytes(PSI, 3, 64) / 1e9, 1) == 1.9


@pytest.mark.parametrize("strategy,stage", [("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3), ("fsdp", 3)])
def test_model_states_per_rank_equal_the_formulas_and_peak_is_above(strategy, stage):
    cfg = TrainConfig(world_size=64, strategy=strategy)
    r = shard(_estimate(cfg), cfg)
    assert r.model_state_bytes == zero_model_state_bytes(PSI, stage, 64)
    assert r.peak_bytes >= zero_model_state_bytes(PSI, stage, 64)  # the formulas are a lower bound
    assert sum(r.breakdown_at_peak.values()) == r.peak_bytes


def test_ddp_buckets_copy_the_gradients():
    cfg = TrainConfig(world_size=8, strategy="ddp")
    r = shard(_estimate(cfg), cfg)
    assert r.extras_at_peak["ddp_buckets"] == 2 * PSI
    assert r.peak_bytes == 2 * PSI + 2 * PSI + 12 * PSI + ACT // 2 + 2 * PSI  # backward: states + acts + buckets


def test_zero3_gathers_units_during_forward_and_backward():
    cfg = TrainConfig(world_size=64, strategy="zero3")
    r = shard(_estimate(cfg), cfg)
    unit = 2 * PSI // LAYERS  # one block's fp16 parameters
    assert r.unit_parameter_bytes == unit
    # forward (no gradients yet): (2+12)Ψ/64 of states + activations + two gathered units less the own shard
    forward = 14 * PSI // 64 + ACT + int(2 * unit * (1 - 1 / 64))
    assert r.peak_phase == "forward" and r.peak_bytes == forward


def test_hybrid_shards_within_a_node_and_tp_splits():
    cfg = TrainConfig(world_size=64, strategy="fsdp-hybrid")
    plan = plan_for(cfg)
    assert plan.shard_degree == 8 and plan.dp == 64
    cfg = TrainConfig(world_size=16, tp=4, strategy="zero1")
    plan = plan_for(cfg)
    assert plan.dp == 4 and plan.factors["parameters"] == 1 / 4 and plan.factors["optimizer_state"] == 1 / 16
    assert plan.factors["activations"] == 1 / 4
    with pytest.raises(UserError):
        TrainConfig(world_size=6, tp=4)


def test_sharded_estimate_timeline_adds_up():
    cfg = TrainConfig(world_size=64, strategy="zero2")
    est = sharded_estimate(_estimate(cfg), cfg)
    assert est.sharding.single_gpu_peak_bytes > est.peak_bytes
    assert max(p.total for p in est.timeline) == est.peak_bytes
    assert sum(est.breakdown_at_peak.values()) == est.peak_bytes
