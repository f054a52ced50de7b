"""A Hugging Face model is checkpointed as transformers does it (engine.trace.checkpointing): its decoder layers,
non-reentrant, trained without the KV cache. Wrapping the layers ourselves kept the cache on: the backward's
recompute wrote it a second time, and a Mistral's sliding-window cache then no longer matched its mask (the estimate
failed in the last layer's attention). The estimate equals a real CPU run of the same checkpointed step."""

from __future__ import annotations

from typing import Any

from engine.config.train_config import TrainConfig
from engine.measure.cpu_profiler import measure_cpu
from engine.models.hf_source import HFConfigSource
from engine.planning.estimator import estimate
from engine.trace.checkpointing import apply_checkpointing

MISTRAL: dict[str, Any] = dict(model_type="mistral", vocab_size=288, hidden_size=64, intermediate_size=112,
                               num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                               sliding_window=6, num_hidden_layers=3)


def _source() -> HFConfigSource:
    return HFConfigSource(dict(MISTRAL), "mistral", "test")


def test_its_layers_are_checkpointed_by_transformers():
    cfg = TrainConfig(batch_size=2, seq_len=16, checkpointing=True, device="cpu")
    model, _ = _source().build(cfg)
    assert apply_checkpointing(model) == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert all(layer.gradient_checkpointing for layer in model.model.layers)


def test_a_sliding_window_model_checkpointed_matches_a_real_run():
    """Within the CPU zoo's 1 % (this one: +0.69 %, the same with the layers wrapped by hand and the cache off)."""
    cfg = TrainConfig(batch_size=4, seq_len=128, checkpointing=True, optimizer="adamw", device="cpu")
    est = estimate(_source(), cfg)  # failed: "keys 21 vs mask 16" in the last layer's attention
    _trace, _info, measured = measure_cpu(_source(), cfg)
    assert abs(est.peak_bytes - measured) / measured <= 0.01, (est.peak_bytes, measured)
    assert est.peak_bytes < estimate(_source(), cfg.with_(checkpointing=False)).peak_bytes / 2
    assert est.checkpointed == ("model.layers.0", "model.layers.1", "model.layers.2")
