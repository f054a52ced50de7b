"""The tracer against reality: fake-tensor estimates (--device cpu) vs the same step run for real on this CPU,
measured by PyTorch's profiler (every CPU allocator event over the two steps)."""

from __future__ import annotations

import pytest

from benchmarks.zoo_models import ZOO
from engine.measure.cpu_profiler import measure_cpu
from engine.planning.estimator import estimate
from engine.results.types import CATEGORIES

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
    from engine.results.types import Estimate

    case = next(c for c in ZOO if c.label == "gru adam")
    est = estimate(case.source(), case.cfg)
    back = Estimate.from_json(est.to_json())
    assert back == est


def test_checkpointing_lowers_activations_of_a_template():
    from engine.config.train_config import TrainConfig

    cfg = TrainConfig(device="cpu", batch_size=2, seq_len=64, optimizer="sgd")
    plain = estimate("gpt2", cfg)
    ckpt = estimate("gpt2", cfg.with_(checkpointing=True))
    assert ckpt.checkpointed and len(ckpt.checkpointed) == 12
    def act(e):
        return max(p.by_category["activations"] for p in e.timeline)
    assert act(ckpt) < act(plain) / 3


def test_measured_profile_names_the_same_modules_as_the_estimate():
    """The real run's trace is attributed to modules from the profiler's own records (nn.Module calls in
    forward, autograd sequence numbers in backward), so the per-layer tables of the two can be compared."""
    from engine.config.train_config import TrainConfig
    from engine.measure.cpu_profiler import profile

    cfg = TrainConfig(batch_size=2, device="cpu", optimizer="adam")
    est, real = estimate("resnet18", cfg), profile("resnet18", cfg)
    ours = {r.name: r for r in est.per_module}
    theirs = {r.name: r for r in real.per_module}
    convs = [n for n in ours if n.endswith("conv1") or n.endswith("conv2")]
    assert len(convs) == 17
    for n in convs:  # parameters, their Adam state and the activations each conv saved for backward
        a, b = ours[n], theirs[n]
        assert (a.parameter_bytes, a.optimizer_bytes, a.activation_bytes) == \
            (b.parameter_bytes, b.optimizer_bytes, b.activation_bytes), n
        assert a.optimizer_bytes == 2 * a.parameter_bytes + 4  # exp_avg, exp_avg_sq and the step count
    assert sum(ours[n].activation_bytes for n in convs) > 0  # those still saved at the peak (in backward)
    # Backward allocations are named after their module too, not the whole model.
    bwd = {p.module for p in real.timeline if p.phase == "backward"}
    assert {"fc", "layer4.1.conv2", "conv1"} <= bwd
    # Categories at the peak agree with the tracer's (the measured run categorises by the profiler's data flow).
    for cat in ("parameters", "buffers", "optimizer_state", "inputs"):
        assert real.breakdown_at_peak[cat] == est.breakdown_at_peak[cat], cat
