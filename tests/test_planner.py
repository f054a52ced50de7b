"""The planner: max batch (search against exact re-estimates) and ranked recommendations."""

import math
import textwrap
from types import SimpleNamespace

import pytest

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.planning.planner import adafactor_state_bytes, max_batch, recommend

MiB = 1024**2

MLP = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build(batch_size):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        return model, torch.randn(batch_size, 256)
    """
)
MLP_PARAMS = 256 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "mlp.py"
    p.write_text(MLP)
    return f"{p}:build"


def _fake(fn):
    calls = []

    def run(cfg):
        calls.append(cfg.batch_size)
        return SimpleNamespace(peak_bytes=fn(cfg.batch_size), gpu=None)

    return run, calls


def _brute(fn, budget):
    b = 1
    while fn(b + 1) <= budget:
        b += 1
    return b


def test_max_batch_affine_takes_four_traces():
    fn = lambda b: 1_000_000 + 12_345 * b  # noqa: E731
    run, calls = _fake(fn)
    r = max_batch("unused", TrainConfig(), fn(100) + 5, estimator=run)
    assert r.batch_size == 100 and r.peak_bytes == fn(100) and r.peak_next == fn(101)
    assert r.traces_run == len(calls) == 4  # 1, 2, the prediction, the prediction + 1


def test_max_batch_piecewise_and_rounded():
    # the optimizer step's constant peak hides the batch at small sizes; 512-byte rounding adds steps
    fn = lambda b: max(50 * MiB, 20 * MiB + math.ceil(b * 17_300 / 512) * 512)  # noqa: E731
    budget = 64 * MiB
    run, calls = _fake(fn)
    r = max_batch("unused", TrainConfig(), budget, estimator=run)
    assert r.batch_size == _brute(fn, budget)
    assert fn(r.batch_size) <= budget < fn(r.batch_size + 1)
    assert r.traces_run <= 10


def test_max_batch_batch_one_too_big():
    run, _ = _fake(lambda b: 3 * 1024**3 * b)
    with pytest.raises(UserError, match="even batch size 1 does not fit: it needs 3.00 GiB, 1.00 GiB more"):
        max_batch("unused", TrainConfig(), 2 * 1024**3, estimator=run)


def test_max_batch_real_estimates(mlp):
    # inference: peak = fp32 parameters + the batch's live activations; the answer and the answer + 1 are
    # exact traces, and the peak grows by the activations of one more sample
    cfg = TrainConfig(mode="inference", device="cpu")
    budget = 12 * MiB
    r = max_batch(mlp, cfg, budget)
    assert r.peak_bytes <= budget < r.peak_next
    assert r.peak_bytes >= 4 * MLP_PARAMS
    assert r.traces_run <= 6


def test_adafactor_state_formula():
    # Adafactor (Shazeer & Stern 2018) keeps n + m fp32 statistics for an n×m matrix instead of 2·n·m
    assert adafactor_state_bytes([(4096, 1024)]) == 4 * (4096 + 1024)
    assert adafactor_state_bytes([(1024,)]) == 4 * 1024


def test_recommendations_ranked_with_real_re_estimates(mlp):
    from engine.planning.estimator import estimate

    cfg = TrainConfig(batch_size=64, device="cpu")
    base = estimate(mlp, cfg)
    recs = recommend(mlp, cfg, base=base)
    assert recs, "at least one recommendation"
    assert [r.saves_bytes for r in recs] == sorted((r.saves_bytes for r in recs), reverse=True)
    titles = {r.title.split(" (")[0]: r for r in recs}
    sgd = titles["SGD with momentum instead of adam"]
    # Adam keeps two fp32 moments, SGD one: at least 4 bytes per parameter less at an optimizer-step peak
    assert sgd.saves_bytes >= 4 * MLP_PARAMS and not sgd.analytic and sgd.config.optimizer == "sgd-momentum"
    ada = next(r for r in recs if r.title.startswith("Adafactor"))
    assert ada.analytic and ada.config is None
    for r in recs:
        assert r.new_peak_bytes == base.peak_bytes - r.saves_bytes
        assert r.saves_bytes > 0


def test_fused_step_offered_on_cuda_and_negligible_savings_left_out(mlp):
    """On the CUDA target Adam's default foreach step holds temporaries over all parameters at once; fused=True
    does not. Every offer is re-traced, and none saving under 1 % of the peak is offered."""
    from engine.planning.estimator import estimate
    from engine.planning.planner import MIN_SAVING_FRACTION

    cfg = TrainConfig(batch_size=4, device="cuda", optimizer="adam")
    base = estimate(mlp, cfg)
    recs = recommend(mlp, cfg, base=base)
    fused = next(r for r in recs if r.title.startswith("Fused optimizer step"))
    assert fused.config.fused and not fused.analytic
    assert fused.new_peak_bytes == estimate(mlp, cfg.with_(fused=True)).peak_bytes
    assert fused.saves_bytes >= 0.99 * 4 * MLP_PARAMS  # about one fp32 temporary per parameter
    assert all(r.saves_bytes >= MIN_SAVING_FRACTION * base.peak_bytes for r in recs)
    # At batch 4 the peak is the optimizer step, so shrinking the batch through accumulation saves ~nothing.
    assert not any(r.title.startswith("Gradient accumulation") for r in recs)
    assert base.peak_phase == "optimizer"


def test_max_batch_cli_json_and_error(mlp, capsys):
    import json

    from main import main

    rc = main(["max-batch", mlp, "--budget", str(12 / 1024), "--mode", "inference", "--device", "cpu", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out["batch_size"], int) and out["peak_bytes"] <= 12 * MiB < out["peak_next"]
    rc = main(["max-batch", mlp, "--budget", "0.001", "--device", "cpu"])
    assert rc == 2
    assert "even batch size 1 does not fit" in capsys.readouterr().err
