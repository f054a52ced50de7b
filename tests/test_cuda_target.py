"""The CUDA target's kernel choices while tracing on fake CPU tensors (engine.cuda_target)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo_models import FunctionSource
from engine.config import TrainConfig
from engine.estimator import estimate


class _Attn(nn.Module):
    def __init__(self, causal=True, mask=None):
        super().__init__()
        self.qkv = nn.Linear(64, 3 * 64)
        self.causal, self.mask = causal, mask

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal)


def _largest_allocation(est_source, cfg) -> int:
    from engine.tracer import trace_model

    trace, _ = trace_model(est_source, cfg)
    return max(e.nbytes for e in trace.events)


def test_dropout_saves_a_one_byte_mask_on_cuda():
    # What the fused kernel really returns, measured here on real tensors: a bool mask.
    assert torch.native_dropout(torch.ones(8), 0.5, True)[1].dtype == torch.bool
    n, width = 64, 4096
    src = FunctionSource("drop", lambda cfg: (nn.Sequential(nn.Linear(width, width), nn.Dropout(0.1),
                                                            nn.Linear(width, 8)), torch.randn(n, width)))
    base = TrainConfig(batch_size=1, optimizer="sgd")
    act = lambda e: max(p.by_category["activations"] for p in e.timeline)
    cpu = estimate(src, base.with_(device="cpu"))
    cuda = estimate(src, base.with_(device="cuda"))
    # The CPU keeps a float mask (4 B/element), CUDA a bool one (1 B/element).
    assert act(cpu) - act(cuda) == 3 * n * width


def test_attention_keeps_no_score_matrix_with_flash_or_memory_efficient_kernels():
    b, t = 2, 512
    scores = b * 4 * t * t * 2  # one bf16 (B, H, T, T) matrix
    src = FunctionSource("attn", lambda cfg: (_Attn(), torch.randn(b, t, 64)))
    cfg = TrainConfig(batch_size=1, optimizer="sgd", precision="bf16")
    assert _largest_allocation(src, cfg.with_(device="cuda")) < scores / 8  # flash: output and log-sum-exp only
    masked = FunctionSource("attn-mask", lambda cfg: (_Attn(False, torch.ones(t, t, dtype=torch.bool).tril()),
                                                      torch.randn(b, t, 64)))
    # fp32 with a mask: the memory-efficient kernel, whose largest tensor is the additive bias built from the mask
    assert _largest_allocation(masked, cfg.with_(device="cuda", precision="fp32")) <= t * t * 4


def test_old_gpus_without_flash_use_memory_efficient_attention():
    b, t = 2, 512
    src = FunctionSource("attn", lambda cfg: (_Attn(), torch.randn(b, t, 64)))
    cfg = TrainConfig(batch_size=1, optimizer="sgd", precision="fp16", device="cuda", gpu="T4")
    assert _largest_allocation(src, cfg) < b * 4 * t * t * 2 / 8
