"""LLaMA-2 7B / 13B / 70B causal language models in plain torch.nn, shaped like Hugging Face's
LlamaForCausalLM (untied LM head, RMSNorm, SwiGLU MLP, rotary positions; 70B uses 8 grouped KV heads).
Given `labels`, forward returns an LMOutput with `.loss` (next-token cross-entropy, the HF way) and `.logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...parallel.tensor_parallel import AttentionHeads
from .inputs import BuildFn, check_seq_len, tensor, token_ids
from .lm_loss import LMOutput, lm_output


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 32
    intermediate: int = 11008
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    eps: float = 1e-5


LLAMA2_7B = LlamaConfig()
LLAMA2_13B = LlamaConfig(hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=13824)
LLAMA2_70B = LlamaConfig(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in float32 and cast back, as LlamaRMSNorm does (this is what half precision keeps in memory).
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype) -> Rope:
    """cos and sin of the rotary embedding, (seq_len, head_dim), made per forward as no parameter holds them."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class LlamaAttention(AttentionHeads):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.hidden // c.heads
        self.q_proj = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return tensor(self.o_proj(y.transpose(1, 2).reshape(b, n, -1)))


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = LlamaMLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return tensor(x + self.mlp(self.post_attention_layernorm(x)))


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: LlamaConfig = LLAMA2_7B):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = nn.Linear(c.hidden, c.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        x = self.embed_tokens(input_ids)
        c = self.config
        cos, sin = rotary(input_ids.shape[1], c.hidden // c.heads, c.rope_theta, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return lm_output(logits, labels)


# cos and sin of the rotary embedding (read by annotations only, which are strings: it may follow the forwards)
Rope = tuple[torch.Tensor, torch.Tensor]


def builder(config: LlamaConfig, name: str) -> BuildFn:
    def build(batch_size: int, seq_len: int | None = None, image_size: int | None = None
              ) -> tuple[LlamaForCausalLM, dict[str, torch.Tensor]]:
        n = check_seq_len(name, seq_len, default=2048)
        ids = token_ids(batch_size, n, config.vocab_size)
        return LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}

    return build
