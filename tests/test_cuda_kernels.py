"""The CUDA kernel model against real measurements: tests/data/h200-kernel-ops.jsonl.gz holds every convolution and
attention call of the project's templates measured on an NVIDIA H200 (see tests/data/README.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from engine.config.train_config import TrainConfig
from engine.cuda.gpu_profile import (
    KERNEL_OPS,
    _sig,
    builtin_dir,
    kernel_scratch,
    profile_from_ops,
    read_ops,
    short_op,
)
from engine.cuda.kernels import KernelModel
from engine.planning.estimator import estimate

DATA = Path(__file__).parent / "data" / "h200-kernel-ops.jsonl.gz"
H200_CC = (9, 0)
MIB = 1 << 20


@pytest.fixture(scope="module")
def rows():
    return read_ops(DATA)


@pytest.fixture(scope="module")
def builtin():
    from engine.cuda.gpu_profile import load_profile

    return load_profile(builtin_dir() / "nvidia-h200.json")


def _kernel_rows(rows):
    case = None
    for r in rows:
        if "case" in r:
            case = r["case"]
            continue
        op = short_op(r["op"])
        if op in KERNEL_OPS:
            yield case, op, _sig(r["in"]), int(r["out"]), kernel_scratch(r)


def test_builtin_profile_is_what_the_measurements_say(rows, builtin):
    learned = profile_from_ops(rows)
    assert learned.kernels == builtin.kernels  # no hand-edited entries
    assert learned.cublas_workspaces == builtin.cublas_workspaces == (32 * MIB + MIB, 32 * MIB)
    assert builtin.cuda_major == 13 and builtin.cudnn_major == 9 and builtin.compute_capability == H200_CC


def test_every_measured_op_is_held_within_5_percent(rows, builtin):
    """Replays every measured kernel call through the model: its workspace within 5 % (or 1 MiB, the spread seen
    between repeated calls of one shape; the allocator's large-block granularity) of what the H200 measured."""
    model = KernelModel(H200_CC, builtin)
    n = 0
    for case, op, sig, out, measured in _kernel_rows(rows):
        cost = model.cost(op, sig, out)
        assert cost is not None and cost.measured, (case, op, sig)
        assert abs(cost.scratch - measured) <= max(0.05 * measured, MIB), (case, op, sig, cost, measured)
        assert cost.low <= measured <= cost.high
        n += 1
    assert n > 900 and model.modelled_calls == 0


def test_rules_bound_every_measured_call_from_above(rows):
    """For shapes no profile has seen, the fitted rule's upper bound covers every call measured on the H200."""
    rule_only = KernelModel(H200_CC, None)
    ratios = []
    for case, op, sig, out, measured in _kernel_rows(rows):
        cost = rule_only.cost(op, sig, out)
        if op.startswith("convolution"):
            assert cost is not None and not cost.measured
            assert cost.low <= measured <= cost.high, (case, op, sig, cost, measured)
            if measured:
                ratios.append(cost.scratch / measured)
    assert 0.5 < statistics.median(ratios) < 2.0  # the central figure is the right size, not just a bound


def test_attention_backward_rule_matches_cudnn(rows):
    """cuDNN attention backward (Hopper, half precision): float32 dQ accumulator + softmax statistics."""
    rule_only = KernelModel(H200_CC, None)
    errors = []
    for case, op, sig, out, measured in _kernel_rows(rows):
        if op == "_scaled_dot_product_cudnn_attention_backward.default":
            cost = rule_only.cost(op, sig, out)
            assert cost is not None and cost.low <= measured <= cost.high, (case, sig, cost, measured)
            errors.append(abs(cost.scratch - measured) / measured)
    assert len(errors) >= 48 and statistics.median(errors) < 0.05


@pytest.mark.parametrize("held_out", ["unet", "vgg16", "mobilenet_v2"])
def test_a_held_out_model_stays_within_the_band(rows, held_out):
    """A profile learned without one model still bounds that model's convolutions (shapes it never saw)."""
    cases, keep = [], True
    for r in rows:
        if "case" in r:
            keep = r["case"] != held_out
        if keep:
            cases.append(r)
    model = KernelModel(H200_CC, profile_from_ops(cases))
    for case, op, sig, out, measured in _kernel_rows(rows):
        if case != held_out or not op.startswith("convolution"):
            continue
        cost = model.cost(op, sig, out)
        assert cost is not None and cost.low <= measured <= cost.high, (op, sig, cost, measured)


def test_traced_step_matches_the_h200(rows):
    """The tracer finds every convolution of a real ResNet-18 step in the H200 profile, and its predicted
    max_memory_allocated is what the H200 measured. That step was recorded op by op under a dispatch mode, which
    makes autograd sum a residual block's two gradients out of place (a plain run, which the estimate models, sums
    them in place: tests/test_autograd_sums_in_place.py); the extra transient changes which cached blocks later
    requests take, and allocated counts a block the allocator did not split as a whole, so the recorded figure
    is 0.33 % below the estimate. A plain run's figure (the ResNet-18 b32 snapshot) is held to 0.1 % in
    tests/test_kernel_request_order.py."""
    head = next(r for r in rows if r.get("case") == "resnet18")
    est = estimate("resnet18", TrainConfig(gpu="H200", **head["config"]))
    k = est.cuda_kernels
    assert k.profile == "NVIDIA H200" and k.modelled_calls == 0 and k.measured_calls >= 20
    real = head["peak_allocated"]
    assert abs(est.replay.max_memory_allocated - real) <= 0.005 * real


def test_half_precision_attention_takes_cudnn_on_hopper(rows):
    head = next(r for r in rows if r.get("case") == "bert-base")
    est = estimate("bert-base", TrainConfig(gpu="H200", **head["config"]))
    k = est.cuda_kernels
    assert k.modelled_calls == 0 and k.measured_calls >= 24  # each layer's forward and backward, measured
    real = head["peak_allocated"]
    assert abs(est.replay.max_memory_allocated - real) <= 0.03 * real
    json.dumps(est.to_json())


def test_cudnn_lstm_reserve_and_workspace_match_the_h200(rows):
    """nn.LSTM as cuDNN runs it (engine.cuda.rnn): the template's reserve and workspace as the H200 measured, and
    the step's max_memory_allocated with them."""
    from engine.cuda.rnn import sizes

    fwd = next(r for r in rows if short_op(r.get("op", "")) == "_cudnn_rnn.default")
    (batch, steps, _feat), _dt = fwd["in"][0]
    hidden = fwd["in"][2][0][1]
    layers = next(s[0] for s, _d in fwd["in"][1:] if len(s) == 3)  # the initial hidden state: (layers, batch, hidden)
    reserve, workspace = sizes("lstm", layers, steps, batch, hidden, 1, 4)
    out_and_states = batch * steps * hidden * 4 + 2 * layers * batch * hidden * 4
    measured_reserve = fwd["after"] - fwd["before"] - out_and_states
    assert abs(reserve - measured_reserve) <= 0.02 * measured_reserve
    x_copy = batch * steps * _feat * 4  # cuDNN's time-major copy of the batch-first input, held with the workspace
    assert abs(workspace + x_copy - kernel_scratch(fwd)) <= 0.01 * kernel_scratch(fwd)
    head = next(r for r in rows if r.get("case") == "lstm-lm")
    est = estimate("lstm-lm", TrainConfig(gpu="H200", **head["config"]))
    real = head["peak_allocated"]
    assert abs(est.replay.max_memory_allocated - real) <= 0.02 * real


def test_every_catalogue_gpu_has_its_multiprocessors_for_the_reduction_model():
    """The reductions' staging buffers depend on the GPU's multiprocessor count and threads per multiprocessor
    (engine.cuda.reduce): every GPU of the catalogue carries its count (a required field of resources/gpus.json),
    its compute capability has threads per multiprocessor, and the H200 target uses its 132."""
    from engine.config.gpus import list_gpus
    from engine.cuda.kernels import rules

    red = rules()["reduction"]
    for g in list_gpus():
        assert 10 <= g.sm_count <= 200, g.name
        assert g.cc in red["threads_per_sm"], g.cc
    assert KernelModel(H200_CC, None, gpu=TrainConfig(gpu="H200").gpu_spec).sms == 132
    assert KernelModel(H200_CC, None).sms == red["default_sm_count"]  # no GPU named: the default target's (A100)
