"""What a calibration profile gains by keeping each cuDNN request, checked on real H200 allocator traces.

A real `torch.cuda.memory._dump_snapshot()` recorded with C++ frames (vramscope.record does) shows every request a
cuDNN convolution made, in order: the output, then a workspace from `run_conv_plan` freed before it returns; in the
backward, grad_input and its workspace, then grad_weight and its workspace. This script names each traced
convolution call with the op, shapes and output bytes the estimate's own trace gives it (the same model, the same
order), and builds two calibration profiles from the same real trace:
- "peak": what the per-op recording keeps (peak inside the op − the larger of before and after: one scratch
  request after the outputs), as `vramscope calibrate` and record_ops.py recorded until now;
- "requests": every request in order (engine.cuda.gpu_profile.KernelRecord.requests).
It then estimates the same step with no profile for these calls (the fitted rules), with each profile, and
compares the allocated and reserved figures with the real ones from the trace.

    python -m benchmarks.snapshot_requests [--markdown]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.config.train_config import TrainConfig
from engine.cuda import kernels as cuda_kernels
from engine.cuda.gpu_profile import (
    OUTPUT,
    GpuProfile,
    KernelRecord,
    Signature,
    profile_for,
    reload_profiles,
    save_profile,
)
from engine.cuda.kernels import KernelCost
from engine.planning.estimator import estimate
from engine.snapshots.allocator_check import check_trace
from engine.snapshots.file import load_snapshot_file

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # snapshot in tests/data, template, configuration it was recorded with (benchmarks/snapshot_gpu_check.py)
    ("resnet18-b8-adam.pickle.gz", "resnet18", {"batch_size": 8, "optimizer": "adam"}),
    ("resnet18-b32-adam.pickle.gz", "resnet18", {"batch_size": 32, "optimizer": "adam"}),
]
CONV_OPS = ("convolution.default", "convolution_backward.default")
MIB = 1 << 20


@dataclass
class RealCall:
    """One convolution op's requests in a real trace: ("F" forward or "B" backward, [OUTPUT or scratch bytes])."""

    kind: str
    requests: list[int]
    outputs: list[int]  # the request sizes of its outputs, in order
    awaiting_weight: bool = False  # a backward whose grad_input came and whose grad_weight has not yet


def _frames(e: dict[str, Any]) -> list[str]:
    return [str(f.get("name", "")) for f in e.get("frames", ())]


def real_conv_calls(trace: list[dict[str, Any]]) -> list[RealCall]:
    """The convolution calls of a trace with C++ frames, each with its requests in order."""
    calls: list[RealCall] = []
    for e in trace:
        if e.get("action") != "alloc":
            continue
        fr = _frames(e)
        workspace = any("run_conv_plan" in f for f in fr)
        bi = any("cudnn_convolution_backward_input" in f for f in fr)
        bw = any("cudnn_convolution_backward_weight" in f for f in fr)
        fwd = not (bi or bw) and any("at::native::cudnn_convolution(" in f for f in fr)
        if not (bi or bw or fwd):
            continue
        size = int(e["size"])
        if workspace:
            calls[-1].requests.append(size)
            continue
        # an output: a forward's starts a call, grad_input starts a backward, grad_weight starts one unless its
        # call's grad_input came just before
        if fwd:
            calls.append(RealCall("F", [OUTPUT], [size]))
        elif bi or not (calls and calls[-1].awaiting_weight):
            calls.append(RealCall("B", [OUTPUT], [size], awaiting_weight=bi))
        else:
            calls[-1].requests.append(OUTPUT)
            calls[-1].outputs.append(size)
            calls[-1].awaiting_weight = False
    return calls


