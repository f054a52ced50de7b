"""Offline comparison of the LLM workloads of issue 10 with real H200 figures: every case of
benchmarks/gpu/h200/llm.json (written by benchmarks/gpu/measure_llm.py) is estimated again on this machine from its
recorded Hugging Face config (written to a temporary config.json, read by the HF-config source) for the CUDA target
'H200', with the case's settings, and compared with what the GPU measured.

    python -m benchmarks.gpu_llm_compare [benchmarks/gpu/h200/llm.json] [--case SUBSTRING]

What each real figure is (measure_llm.py; `torch.cuda.memory_allocated` / `max_memory_allocated`, 512-byte blocks):
- generation, manual loop: `prefill_peak` is the peak of `model(prompt, use_cache=True)` (weights, the prompt's ids,
  the cuBLAS workspace taken at the first matmul, the cache, full-prompt logits); `decode_peak` the peak over the
  decode steps (the last one's, the cache only grows); `after_prefill` - `weights` is the workspace + the KV cache
  + the ids and the next token, so the real cache after the prefill is that less the workspace the device model
  predicts and the ids. `generate_peak` is `model.generate()` from a fresh peak: generate passes
  `logits_to_keep=1` (no full-prompt logits) and, with a static cache, compiles the decode step (CUDA graphs):
  neither is what the engine's manual loop traces, so it is shown beside the engine's peak, not scored.
- LoRA/QLoRA: `peak` is max_memory_allocated over two training steps with the weights already resident (an
  absolute peak); `base_weights` and `with_adapters` - `base_weights` are the resident bytes before and after
  peft wrapped the model.

Each estimate's figure is the device model's predicted max_memory_allocated (engine.cuda.device_model): traced bytes in
512-byte blocks plus the cuBLAS/cuBLASLt workspaces; for generation the prefill and last-token decode peaks are read
from the trace the same way (benchmarks.gpu_generation_compare's rule).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.config.train_config import TrainConfig
from engine.core.errors import UserError
from engine.cuda.allocator_replay import replay
from engine.cuda.device_model import device_detail
from engine.models.hf_source import HFConfigSource
from engine.trace.summary import summarise
from engine.trace.tracer import trace_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "benchmarks" / "gpu" / "h200" / "llm.json"
GPU = "H200"
MIB = 1 << 20
NOT_YET = "not estimable on main yet"


def _source(config: dict, tmp: Path, name: str) -> HFConfigSource:
    """The recorded config (transformers' to_dict of the run) as a config.json the HF-config source reads."""
    folder = tmp / name.replace(" ", "_")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return HFConfigSource.from_path(folder)


def _config(options: dict) -> TrainConfig | str:
    """The engine's configuration for these options, or why this engine cannot express them."""
    try:
        cfg = TrainConfig.from_options(options)
    except UserError as e:
        return f"{NOT_YET} ({e})"
    missing = sorted(set(options) - set(cfg.to_json()))
    if missing:
        return f"{NOT_YET} (no option {', '.join(missing)})"
    return cfg


def _replay(src: HFConfigSource, cfg: TrainConfig):
    """The trace of cfg's run and the engine's caching-allocator replay of it for the H200 (workspaces included):
    what the engine predicts torch.cuda.memory_allocated() is after every event."""
    trace, info = trace_model(src, cfg)
    est = summarise(trace, info, cfg)
    detail = device_detail(trace, est, cfg)
    return trace, est, detail.replay.allocated, detail.figures.workspace_bytes


def _weights_index(trace) -> int:
    """The event after which the model's weights (and adapters) are resident, before anything of the step."""
    return max(i for i, e in enumerate(trace.events)
               if e.phase == "setup" and e.category in ("parameters", "buffers", "adapter_weights"))


def _measured_workspace(cases: list[dict]) -> int | None:
    """The cuBLAS workspace the H200 run took at its first matmul: allocated after the first fp32 matmul of the
    context stages less the 1024x1024 fp32 operand and what was there before."""
    for c in cases:
        if c["kind"] == "context" and "stages" in c:
            by = {st["stage"]: st["allocated"] for st in c["stages"]}
            return by["first fp32 matmul (cuBLAS)"] - by["context (first tensor)"] - 4 * MIB
    return None


def _generation(case: dict, src: HFConfigSource, ws_real: int | None) -> dict:
    s = case["settings"]
    cfg = _config({"mode": "generate", "batch_size": s["batch"], "prompt_len": s["prompt"],
                   "new_tokens": s["new"], "cache": s["cache"], "precision": s["dtype"], "device": "cuda",
                   "gpu": GPU, "generate_program": "loop"})  # the H200's prefill and decode peaks are the loop's
    if isinstance(cfg, str):
        return {"missing": cfg}
    trace, _est, alloc, ws = _replay(src, cfg)
    ev = trace.events
    last = max(e.step for e in ev if e.phase == "decode")
    pre = [i for i, e in enumerate(ev) if e.phase == "prefill"]
    dec = [i for i, e in enumerate(ev) if e.phase == "decode" and e.step == last]
    kv_prefill = sum(e.nbytes for e in ev[:pre[-1] + 1] if e.category == "kv_cache")
    kv_end = sum(e.nbytes for e in ev[:dec[-1] + 1] if e.category == "kv_cache")
    prefill, decode = max(alloc[i] for i in pre), max(alloc[i] for i in dec)
    w = alloc[_weights_index(trace)]
    out: dict = {"weights": (w, case["weights"]), "kv_cache": (kv_prefill, kv_end), "workspace": ws}
    if "prefill_peak" in case:
        out["prefill"] = (prefill, case["prefill_peak"])
        out["decode"] = (decode, case["decode_peak"])
        out["after_prefill"] = (alloc[pre[-1]], case["after_prefill"])
        out["after_decode"] = (alloc[dec[-1]], case["after_decode"])
        if ws_real is not None:
            ids, nxt = _blocks(s["batch"] * s["prompt"] * 8), _blocks(s["batch"] * 8)
            # the cache as the allocator holds it (block tails included), the engine's and the real run's
            # workspace taken off each side
            out["kv_prefill"] = (alloc[pre[-1]] - w - ws - ids - nxt,
                                 case["after_prefill"] - case["weights"] - ws_real - ids - nxt)
            out["kv_decode"] = (alloc[dec[-1]] - w - ws - ids - nxt,
                                case["after_decode"] - case["weights"] - ws_real - ids - nxt)
    out["generate"] = (max(prefill, decode), case["generate_peak"])
    return out


def _blocks(n: int) -> int:
    return -(-n // 512) * 512


def _finetune(case: dict, src: HFConfigSource) -> dict:
    s = case["settings"]
    targets = s["targets"] if isinstance(s["targets"], str) else ",".join(s["targets"])
    precision = "bf16" if case["kind"] == "qlora" else ("amp-bf16" if s.get("amp") else s["dtype"])
    options = {"batch_size": s["batch"], "seq_len": s["seq"], "precision": precision, "optimizer": "adamw",
               "peft": case["kind"], "lora_rank": s["rank"], "lora_alpha": s["alpha"], "lora_targets": targets,
               "device": "cuda", "gpu": GPU}
    if case["kind"] == "qlora":
        options["weights"] = s["quant"]
    cfg = _config(options)
    if isinstance(cfg, str):
        return {"missing": cfg}
    trace, est, alloc, _ws = _replay(src, cfg)
    ev = trace.events
    w = _weights_index(trace)
    # the base alone as the allocator holds it (the real run moved it to the GPU before peft added adapters)
    base = replay([e for e in ev[:w + 1] if e.category in ("parameters", "buffers")]).allocated[-1]
    adapters = alloc[w] - base
    step_peak = max(alloc[i] for i, e in enumerate(ev) if e.phase != "setup")
    return {"peak": (step_peak, case["peak"]),
            "resident": (alloc[w], case["before_steps"]),
            "weights": (base, case["base_weights"]),
            "adapters": (adapters, case["with_adapters"] - case["base_weights"]),
            "trainable": (est.trainable_parameters, case["trainable_params"])}


def compare(path: Path, only: str | None = None) -> list[dict]:
    rows = []
    cases = json.loads(path.read_text(encoding="utf-8"))
    ws_real = _measured_workspace(cases)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            if case["kind"] not in ("generate", "lora", "qlora") or (only and only not in case["case"]):
                continue
            if "error" in case:
                rows.append({"case": case["case"], "kind": case["kind"], "missing": f"no real run ({case['error']})"})
                continue
            t0 = time.perf_counter()
            src = _source(case["config"], Path(tmp), case["case"])
            got = _generation(case, src, ws_real) if case["kind"] == "generate" else _finetune(case, src)
            rows.append({"case": case["case"], "kind": case["kind"], "seconds": time.perf_counter() - t0, **got})
    return rows


def _pct(pair: tuple[int, int]) -> float:
    est, real = pair
    return 100.0 * (est - real) / real


def _cell(pair: tuple[int, int] | None) -> str:
    if pair is None:
        return "—"
    return f"{pair[0] / MIB:.1f} / {pair[1] / MIB:.1f} ({_pct(pair):+.1f} %)"


SCORED = ("prefill", "decode", "peak")  # the peaks that count in the median/max (generate() is not the same loop)


def _lines(rows: list[dict]) -> list[str]:
    out = ["| case | figure | estimate / real MiB (error) |", "|---|---|---:|"]
    labels = {"prefill": "prefill peak (max_memory_allocated)", "decode": "decode peak, last token",
              "after_prefill": "allocated after the prefill (weights, workspace, ids, cache, next token)",
              "after_decode": "allocated after the last token",
              "kv_prefill": "KV cache after the prefill, as allocated (after_prefill − weights − workspace − ids)",
              "kv_decode": "KV cache after the last token, as allocated (after_decode − weights − workspace − ids)",
              "generate": "generate() peak (engine: its manual loop's peak; not scored)",
              "peak": "training-step peak (max_memory_allocated)",
              "resident": "allocated before the steps (base + adapters)", "weights": "base weights (resident)",
              "adapters": "LoRA adapters (resident)"}
    for r in rows:
        if "missing" in r:
            out.append(f"| {r['case']} | — | {r['missing']} |")
            continue
        for key, label in labels.items():
            if key in r:
                out.append(f"| {r['case']} | {label} | {_cell(r[key])} |")
        if "kv_cache" in r:
            a, b = r["kv_cache"]
            out.append(f"| {r['case']} | engine's kv_cache category after prefill / at the end (tensor bytes) | "
                       f"{a / MIB:.2f} / {b / MIB:.2f} |")
        if "trainable" in r:
            est, real = r["trainable"]
            out.append(f"| {r['case']} | trainable parameters | {est:,} / {real:,} |")
    scored = [abs(_pct(r[k])) for r in rows for k in SCORED if k in r]
    if scored:
        out.append("")
        out.append(f"Peaks scored: {len(scored)}; |error| median {statistics.median(scored):.1f} %, "
                   f"max {max(scored):.1f} %.")
    missing = [r["case"] for r in rows if "missing" in r]
    if missing:
        out.append(f"Not compared: {len(missing)} case(s): {'; '.join(missing)}.")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--case", help="only cases whose name contains this")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = compare(Path(args.path), args.case)
    print("\n".join(_lines(rows)))
    print(f"({time.perf_counter() - t0:.0f} s on this machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
