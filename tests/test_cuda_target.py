"""The CUDA target's kernel choices while tracing on fake CPU tensors (engine.cuda.target)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.zoo_models import FunctionSource
from engine.config.train_config import TrainConfig
from engine.planning.estimator import estimate


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
    from engine.trace.tracer import trace_model

    trace, _ = trace_model(est_source, cfg)
    # kernels' own scratch aside (a bias gradient's reduction stages its partial sums: engine.cuda.reduce)
    return max(e.nbytes for e in trace.events if not e.op.endswith("(kernel scratch)"))


def test_dropout_saves_a_one_byte_mask_on_cuda():
    # What the fused kernel really returns, measured here on real tensors: a bool mask.
    assert torch.native_dropout(torch.ones(8), 0.5, True)[1].dtype == torch.bool
    n, width = 64, 4096
    src = FunctionSource("drop", lambda cfg: (nn.Sequential(nn.Linear(width, width), nn.Dropout(0.1),
                                                            nn.Linear(width, 8)), torch.randn(n, width)))
    base = TrainConfig(batch_size=1, optimizer="sgd")
    def act(e):
        return max(p.by_category["activations"] for p in e.timeline)
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


class _EagerAttention(nn.Module):
    """Attention written out by hand: scores, softmax, weighted sum (no SDPA)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 3 * 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        probs = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        return probs @ v


def _dtypes_seen(cfg) -> dict[str, set]:
    """The dtypes of the outputs of each op, as the tracer ran them (by op name)."""
    from engine.trace import recorder as tracker

    seen: dict[str, set] = {}
    original = tracker.RecordingMode.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):
        out = original(self, func, types, args, kwargs)
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if isinstance(first, torch.Tensor):
            seen.setdefault(func.__name__, set()).add(first.dtype)
        return out

    tracker.RecordingMode.__torch_dispatch__ = spy
    try:
        from engine.trace.tracer import trace_model

        trace_model(FunctionSource("eager", lambda c: (_EagerAttention(), torch.randn(2, 128, 64))), cfg)
    finally:
        tracker.RecordingMode.__torch_dispatch__ = original
    return seen


def test_cuda_autocast_lists_softmax_and_norms_in_fp32_matmuls_in_half():
    cfg = TrainConfig(batch_size=1, optimizer="sgd", precision="amp-fp16")
    cuda = _dtypes_seen(cfg.with_(device="cuda"))
    cpu = _dtypes_seen(cfg.with_(device="cpu"))
    # CUDA autocast: matmuls in fp16, softmax and layer norm in fp32 (torch.amp's CUDA op lists).
    assert cuda["_softmax.default"] == {torch.float32}
    assert torch.float32 in cuda["native_layer_norm.default"]
    assert torch.float16 in cuda["bmm.default"] or torch.float16 in cuda.get("addmm.default", set())
    # The CPU's autocast leaves softmax in half precision: the two targets differ exactly there.
    assert cpu["_softmax.default"] == {torch.float16}


def test_checkpointing_recomputes_with_the_same_kernel_choices():
    """Backward recomputes checkpointed blocks; they must pick the fused dropout and attention kernels again,
    or torch.utils.checkpoint refuses the recomputation."""
    cfg = TrainConfig(batch_size=2, seq_len=128, optimizer="sgd", device="cuda")
    plain = estimate("gpt2", cfg)
    ckpt = estimate("gpt2", cfg.with_(checkpointing=True))
    def act(e):
        return max(p.by_category["activations"] for p in e.timeline)
    assert act(ckpt) < act(plain) / 2
