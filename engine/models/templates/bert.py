"""BERT-base and BERT-large encoders in plain torch.nn, shaped exactly like Hugging Face's BertModel.

The pooler is included (as in BertModel), so bert-base counts 109,482,240 parameters like bert-base-uncased.
Forward returns BertModel's (last_hidden_state, pooler_output) tuple and no loss: trained, the tracer's loss is
the sum of last_hidden_state, as it would be for transformers' BertModel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...parallel.tensor_parallel import AttentionHeads
from .inputs import BuildFn, check_seq_len, tensor, token_ids


@dataclass(frozen=True)
class BertConfig:
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    vocab_size: int = 30522
    max_positions: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    eps: float = 1e-12


BERT_BASE = BertConfig()
BERT_LARGE = BertConfig(hidden=1024, layers=24, heads=16, intermediate=4096)


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return tensor(self.dropout(self.LayerNorm(x)))


class BertSelfAttention(AttentionHeads):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads, self.kv_heads, self.p = c.heads, c.heads, c.dropout
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, n, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
            attn_mask=mask, dropout_p=self.p if self.training else 0.0,
        )
        return y.transpose(1, 2).reshape(b, n, d)


class BertDenseNorm(nn.Module):
    """dense -> dropout -> LayerNorm(residual + .), BertSelfOutput and BertOutput alike."""

    def __init__(self, cin: int, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cin, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return tensor(self.LayerNorm(self.dropout(self.dense(x)) + residual))


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertDenseNorm(c.hidden, c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return tensor(self.output(self.self(x, mask), x))


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = nn.Linear(c.hidden, c.intermediate)
        self.output = BertDenseNorm(c.intermediate, c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, mask)
        return tensor(self.output(F.gelu(self.intermediate(x)), x))


class BertModel(nn.Module):
    def __init__(self, c: BertConfig = BERT_BASE):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.layers))
        self.pooler = nn.Linear(c.hidden, c.hidden)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None
        if attention_mask is not None:  # 1 = attend, 0 = padding, broadcast over heads and queries
            mask = attention_mask[:, None, None, :].bool()
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layer:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


def builder(config: BertConfig, name: str) -> BuildFn:
    def build(batch_size: int, seq_len: int | None = None, image_size: int | None = None
              ) -> tuple[BertModel, dict[str, torch.Tensor]]:
        n = check_seq_len(name, seq_len, default=512, maximum=config.max_positions)
        return BertModel(config), {"input_ids": token_ids(batch_size, n, config.vocab_size)}

    return build
