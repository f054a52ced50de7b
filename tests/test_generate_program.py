"""`model.generate()` as the generation mode's default program (engine.trace.generate_program), against real CPU runs of
`model.generate()` itself on small Qwen3 and Mistral models no other test builds: greedy, a static cache, a sliding
window, sampling with top-k / top-p; the hand-written loop stays as an option, exact as before."""

from __future__ import annotations

import json

import pytest

import main as entry
from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.measure.cpu_profiler import measure_cpu
from engine.models.hf_source import HFConfigSource
from engine.planning.estimator import estimate
from engine.trace.text_generation import generation_figures
from engine.trace.tracer import trace_model

pytest.importorskip("transformers")

QWEN3 = dict(model_type="qwen3", vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
             eos_token_id=7, pad_token_id=5)
MISTRAL = dict(model_type="mistral", vocab_size=288, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256, sliding_window=6)


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(batch_size=2, device="cpu", mode="generate", prompt_len=10, new_tokens=9), **kw})


@pytest.mark.parametrize("fields, kw", [
    (QWEN3, {}),
    (QWEN3, {"cache": "static"}),
    (MISTRAL, {}),  # its sliding window (6) is shorter than the prompt
    ({**MISTRAL, "eos_token_id": None}, {"cache": "static"}),
    (QWEN3, {"do_sample": True, "top_k": 40, "top_p": 0.9}),
    (MISTRAL, {"generate_program": "loop"}),
    (QWEN3, {"generate_program": "loop", "cache": "static"}),
], ids=["qwen3-greedy", "qwen3-static", "mistral-sliding-window", "mistral-no-eos-static", "qwen3-top-k-top-p",
        "mistral-loop", "qwen3-loop-static"])
def test_the_estimate_is_a_real_cpu_run_of_the_program_to_the_byte(fields, kw):
    src, cfg = HFConfigSource(dict(fields), str(fields["model_type"]), "test"), _cfg(**kw)
    traced, _ = trace_model(src, cfg)
    real, _, real_peak = measure_cpu(src, cfg)  # generate() itself, every token generated, for "generate"
    a, b = generation_figures(traced, cfg), generation_figures(real, cfg)
    assert (a.prefill_peak_bytes, a.decode_peak_bytes) == (b.prefill_peak_bytes, b.decode_peak_bytes)
    assert estimate(src, cfg).peak_bytes == real_peak
    assert a.decode_steps_traced == (1, 2, 8) and b.decode_steps_traced == tuple(range(1, 9))
    assert a.program == cfg.generate_program


def test_generate_keeps_only_the_last_positions_logits_in_the_prefill():
    # The loop's prefill makes logits for every prompt position; generate() asks for the last one only
    # (logits_to_keep=1) and copies them to fp32: with a large vocabulary its prefill peak is far lower.
    fields = {**QWEN3, "vocab_size": 8192}
    src = HFConfigSource(fields, "qwen3", "test")
    gen = estimate(src, _cfg(prompt_len=64)).generation
    loop = estimate(src, _cfg(prompt_len=64, generate_program="loop")).generation
    assert gen.program == "generate" and loop.program == "loop"
    all_logits = 2 * 64 * 8192 * 4  # batch x prompt x vocab, fp32: 4 MiB of the loop's prefill peak
    assert loop.prefill_peak_bytes - gen.prefill_peak_bytes > 0.9 * all_logits
    # generate()'s static cache holds prompt + new tokens - 1 positions (its max_length - 1), the loop's one more
    static = estimate(src, _cfg(cache="static")).generation.kv_cache_bytes
    assert static == 2 * 2 * 2 * 2 * (10 + 9 - 1) * 16 * 4


def test_the_program_is_a_choice_of_the_config():
    assert TrainConfig().generate_program == "generate"
    assert TrainConfig.from_json(_cfg(generate_program="loop").to_json()).generate_program == "loop"
    with pytest.raises(UserError, match="unknown generation program 'loops'.*did you mean 'loop'"):
        _cfg(generate_program="loops")
    with pytest.raises(UserError, match="top-p must be a number in \\(0, 1\\]"):
        _cfg(do_sample=True, top_p=1.5)


def test_cli_names_the_program(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(QWEN3))
    args = ["estimate", str(p), "--mode", "generate", "--prompt-len", "8", "--new-tokens", "6", "--device", "cpu"]
    assert entry.main([*args, "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["extra"]["generation"]
    assert (g["program"], g["decoding"]) == ("generate", "greedy")
    assert entry.main([*args, "--do-sample", "--top-k", "20"]) == 0
    assert "Program     model.generate(), sampling, top-k 20" in capsys.readouterr().out
    assert entry.main([*args, "--generate-program", "loop"]) == 0
    assert "Program     a hand-written prefill-then-decode loop" in capsys.readouterr().out
    for bad in ([*args, "--top-k", "20"], [*args, "--generate-program", "loops"]):
        assert entry.main(bad) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_report_names_the_program():
    from report.content import config_rows

    rows = dict(config_rows(estimate(HFConfigSource(dict(MISTRAL), "mistral", "test"), _cfg(new_tokens=4))))
    assert rows["Generation program"] == "model.generate(), greedy"


def test_a_sketch_file_keeps_its_generation_program(tmp_path):
    from engine.sketch.document import Sketch

    sk = Sketch("lm")
    cfg = _cfg(generate_program="loop")
    sk.training = cfg.to_json()
    back = Sketch.load(sk.save(tmp_path / "lm.json"))
    assert back.training is not None and TrainConfig.from_json(back.training) == cfg
    sampled = _cfg(do_sample=True, top_k=40, top_p=0.95)
    sk.training = sampled.to_json()
    assert TrainConfig.from_json(Sketch.load(sk.save(tmp_path / "lm.json")).training or {}) == sampled
