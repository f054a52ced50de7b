"""A Hugging Face config.json whose fields the engine cannot build from: one line naming the field, exit 2,
answered at once (transformers, huggingface_hub and torch raised tracebacks; 1,000,000 layers ran for minutes)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from engine.core.errors import UserError
from engine.models.hf_fields import MAX_LAYERS, SIZES, check_hf_fields
from engine.models.hf_source import HFConfigSource
from main import main

TINY_LLAMA: dict[str, Any] = dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=128)
TINY_GPT2: dict[str, Any] = dict(model_type="gpt2", vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128)


@pytest.mark.parametrize("change, words", [
    ({"hidden_size": -64}, '"hidden_size" is -64; it must be a whole number above 0'),
    ({"hidden_size": 0}, '"hidden_size" is 0'),
    ({"hidden_size": 64.5}, '"hidden_size" is 64.5'),
    ({"hidden_size": "64"}, '"hidden_size" is 64'),
    ({"hidden_size": True}, '"hidden_size" is True'),
    ({"vocab_size": [512]}, '"vocab_size" is [512]'),
    ({"intermediate_size": -1}, '"intermediate_size" is -1'),
    ({"num_attention_heads": 5}, '"num_attention_heads" (5) does not divide "hidden_size" (64)'),
    ({"num_key_value_heads": 0}, '"num_key_value_heads" is 0'),
    ({"num_key_value_heads": 3}, '"num_key_value_heads" (3) does not divide "num_attention_heads" (4)'),
    ({"max_position_embeddings": -1}, '"max_position_embeddings" is -1'),
    ({"num_hidden_layers": 10_000}, f"at most {MAX_LAYERS:,} layers"),
    ({"num_hidden_layers": 1_000_000}, f"at most {MAX_LAYERS:,} layers"),
    ({"num_hidden_layers": 2**70}, '"num_hidden_layers" is 1180591620717411303424'),
])
def test_a_field_the_engine_relies_on_is_named(tmp_path, capsys, change, words):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**TINY_LLAMA, **change}))
    assert main(["estimate", str(p), "--seq-len", "8", "--batch-size", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err and words in err, err


@pytest.mark.parametrize("change, words", [
    ({"n_head": 6}, '"n_head" (6) does not divide "n_embd" (64)'),
    ({"n_layer": -2}, '"n_layer" is -2'),
    ({"n_inner": None}, None),  # GPT-2's own default: 4 × n_embd
])
def test_gpt2_names_are_checked_and_its_nulls_kept(change, words):
    if words is None:
        HFConfigSource({**TINY_GPT2, **change}, "g", "g")
        return
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        HFConfigSource({**TINY_GPT2, **change}, "g", "g")


def test_zero_experts_and_more_experts_per_token_than_there_are():
    for change, words in (({"num_local_experts": 0}, '"num_local_experts" is 0'),
                          ({"num_local_experts": 2, "num_experts_per_tok": 4}, "more than the 2 experts")):
        with pytest.raises(UserError, match=words):
            check_hf_fields({**TINY_LLAMA, "model_type": "mixtral", **change}, "m")


def test_a_nested_text_config_is_checked_too():
    with pytest.raises(UserError, match='"text_config.hidden_size" is -1'):
        check_hf_fields({"model_type": "llava", "text_config": {**TINY_LLAMA, "hidden_size": -1}}, "v")


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(SIZES), st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                                         st.text(max_size=3), st.lists(st.integers(), max_size=2)),
                       max_size=6))
def test_any_values_are_taken_or_named_in_one_line(fields):
    try:
        check_hf_fields({**TINY_LLAMA, **fields}, "c.json")
    except UserError as e:
        assert str(e).startswith("'c.json': \"") and "\n" not in str(e)
