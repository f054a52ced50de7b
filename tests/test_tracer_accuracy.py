"""The tracer against reality: fake-tensor estimates (--device cpu) vs the same step run for real on this CPU,
measured by PyTorch's profiler (every CPU allocator event over the two steps)."""

from __future__ import annotations

import pytest

from benchmarks.zoo_models import ZOO
from engine.estimator import estimate
from engine.profiler import measure_cpu
from engine.results import CATEGORIES

FAST = [c for c in ZOO if c.fast]


@pytest.mark.parametrize("case", FAST, ids=[c.label for c in FAST])
def test_estimate_matches_real_cpu_measurement(case):
    src = case.source()
    est = estimate(src, case.cfg)
    _trace, _info, measured = measure_cpu(src, case.cfg)
    err = abs(est.peak_bytes - measured) / measured
    assert err <= 0.01, f"{case.label}: estimated {est.peak_bytes:,} B, measured {measured:,} B ({err:.2%})"


def test_categories_add_up_at_every_point_and_at_the_peak():
    case = next(c for c in ZOO if c.label == "cnn+bn sgd-momentum")
    est = estimate(case.source(), case.cfg)
    assert sum(est.breakdown_at_peak.values()) == est.peak_bytes
    assert set(est.breakdown_at_peak) == set(CATEGORIES)
    assert max(p.total for p in est.timeline) == est.peak_bytes
    for p in est.timeline:
        assert all(v >= 0 for v in p.by_category.values()), p
    # Training with SGD+momentum: parameters, gradients and one momentum buffer per parameter.
    param_bytes = 4 * est.parameters
    assert est.breakdown_at_peak["parameters"] == param_bytes
    phases = {(s.step, s.phase) for s in est.phases}
    assert {(0, "forward"), (0, "backward"), (0, "optimizer"), (1, "forward"), (1, "backward")} <= phases


def test_optimizer_state_sizes_match_the_optimizers_definition():
    """Adam keeps two fp32 moments per parameter (+ a 4-byte step per tensor); SGD without momentum none."""
    case = next(c for c in ZOO if c.label == "mlp adam")
    src = case.source()
    adam = estimate(src, case.cfg)
    n_tensors = 6  # 3 Linear layers × (weight, bias): one 4-byte step counter each
    final = adam.timeline[-1].by_category
    assert final["optimizer_state"] == 2 * 4 * adam.parameters + 4 * n_tensors
    sgd = estimate(src, case.cfg.with_(optimizer="sgd"))
    assert sgd.timeline[-1].by_category["optimizer_state"] == 0
    mom = estimate(src, case.cfg.with_(optimizer="sgd-momentum"))
    assert mom.timeline[-1].by_category["optimizer_state"] == 4 * mom.parameters


def test_json_round_trip_keeps_every_figure():
    from engine.results import Estimate

    case = next(c for c in ZOO if c.label == "gru adam")
    est = estimate(case.source(), case.cfg)
    back = Estimate.from_json(est.to_json())
    assert back == est


def test_checkpointing_lowers_activations_of_a_template():
    from engine.config import TrainConfig

    cfg = TrainConfig(device="cpu", batch_size=2, seq_len=64, optimizer="sgd")
    plain = estimate("gpt2", cfg)
    ckpt = estimate("gpt2", cfg.with_(checkpointing=True))
    assert ckpt.extra["checkpointed"] and len(ckpt.extra["checkpointed"]) == 12
    act = lambda e: max(p.by_category["activations"] for p in e.timeline)
    assert act(ckpt) < act(plain) / 3
