"""GPT-2 (124M) and GPT-2 medium (355M) language models in plain torch.nn, shaped like Hugging Face's
GPT2LMHeadModel: the LM head is tied to the token embedding, so the count equals GPT2Model's
(gpt2 124,439,808; gpt2-medium 354,823,168). Given `labels`, forward returns an LMOutput with `.loss`
(next-token cross-entropy, the HF way) and `.logits`.
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
class GPT2Config:
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    vocab_size: int = 50257
    max_positions: int = 1024
    dropout: float = 0.1
    eps: float = 1e-5


GPT2_SMALL = GPT2Config()
GPT2_MEDIUM = GPT2Config(hidden=1024, layers=24, heads=16)


class CausalSelfAttention(AttentionHeads):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.heads, self.kv_heads, self.p = c.heads, c.heads, c.dropout
        self.c_attn = nn.Linear(c.hidden, 3 * c.hidden)
        self.c_proj = nn.Linear(c.hidden, c.hidden)
        self.resid_dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.c_attn(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        return tensor(self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, n, d))))


class MLP(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(c.hidden, 4 * c.hidden)
        self.c_proj = nn.Linear(4 * c.hidden, c.hidden)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's "gelu_new" is the tanh approximation.
        return tensor(self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))))


class Block(nn.Module):
    def __init__(self, c: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return tensor(x + self.mlp(self.ln_2(x)))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c: GPT2Config = GPT2_SMALL):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.hidden)
        self.wpe = nn.Embedding(c.max_positions, c.hidden)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden, eps=c.eps)
        self.lm_head = nn.Linear(c.hidden, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return lm_output(logits, labels)


def builder(config: GPT2Config, name: str) -> BuildFn:
    def build(batch_size: int, seq_len: int | None = None, image_size: int | None = None
              ) -> tuple[GPT2LMHeadModel, dict[str, torch.Tensor]]:
        n = check_seq_len(name, seq_len, default=1024, maximum=config.max_positions)
        ids = token_ids(batch_size, n, config.vocab_size)
        return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}

    return build
