"""The validation zoo: models of every kind users bring, each with the configurations it is measured under.

Each entry is small enough to run for real on a 2-core CPU; the tracer's estimate (--device cpu) is compared
with the real step measured by PyTorch's profiler (engine.measure.cpu_profiler.measure_cpu).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.config.train_config import TrainConfig
from engine.models.sources import ModelSource


class FunctionSource(ModelSource):
    kind = "function"

    def __init__(self, name: str, fn: Callable[[TrainConfig], tuple[nn.Module, Any]]):
        self.name, self.fn = name, fn

    def build(self, cfg: TrainConfig):
        return self.fn(cfg)


def _mlp(cfg):
    m = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Dropout(0.1), nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 10))
    return m, torch.randn(cfg.batch_size, 512)


def _cnn_bn(cfg):
    m = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )
    return m, torch.randn(cfg.batch_size, 3, 64, 64)


class _GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2000, 128)
        self.gru = nn.GRU(128, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 5)

    def forward(self, x):
        out, _ = self.gru(self.emb(x))
        return self.head(out[:, -1])


def _gru(cfg):
    return _GRUClassifier(), torch.randint(0, 2000, (cfg.batch_size, 32))


def _transformer_encoder(cfg):
    layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), torch.randn(cfg.batch_size, 128, 256)


class _SelfCheckpointed(nn.Module):
    """Calls torch.utils.checkpoint itself, as many user models do."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)) for _ in range(4)
        )
        self.head = nn.Linear(512, 10)

    def forward(self, x):
        for b in self.blocks:
            x = x + checkpoint(b, x, use_reentrant=False)
        return self.head(x)


def _self_ckpt(cfg):
    return _SelfCheckpointed(), torch.randn(cfg.batch_size, 64, 512)


class _MaskedPool(nn.Module):
    """Boolean-mask indexing: the output size depends on the data."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 256)
        self.head = nn.Linear(256, 1)

    def forward(self, x):
        h = self.proj(x).relu()
        picked = h[h.sum(-1) > 0]  # data-dependent number of rows
        return self.head(picked).mean()


def _masked(cfg):
    # Seeded: which rows survive the mask depends on the weights and the data, so the estimate's real run
    # and the measurement must see the same ones.
    torch.manual_seed(0)
    return _MaskedPool(), torch.randn(cfg.batch_size, 128, 64)


def _hf_bert(cfg):
    from transformers import BertConfig, BertForMaskedLM

    c = BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=1024, max_position_embeddings=256, attn_implementation="sdpa")
    ids = torch.randint(0, 8000, (cfg.batch_size, 128))
    return BertForMaskedLM(c), {"input_ids": ids, "labels": ids}


def _hf_gpt2(cfg):
    from transformers import GPT2Config, GPT2LMHeadModel

    c = GPT2Config(vocab_size=8000, n_embd=256, n_layer=4, n_head=4, n_positions=256, attn_implementation="sdpa")
    ids = torch.randint(0, 8000, (cfg.batch_size, 128))
    return GPT2LMHeadModel(c), {"input_ids": ids, "labels": ids}


def _hf_llama(cfg):
    """A small Llama-shaped Hugging Face model (grouped KV heads, SwiGLU, RMSNorm) for LoRA/QLoRA cases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = LlamaConfig(vocab_size=4000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                    attn_implementation="sdpa")
    ids = torch.randint(0, 4000, (cfg.batch_size, 128))
    return LlamaForCausalLM(c), {"input_ids": ids, "labels": ids}


class _LogitsLM(nn.Module):
    """Returns logits, no loss: the step's fallback `out.sum()` sends back an expanded (stride-0) gradient
    that the matmul kernels copy."""

    def __init__(self, vocab=4000):
        super().__init__()
        self.emb, self.hidden, self.head = nn.Embedding(vocab, 64), nn.Linear(64, 64), nn.Linear(64, vocab)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(self.emb(x))))


def _logits_lm(cfg):
    return _LogitsLM(), torch.randint(0, 4000, (cfg.batch_size, 64))


class _MeanHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(128, 128)

    def forward(self, x):
        return self.proj(x).mean(1)  # the CPU reduces half precision in fp32: a float copy inside the kernel


def _mean_head(cfg):
    return _MeanHead(), torch.randn(cfg.batch_size, 512, 128)


