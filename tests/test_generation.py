"""Generation (--mode generate): prefill and decode with the model's own KV cache, traced on fake tensors and checked
against a real CPU run of the same loop; the skipped decode steps change nothing; max-context and max-batch."""

from __future__ import annotations

import json

import pytest

import main as entry
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.models.hf_source import HFConfigSource
from engine.planning.estimator import estimate
from engine.planning.planner import max_batch, max_context
from engine.trace import text_generation as generation
from engine.trace.text_generation import generation_figures
from engine.trace.tracer import trace_model

pytest.importorskip("transformers")

TINY = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _src(**extra) -> HFConfigSource:
    return HFConfigSource({**TINY, **extra}, "tiny-llama", "test")


def _cfg(**kw) -> TrainConfig:
    base = dict(batch_size=2, device="cpu", mode="generate", prompt_len=12, new_tokens=40)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("cache, shape, program", [
    ("dynamic", {}, "generate"), ("static", {}, "generate"), ("dynamic", {"num_key_value_heads": 1}, "generate"),
    ("dynamic", {"model_type": "mistral", "sliding_window": 8}, "generate"),
    ("dynamic", {}, "loop"), ("static", {}, "loop"),
], ids=["gqa-dynamic", "gqa-static", "mqa-dynamic", "sliding-window-dynamic", "gqa-dynamic-loop",
        "gqa-static-loop"])
def test_prefill_and_last_token_peaks_equal_a_real_cpu_run(cache, shape, program):
    src, cfg = _src(**shape), _cfg(cache=cache, new_tokens=10, generate_program=program)
    traced, _ = trace_model(src, cfg)
    real, _, real_peak = measure_cpu(src, cfg)
    a, b = generation_figures(traced, cfg), generation_figures(real, cfg)
    assert a.prefill_peak_bytes == b.prefill_peak_bytes
    assert a.decode_peak_bytes == b.decode_peak_bytes
    assert estimate(src, cfg).peak_bytes == real_peak
    assert a.decode_steps_traced == (1, 2, 9)  # the steps between were skipped on fake tensors
    assert b.decode_steps_traced == tuple(range(1, 10))  # the real run runs them all


def test_skipping_decode_steps_changes_nothing(monkeypatch):
    src, cfg = _src(), _cfg(new_tokens=12)
    fast = generation_figures(trace_model(src, cfg)[0], cfg)
    monkeypatch.setattr(generation, "TRACED_DECODE_STEPS", 100)
    full = generation_figures(trace_model(src, cfg)[0], cfg)
    assert full.decode_steps_traced == tuple(range(1, 12)) and fast.decode_steps_traced == (1, 2, 11)
    assert (fast.prefill_peak_bytes, fast.decode_peak_bytes, fast.kv_cache_bytes) == \
        (full.prefill_peak_bytes, full.decode_peak_bytes, full.kv_cache_bytes)


@pytest.mark.parametrize("cache, program, length", [
    ("dynamic", "generate", 12 + 40 - 1), ("static", "generate", 12 + 40 - 1),  # generate(): max_length - 1
    ("dynamic", "loop", 12 + 40 - 1), ("static", "loop", 12 + 40),
])
def test_kv_cache_bytes_follow_the_config(cache, program, length):
    # keys and values, per layer: batch x kv heads x tokens x head dim, fp32
    est = estimate(_src(), _cfg(cache=cache, generate_program=program))
    g = est.generation
    assert g.kv_cache_bytes == 2 * 2 * 2 * 2 * length * (64 // 4) * 4
    assert g.prompt_len == 12 and g.new_tokens == 40
    assert est.timeline[-1].by_category["kv_cache"] == g.kv_cache_bytes


def test_grouped_query_attention_shrinks_the_cache():
    gqa = estimate(_src(), _cfg()).generation.kv_cache_bytes
    mha = estimate(_src(num_key_value_heads=4), _cfg()).generation.kv_cache_bytes
    assert mha == 2 * gqa


def test_generation_needs_a_causal_lm():
    with pytest.raises(UserError, match="needs a causal language model"):
        HFConfigSource(dict(model_type="vit", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, image_size=32, patch_size=16), "v", "v").inputs(_cfg())
    with pytest.raises(UserError, match="unknown KV cache 'paged'"):
        _cfg(cache="paged")


def test_cli_generate_json_and_summary(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    args = ["estimate", str(p), "--mode", "generate", "--prompt-len", "12", "--new-tokens", "20", "--device", "cpu"]
    assert entry.main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["extra"]["generation"]["decode_steps_traced"] == [1, 2, 19] and d["breakdown_at_peak"]["kv_cache"] > 0
    assert entry.main(args) == 0
    out = capsys.readouterr().out
    assert "Prefill" in out and "at the last token" in out and "kv_cache" in out


def test_cli_mistakes_are_one_line(capsys):
    for argv in (["estimate", "vit-l16", "--mode", "generate"],
                 ["estimate", "llama-3.2-1b", "--mode", "generate", "--new-tokens", "0"],
                 ["max-context", "llama-3.2-1b", "--mode", "generate"]):
        assert entry.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_max_context_is_the_longest_prompt_that_fits():
    src, cfg = _src(), _cfg(batch_size=1, new_tokens=8)
    budget = estimate(src, cfg.with_(prompt_len=300)).peak_bytes
    r = max_context(src, cfg, budget, limit=512)
    assert estimate(src, cfg.with_(prompt_len=r.length)).peak_bytes <= budget
    assert r.peak_next is not None and r.peak_next > budget
    assert r.context_tokens == r.length + 8


def test_max_context_stops_at_the_models_positions():
    src, cfg = _src(), _cfg(batch_size=1, new_tokens=8)
    r = max_context(src, cfg, 1 << 40, limit=64)
    assert r.length == 56 and r.peak_next is None


def test_max_batch_for_generation():
    src, cfg = _src(), _cfg(new_tokens=6)
    budget = estimate(src, cfg.with_(batch_size=5)).peak_bytes
    r = max_batch(src, cfg, budget)
    assert r.batch_size >= 5 and (r.peak_next is None or r.peak_next > budget)


def test_report_lists_the_generation_figures():
    from report.content import config_rows

    est = estimate(_src(), _cfg(new_tokens=6))
    rows = dict(config_rows(est))
    assert rows["Mode"] == "generation" and "6 new tokens, dynamic KV cache" in rows["Generation"]
    assert rows["Generation program"] == "model.generate(), greedy"
    assert {"Prefill peak", "Decode peak (last token)", "KV cache at the last token"} <= set(rows)
