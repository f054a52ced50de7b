"""Held-out models for the GPU validation: architectures the kernel model was not written against (an LSTM and a
GRU language model, a residual CNN without batch norm, nn.TransformerEncoder, an encoder-decoder nn.Transformer,
Hugging Face T5-small from its config). Each `name(batch_size) -> (model, inputs)` is a `file.py:function` source."""

from __future__ import annotations

import torch
from torch import nn


class _RnnLM(nn.Module):
    def __init__(self, cell: type[nn.Module], vocab: int, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = cell(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return nn.functional.cross_entropy(self.head(out).flatten(0, 1), ids.flatten())


def lstm_lm(batch_size: int):
    """Two-layer LSTM language model, width 1024, sequence 128, vocabulary 10,000."""
    return _RnnLM(nn.LSTM, 10_000, 512, 1024, 2), torch.randint(0, 10_000, (batch_size, 128))


class _Tagger(nn.Module):
    """A bidirectional LSTM sequence tagger: one tag per token (the cuDNN RNN rule was fitted on one direction)."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)
        self.tags = tags

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return nn.functional.cross_entropy(self.head(out).flatten(0, 1), (ids % self.tags).flatten())


def bilstm_tagger(batch_size: int):
    """Bidirectional two-layer LSTM tagger: embedding 128, hidden 192, 80 steps, vocabulary 20,000, 17 tags."""
    return _Tagger(20_000, 128, 192, 2, 17), torch.randint(0, 20_000, (batch_size, 80))


def gru_lm(batch_size: int):
    """Three-layer GRU language model, width 768, sequence 256, vocabulary 8,000."""
    return _RnnLM(nn.GRU, 8_000, 384, 768, 3), torch.randint(0, 8_000, (batch_size, 256))


class _Res(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(torch.relu(self.a(x))))


def plain_cnn(batch_size: int):
    """Residual CNN without batch norm (conv+ReLU, strided convs between stages), 112x112 RGB, 100 classes."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU()]
    c = 64
    for out in (64, 128, 256):
        if out != c:
            layers += [nn.Conv2d(c, out, 3, stride=2, padding=1), nn.ReLU()]
            c = out
        layers += [_Res(c), _Res(c)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 100)]
    return nn.Sequential(*layers), torch.randn(batch_size, 3, 112, 112)


def transformer_encoder(batch_size: int):
    """nn.TransformerEncoder, 6 layers of width 512, 8 heads, sequence 256 (batch-first)."""
    layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), torch.randn(batch_size, 256, 512)


class _Seq2Seq(nn.Module):
    def __init__(self, vocab: int = 16_000, dim: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.core = nn.Transformer(dim, 8, 4, 4, 2048, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        out = self.core(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True)
        return nn.functional.cross_entropy(self.head(out).flatten(0, 1), tgt.flatten())


def seq2seq(batch_size: int):
    """Encoder-decoder nn.Transformer (4+4 layers, width 512), source 256 and target 128 tokens."""
    return _Seq2Seq(), (torch.randint(0, 16_000, (batch_size, 256)), torch.randint(0, 16_000, (batch_size, 128)))


def t5_small(batch_size: int):
    """Hugging Face T5-small built from its config (random weights), source 256 and target 128 tokens."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128,
                   feed_forward_proj="relu", dropout_rate=0.1, decoder_start_token_id=0,
                   pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg)
    return model, {"input_ids": torch.randint(0, 32128, (batch_size, 256)),
                   "labels": torch.randint(0, 32128, (batch_size, 128))}
