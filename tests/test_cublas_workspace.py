"""Where the CUDA target takes each thread's cuBLAS workspaces from the caching allocator, against the H200.

PyTorch allocates a thread's cuBLAS workspace when that thread first asks for its cuBLAS handle: inside its first
GEMM, after the GEMM's output. The real GPT-2 AMP bf16 trace (tests/data) shows it for the forward thread and for
the autograd thread; the estimate places them there, and with that the GPT-2 AMP bf16 SGD b16 validation case
reserves what the H200 reserved (it was 1,560 MiB short with the workspaces at the phases' first events: the
autograd thread's then sat in the freed logits block in the first step, and in the second step one float32
logits-sized request found no free block large enough).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from engine.config.train_config import TrainConfig
from engine.cuda.device_model import first_gemm_position
from engine.models.sources import resolve_source
from engine.planning.estimator import estimate
from engine.snapshots.file import load_snapshot_file
from engine.trace.tracer import trace_model

ROOT = Path(__file__).parent.parent
MiB = 1 << 20


def _workspace_allocs(stem: str) -> list[tuple[int, int, str]]:
    """(workspace bytes, bytes of the allocation just before it, the GEMM it was taken in) per cuBLAS workspace."""
    trace = load_snapshot_file(ROOT / "tests" / "data" / f"{stem}.pickle.gz")["device_traces"][0]
    out = []
    for i, t in enumerate(trace):
        names = [f["name"] for f in t.get("frames", ())]
        if t["action"] == "alloc" and any("setWorkspaceForHandle" in n for n in names):
            before = next(u for u in reversed(trace[:i]) if u["action"] == "alloc")
            gemm = next(n for n in names if "structured_addmm_out_cuda" in n or "structured_mm_out_cuda" in n)
            out.append((t["size"], before["size"], "addmm" if "addmm_out_cuda::impl" in gemm else "mm"))
    return out


def test_cublas_workspaces_are_taken_inside_each_threads_first_gemm_as_on_the_h200():
    real = _workspace_allocs("gpt2-b4-s512-adamw-ampbf16")
    # two threads (forward, autograd); the steps after the first reuse them
    assert [(w, g) for w, _b, g in real] == [(32 * MiB, "addmm"), (32 * MiB, "mm")]
    cfg = TrainConfig(device="cuda", gpu="H200", batch_size=4, seq_len=512, optimizer="adamw", precision="amp-bf16")
    trace, _info = trace_model(resolve_source("gpt2"), cfg)
    for phase, (_w, before, gemm) in zip(("forward", "backward"), real, strict=True):
        pos = first_gemm_position(trace, phase)
        assert pos is not None
        e = trace.events[pos - 1]  # the event the workspace follows: that GEMM's output, as in the real trace
        assert (e.phase, e.step, e.op.split(".")[0], e.nbytes) == (phase, 0, gemm, before)


def test_gpt2_amp_bf16_sgd_reserves_what_the_h200_reserved():
    cases = json.loads((ROOT / "benchmarks" / "gpu" / "h200" / "validate.json").read_text(encoding="utf-8"))
    real = next(c for c in cases if c["label"] == "gpt2 amp-bf16 sgd b16 s512")
    est = estimate("gpt2", TrainConfig(gpu="H200", **real["config"]))
    assert est.gpu is not None
    assert est.gpu.reserved_bytes == pytest.approx(real["meas_reserved"], rel=0.005)  # 10,766 vs 10,754 MiB
    assert est.replay.max_memory_allocated == pytest.approx(real["meas_allocated"], rel=0.005)


def _held_out_record(case: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every op of one real step recorded on the H200 (benchmarks/gpu/h200/ops-heldout.jsonl.gz)."""
    from engine.cuda.gpu_profile import read_ops

    rows: list[dict[str, Any]] = []
    on = False
    for r in read_ops(ROOT / "benchmarks" / "gpu" / "h200" / "ops-heldout.jsonl.gz"):
        if "case" in r:
            on = r["case"] == case and r["config"] == config
        elif on:
            rows.append(r)
    assert rows, (case, config)
    return rows


def test_a_step_without_a_gemm_takes_no_cublas_workspace_and_loads_no_cublas():
    """The H200's U-Net step (convolutions only) ran no GEMM and no op of it kept a cuBLAS workspace beyond its
    outputs; its context was 630 MiB where every training step with GEMMs had 742-762 MiB. The estimate takes no
    workspace for it and leaves cuBLAS's share out of the calibrated context."""
    from engine.cuda.device_model import CUBLAS_OPS, uses_cublas
    from engine.cuda.gpu_profile import profile_for, short_op

    config: dict[str, Any] = {"batch_size": 8, "optimizer": "adamw", "precision": "amp-bf16"}
    real = _held_out_record("unet", config)
    assert not any(short_op(r["op"]).split(".")[0] in CUBLAS_OPS for r in real)
    assert max(r["after"] - r["before"] - r["out"] for r in real) < 32 * MiB
    cfg = TrainConfig(gpu="H200", **config)
    trace, _info = trace_model(resolve_source("unet"), cfg)
    assert not uses_cublas(trace)
    est = estimate("unet", cfg)
    assert est.gpu is not None and est.gpu.workspace_bytes == 0
    h200 = profile_for("H200")
    assert h200 is not None and h200.context_bytes is not None
    assert est.gpu.cuda_context_bytes == h200.context_bytes - 128 * MiB  # 630 MiB measured, 630 modelled
    assert any("runs no GEMM" in n for n in est.notes)


def test_a_step_with_gemms_keeps_its_workspaces_and_the_whole_context():
    from engine.cuda.gpu_profile import profile_for

    cfg = TrainConfig(gpu="H200", batch_size=128, optimizer="sgd-momentum", precision="amp-bf16")
    est = estimate(str(ROOT / "benchmarks" / "gpu_models.py") + ":plain_cnn", cfg)  # convolutions and a Linear head
    h200 = profile_for("H200")
    assert est.gpu is not None and h200 is not None
    assert est.gpu.workspace_bytes == sum(h200.cublas_workspaces[:2])
    assert est.gpu.cuda_context_bytes == h200.context_bytes


def test_an_inference_step_without_a_gemm_leaves_out_one_threads_share():
    from engine.cuda.gpu_profile import profile_for

    est = estimate("unet", TrainConfig(gpu="H200", batch_size=2, mode="inference", precision="bf16"))
    h200 = profile_for("H200")
    assert est.gpu is not None and h200 is not None and h200.context_inference_bytes is not None
    assert est.gpu.workspace_bytes == 0
    assert est.gpu.cuda_context_bytes == h200.context_inference_bytes - 66 * MiB  # the first matmul's 66 MiB