def traced_conv_calls(source: str, cfg: TrainConfig) -> list[tuple[str, Signature, int]]:
    """(op, signature, output bytes) of every convolution call the estimate's trace makes, in order."""
    seen: list[tuple[str, Signature, int]] = []
    original = cuda_kernels.KernelModel.cost

    def logging_cost(self: cuda_kernels.KernelModel, op: str, sig: Signature, out: int,
                     measure: Any = None) -> KernelCost | None:
        if op in CONV_OPS:
            seen.append((op, sig, out))
        return original(self, op, sig, out, measure)

    cuda_kernels.KernelModel.cost = logging_cost  # type: ignore[method-assign]
    try:
        estimate(source, cfg)
    finally:
        cuda_kernels.KernelModel.cost = original  # type: ignore[method-assign]
    return seen


def _peak_scratch(requests: list[int], outputs: list[int]) -> int:
    """What a per-op peak recording keeps of these requests: peak inside the op − bytes kept after it."""
    live = peak = 0
    outs = iter(outputs)
    for n in requests:
        if n == OUTPUT:
            live += next(outs, 0)
            peak = max(peak, live)
        else:
            peak = max(peak, live + n)
    return max(0, peak - live)


def profiles(real: list[RealCall], traced: list[tuple[str, Signature, int]], base: GpuProfile
             ) -> tuple[GpuProfile, GpuProfile, int]:
    """The "peak" and "requests" profiles of the calls the trace and the estimate share (in order), and how many
    calls were paired."""
    peak: dict[tuple[str, Signature, int], KernelRecord] = {}
    reqs: dict[tuple[str, Signature, int], KernelRecord] = {}
    n = min(len(real), len(traced))
    for r, (op, sig, out) in zip(real[:n], traced[:n], strict=True):
        if (r.kind == "F") != (op == "convolution.default"):
            raise SystemExit(f"the trace and the estimate disagree on the order of convolutions at {op}")
        s = _peak_scratch(r.requests, r.outputs)
        key = (op, sig, out)
        peak[key] = KernelRecord(op, sig, out, max(s, peak[key].scratch) if key in peak else s, s, 1)
        reqs[key] = KernelRecord(op, sig, out, s, s, 1, tuple(r.requests))
    return (replace(base, kernels=tuple(peak.values()), source="per-op peaks of a real trace"),
            replace(base, kernels=tuple(reqs.values()), source="requests of a real trace"), n)


@contextmanager
def only_profile(p: GpuProfile | None) -> Iterator[None]:
    """Estimates in this block see `p` as the user's calibration of its GPU (None: the built-in rules only)."""
    old = os.environ.get("VRAMSCOPE_DATA_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["VRAMSCOPE_DATA_DIR"] = d
        if p is not None:
            save_profile(p)
        reload_profiles()
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("VRAMSCOPE_DATA_DIR", None)
            else:
                os.environ["VRAMSCOPE_DATA_DIR"] = old
            reload_profiles()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    base = profile_for("H200")
    assert base is not None
    rows = []
    for snap, model, conf in CASES:
        data = load_snapshot_file(ROOT / "tests" / "data" / snap)
        trace = data["device_traces"][0]
        real_reserved = check_trace(data).real_peak_reserved
        cfg = TrainConfig(gpu="H200", **conf)
        real = real_conv_calls(trace)
        traced = traced_conv_calls(model, cfg)
        peak_p, req_p, paired = profiles(real, traced, base)
        no_conv = replace(base, kernels=tuple(k for k in base.kernels if k.op not in CONV_OPS))
        for label, prof in (("fitted rules", no_conv), ("per-op peaks", peak_p), ("requests", req_p)):
            with only_profile(prof):
                est = estimate(model, cfg)
            assert est.gpu is not None
            rows.append((snap, label, paired, len(real), est.gpu.reserved_bytes, real_reserved))
    head = "| snapshot | conv kernels from | calls paired / in trace | reserved MiB est / real | err % |"
    print(head if a.markdown else head.replace("|", " "))
    if a.markdown:
        print("|---|---|---|---|---|")
    for snap, label, paired, total, est_r, real_r in rows:
        cells = [snap, label, f"{paired} / {total}", f"{est_r / MIB:,.0f} / {real_r / MIB:,.0f}",
                 f"{100 * (est_r - real_r) / real_r:+.2f}"]
        print("| " + " | ".join(cells) + " |" if a.markdown else "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
