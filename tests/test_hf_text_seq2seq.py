"""A Hugging Face text sequence-to-sequence config (T5: an encoder and a decoder over token ids) is built with its
decoder's inputs, and its estimate is the real CPU step's (PyTorch's profiler)."""

from __future__ import annotations

import pytest

from engine.config.train_config import TrainConfig
from engine.measure.cpu_profiler import measure_cpu
from engine.models.hf_source import HFConfigSource
from engine.planning.estimator import estimate

T5_TINY = dict(model_type="t5", vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=4, num_decoder_layers=4,
               num_heads=4, decoder_start_token_id=0, pad_token_id=0)


def test_a_t5_config_is_a_text_seq2seq_model_with_decoder_inputs() -> None:
    src = HFConfigSource(dict(T5_TINY), "t5-tiny", "test")
    assert src.task == "text-seq2seq" and src.family == "text"
    assert set(src.inputs(TrainConfig(batch_size=2, seq_len=16))) == {"input_ids", "labels"}
    assert set(src.inputs(TrainConfig(batch_size=2, seq_len=16, mode="inference"))) == {"input_ids",
                                                                                        "decoder_input_ids"}


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_t5_estimate_is_the_real_cpu_step(mode: str) -> None:
    src = HFConfigSource(dict(T5_TINY), "t5-tiny", "test")
    cfg = TrainConfig(batch_size=2, seq_len=32, optimizer="adamw", device="cpu", mode=mode)
    est = estimate(src, cfg)
    _trace, _info, measured = measure_cpu(src, cfg)
    assert abs(est.peak_bytes - measured) / measured <= 0.01, (est.peak_bytes, measured)


def test_an_image_classifier_whose_image_tower_has_its_own_config_gets_its_inputs() -> None:
    """CLIP's and SigLIP's image size and channels are in their vision_config: reading them off the top-level config
    was an AttributeError, a traceback on the command line."""
    src = HFConfigSource({"model_type": "clip", "vision_config": {"image_size": 64, "patch_size": 16}}, "clip",
                         "test")
    assert src.task == "image-classification"
    x = src.inputs(TrainConfig(batch_size=2))
    assert tuple(x["pixel_values"].shape) == (2, 3, 64, 64)