def _template(name: str):
    from engine.models.sources import resolve_source

    return resolve_source(name)


# Hugging Face configurations built from config fields (no download): a Llama-shaped decoder with grouped-query
# attention, and a Mixtral-shaped mixture of experts: with the eager expert loop (engine.models.moe_routing's plan, the
# same in the real run) and with transformers' default grouped_mm experts (routing-independent buffers).
HF_LLAMA = dict(model_type="llama", vocab_size=2048, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
HF_MIXTRAL = dict(model_type="mixtral", vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                  max_position_embeddings=1024, experts_implementation="eager")
HF_MIXTRAL_DEFAULT = {k: v for k, v in HF_MIXTRAL.items() if k != "experts_implementation"}


def _hf(name: str, fields: dict):
    from engine.models.hf_source import HFConfigSource

    return lambda: HFConfigSource(fields, name, "benchmarks.zoo_models")


@dataclass(frozen=True)
class ZooCase:
    label: str
    source: Callable[[], ModelSource]
    cfg: TrainConfig
    fast: bool = False  # part of the test suite


def _fs(name, fn):
    return lambda: FunctionSource(name, fn)


def _cpu(**kw) -> TrainConfig:
    return TrainConfig(device="cpu", **kw)


ZOO: tuple[ZooCase, ...] = (
    ZooCase("mlp adam", _fs("mlp", _mlp), _cpu(batch_size=64, optimizer="adam"), fast=True),
    ZooCase("mlp sgd amp-bf16", _fs("mlp", _mlp), _cpu(batch_size=64, optimizer="sgd", precision="amp-bf16"),
            fast=True),
    ZooCase("mlp adamw amp-fp16 (GradScaler)", _fs("mlp", _mlp),
            _cpu(batch_size=64, optimizer="adamw", precision="amp-fp16"), fast=True),
    ZooCase("logits-only LM adam (sum loss)", _fs("logits-lm", _logits_lm), _cpu(batch_size=4, optimizer="adam"),
            fast=True),
    ZooCase("mean head bf16 sgd", _fs("mean-head", _mean_head), _cpu(batch_size=4, optimizer="sgd", precision="bf16"),
            fast=True),
    ZooCase("cnn+bn sgd-momentum", _fs("cnn-bn", _cnn_bn), _cpu(batch_size=8, optimizer="sgd-momentum"), fast=True),
    ZooCase("cnn+bn inference", _fs("cnn-bn", _cnn_bn), _cpu(batch_size=8, mode="inference"), fast=True),
    ZooCase("gru adam", _fs("gru", _gru), _cpu(batch_size=8, optimizer="adam"), fast=True),
    ZooCase("transformer-encoder adamw", _fs("tenc", _transformer_encoder), _cpu(batch_size=4, optimizer="adamw")),
    ZooCase("transformer-encoder inference (fast path)", _fs("tenc", _transformer_encoder),
            _cpu(batch_size=4, mode="inference"), fast=True),
    ZooCase("self-checkpointing mlp adam", _fs("self-ckpt", _self_ckpt), _cpu(batch_size=8, optimizer="adam"),
            fast=True),
    ZooCase("data-dependent mask sgd", _fs("masked", _masked), _cpu(batch_size=4, optimizer="sgd"), fast=True),
    ZooCase("hf bert-mlm adamw", _fs("hf-bert", _hf_bert), _cpu(batch_size=2, optimizer="adamw")),
    ZooCase("hf gpt2 amp-bf16 adamw", _fs("hf-gpt2", _hf_gpt2),
            _cpu(batch_size=2, optimizer="adamw", precision="amp-bf16")),
    ZooCase("resnet18@64 adam", lambda: _template("resnet18"), _cpu(batch_size=4, image_size=64, optimizer="adam")),
    ZooCase("resnet18@64 amp-bf16 sgd", lambda: _template("resnet18"),
            _cpu(batch_size=4, image_size=64, optimizer="sgd", precision="amp-bf16")),
    ZooCase("resnet18@64 checkpointing adam", lambda: _template("resnet18"),
            _cpu(batch_size=4, image_size=64, optimizer="adam", checkpointing=True)),
    ZooCase("mobilenet_v2@64 rmsprop", lambda: _template("mobilenet_v2"),
            _cpu(batch_size=4, image_size=64, optimizer="rmsprop")),
    ZooCase("unet@64 adamw", lambda: _template("unet"), _cpu(batch_size=1, image_size=64, optimizer="adamw")),
    ZooCase("lstm-lm adagrad", lambda: _template("lstm-lm"), _cpu(batch_size=4, seq_len=32, optimizer="adagrad")),
    ZooCase("gpt2 seq64 checkpointing adamw", lambda: _template("gpt2"),
            _cpu(batch_size=1, seq_len=64, optimizer="adamw", checkpointing=True)),
    ZooCase("vit-b16 inference", lambda: _template("vit-b16"), _cpu(batch_size=1, mode="inference")),
    ZooCase("bert-base seq128 inference bf16", lambda: _template("bert-base"),
            _cpu(batch_size=1, seq_len=128, mode="inference", precision="bf16")),
    # LoRA / QLoRA / quantized weights / 8-bit AdamW: real peft and bitsandbytes (its CPU kernels) in both runs
    ZooCase("hf llama LoRA r16 bf16 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", precision="bf16", peft="lora")),
    ZooCase("hf llama LoRA all-linear fp32 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", peft="lora", lora_targets="all-linear")),
    ZooCase("hf llama QLoRA nf4 bf16 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", precision="bf16", peft="qlora")),
    ZooCase("hf llama QLoRA fp4 bf16 paged-adamw8bit", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="paged-adamw8bit", precision="bf16", peft="qlora", weights="fp4")),
    ZooCase("hf llama LoRA int8 fp16 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", precision="fp16", peft="lora", weights="int8")),
    ZooCase("hf llama LoRA fp8 bf16 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", precision="bf16", peft="lora", weights="fp8")),
    ZooCase("hf llama full bf16 adamw8bit", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw8bit", precision="bf16")),
    ZooCase("hf llama nf4 inference bf16", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, mode="inference", precision="bf16", weights="nf4")),
    ZooCase("hf llama int8 inference fp16", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, mode="inference", precision="fp16", weights="int8")),
    ZooCase("hf llama LoRA checkpointing bf16 adamw", _fs("hf-llama", _hf_llama),
            _cpu(batch_size=2, optimizer="adamw", precision="bf16", peft="lora", checkpointing=True)),
    ZooCase("hf llama-shaped generate dynamic cache p64+32", _hf("hf-llama", HF_LLAMA),
            _cpu(batch_size=2, mode="generate", prompt_len=64, new_tokens=32, cache="dynamic"), fast=True),
    ZooCase("hf llama-shaped generate static cache p64+32", _hf("hf-llama", HF_LLAMA),
            _cpu(batch_size=2, mode="generate", prompt_len=64, new_tokens=32, cache="static"), fast=True),
    ZooCase("hf llama-shaped generate dynamic b4 p256+64", _hf("hf-llama", HF_LLAMA),
            _cpu(batch_size=4, mode="generate", prompt_len=256, new_tokens=64)),
    ZooCase("hf mixtral-shaped inference balanced routing", _hf("hf-mixtral", HF_MIXTRAL),
            _cpu(batch_size=2, seq_len=128, mode="inference"), fast=True),
    ZooCase("hf mixtral-shaped inference worst routing", _hf("hf-mixtral", HF_MIXTRAL),
            _cpu(batch_size=2, seq_len=128, mode="inference", moe_routing="worst")),
    ZooCase("hf mixtral-shaped adamw balanced routing", _hf("hf-mixtral", HF_MIXTRAL),
            _cpu(batch_size=2, seq_len=128, optimizer="adamw")),
    ZooCase("hf mixtral-shaped adamw worst routing", _hf("hf-mixtral", HF_MIXTRAL),
            _cpu(batch_size=2, seq_len=128, optimizer="adamw", moe_routing="worst")),
    ZooCase("hf mixtral-shaped inference grouped_mm experts", _hf("hf-mixtral-default", HF_MIXTRAL_DEFAULT),
            _cpu(batch_size=2, seq_len=128, mode="inference")),
    ZooCase("hf mixtral-shaped adamw grouped_mm experts", _hf("hf-mixtral-default", HF_MIXTRAL_DEFAULT),
            _cpu(batch_size=2, seq_len=128, optimizer="adamw")),
)
