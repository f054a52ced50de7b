"""The fused TransformerEncoderLayer kernel's intermediates (engine.cuda.fused) against the H200's measured calls."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from torch import nn

from engine.cuda.fused import OUT, encoder_layer_sequence

OPS = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "h200" / "ops-heldout.jsonl.gz"


def _args(b, s, d, ff, dtype, norm_first=False, mask=None):
    layer = nn.TransformerEncoderLayer(d, 8, ff, dtype=dtype, norm_first=norm_first)
    w = [layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias, layer.self_attn.out_proj.weight,
         layer.self_attn.out_proj.bias]
    return [torch.empty(b, s, d, dtype=dtype), d, 8, *w, False, norm_first, 1e-5, layer.norm1.weight,
            layer.norm1.bias, layer.norm2.weight, layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
            layer.linear2.weight, layer.linear2.bias, mask]


def _profile(steps, out_bytes):
    """(highest, final) bytes above the call's start, the output counted where it is made."""
    now = high = 0
    sizes = {}
    for name, n in steps:
        if (name, n) == OUT:
            now += out_bytes
        elif n:
            sizes[name] = n
            now += n
        else:
            now -= sizes.pop(name)
        high = max(high, now)
    return high, now


def test_sequence_reproduces_the_measured_peak_and_what_the_call_keeps():
    calls = []
    with gzip.open(OPS, "rt") as f:
        case = None
        for line in f:
            r = json.loads(line)
            if "case" in r:
                case = r
            elif r["op"] == "aten._transformer_encoder_layer_fwd.default" and case["config"].get("mode") == "inference":
                calls.append(r)
    assert len(calls) == 12  # 6 layers, 2 passes
    (b, s, d), dtype = calls[0]["in"][0]
    assert dtype == "float16"
    steps = encoder_layer_sequence(_args(b, s, d, 2048, torch.float16))
    high, kept = _profile(steps, calls[0]["out"])
    for r in calls[1:]:  # the first call also made cuBLAS's workspace (32 MiB) and 1 MiB more, kept
        assert high == r["peak"] - r["before"]  # 96 MiB: the projection, feed-forward and their inputs
        assert kept == r["after"] - r["before"]  # its output: every intermediate freed


def test_norm_first_returns_the_feed_forward_output_and_a_mask_takes_another_path():
    u = 4 * 16 * 64 * 2
    steps = encoder_layer_sequence(_args(4, 16, 64, 256, torch.float16, norm_first=True))
    high, kept = _profile(steps, u)
    assert kept == u and high == u + 3 * u + 2 * u + u  # norm0 + q/k/v + attention and projection + ...
    assert encoder_layer_sequence(_args(4, 16, 64, 256, torch.float16, mask=torch.zeros(16, 16))) is None
