"""Generation's two programs on held-out models: the estimate of `model.generate()` and of the hand-written loop,
each against a real CPU run of that program (engine.measure.cpu_profiler.measure_cpu runs `model.generate()` itself,
every token generated), and the loop's estimate against generate()'s real peak (what the estimate said before
generate() was modelled).
    python -m benchmarks.generate_programs [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import gc

from engine.config.train_config import TrainConfig
from engine.core.units import format_bytes
from engine.measure.cpu_profiler import measure_cpu
from engine.models.hf_source import HFConfigSource
from engine.planning.estimator import estimate

QWEN3 = dict(model_type="qwen3", vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
             tie_word_embeddings=True)
MISTRAL = dict(model_type="mistral", vocab_size=32000, hidden_size=256, intermediate_size=896, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024, sliding_window=128)

CASES: list[tuple[str, dict[str, object], dict[str, object]]] = [
    ("qwen3 greedy", QWEN3, {}),
    ("qwen3 static cache", QWEN3, {"cache": "static"}),
    ("qwen3 top-k 50 top-p 0.9", QWEN3, {"do_sample": True, "top_k": 50, "top_p": 0.9}),
    ("mistral sliding window 128, greedy", MISTRAL, {}),
    ("mistral sliding window 128, static cache", MISTRAL, {"cache": "static"}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    print("| case | program | estimate | real | error | loop's estimate vs generate()'s real |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, fields, kw in CASES:
        if args.only not in name:
            continue
        src = HFConfigSource(dict(fields), name.split()[0], "benchmark")
        peaks: dict[str, tuple[int, int]] = {}
        for program in ("generate", "loop"):
            if program == "loop" and "do_sample" in kw:
                continue
            cfg = TrainConfig(batch_size=2, device="cpu", mode="generate", prompt_len=256, new_tokens=32,
                              generate_program=program, **kw)  # type: ignore[arg-type]
            est = estimate(src, cfg).peak_bytes
            gc.collect()
            real = measure_cpu(src, cfg)[2]
            gc.collect()
            peaks[program] = (est, real)
        for program, (est, real) in peaks.items():
            old = ""
            if program == "loop":
                old = f"{100 * (est / peaks['generate'][1] - 1):+.1f} %"
            print(f"| {name} | {program} | {format_bytes(est)} | {format_bytes(real)} | "
                  f"{100 * (est / real - 1):+.3f} % ({est - real:+,} B) | {old} |", flush=True)


if __name__ == "__main__":
    main()
