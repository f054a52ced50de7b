"""Fits the kernel-scratch rules of resources/cuda_kernels.json to a GPU profile's measured kernel calls.

The rules cost the calls a profile has not measured (unseen shapes, GPUs without a profile). For convolutions:
upper bound = alpha·(input + output bytes) + beta·weight bytes + const, with alpha the smallest that covers every
measured call (beta and const fixed); the central figure is the smaller of the median measured share of the bound
times the bound and the median share of the size-dependent part alone (alpha·(in + out) + beta·w) times that part.

    python -m benchmarks.fit_kernel_rules resources/gpu_profiles/nvidia-h200.json [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics

from engine.core.resources import resource_path
from engine.cuda.gpu_profile import load_profile
from engine.cuda.kernels import MIB, conv_features

FIXED = {"convolution.default": (2.0, 16), "convolution_backward.default": (3.0, 32)}  # beta, const MiB


def fit(path: str) -> dict:
    prof = load_profile(path)
    out: dict = {}
    for op, (beta, const) in FIXED.items():
        pts, dw = [], []
        for k in prof.kernels:
            if k.op != op:
                continue
            f = conv_features(op, k.inputs, k.out)
            if f is None:
                continue
            xb, yb, wb, depthwise = f
            (dw if depthwise else pts).append((k.scratch, xb, yb, wb))
        alpha = max(max(0.0, s - beta * w - const * MIB) / (x + y) for s, x, y, w in pts)
        alpha = round(alpha + 0.005, 2)
        # the central figure scales the size-dependent part only: a tiny convolution needs a tiny workspace
        ratios = [s / (alpha * (x + y) + beta * w) for s, x, y, w in pts]
        of_bound = [s / (alpha * (x + y) + beta * w + const * MIB) for s, x, y, w in pts]
        name = "convolution_forward" if op == "convolution.default" else "convolution_backward"
        out[name] = {
            "alpha": alpha, "beta": beta, "const_mib": const, "central": round(statistics.median(ratios), 3),
            "central_of_bound": round(statistics.median(of_bound), 3),
            "depthwise_high_mib": max(1, -(-max((s for s, *_ in dw), default=0) // MIB)),
            "fitted_on": f"{len(pts)} measured calls ({len(dw)} depthwise) of {prof.gpu_name}",
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--write", action="store_true", help="update resources/cuda_kernels.json")
    a = ap.parse_args()
    conv = fit(a.profile)
    print(json.dumps(conv, indent=1))
    if a.write:
        path = resource_path("cuda_kernels.json")
        data = json.loads(path.read_text(encoding="utf-8"))
        data.update(conv)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
