"""Offline comparison of generation estimates with the real H200 figures in benchmarks/gpu/h200/llm.json (written
by benchmarks/gpu/measure_llm.py): each "generate" case's small Llama config is estimated again on this machine
(--mode generate, CUDA target) and its prefill peak and decode peak (the last token) are compared with
`torch.cuda.max_memory_allocated()` over the real manual loop's prefill and decode (the peak reset between them).

    python -m benchmarks.gpu_generation_compare [benchmarks/gpu/h200/llm.json] [--markdown]

The traced figures are live tensor bytes, each allocation rounded up to 512 bytes as PyTorch's CUDA caching
allocator does (what max_memory_allocated counts), plus the cuBLAS and cuBLASLt workspaces the device model
predicts for the GPU (engine.config.gpus.workspace_allocations: taken at the first matmul, alive from then on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.config.gpus import find_gpu, workspace_allocations
from engine.config.train_config import TrainConfig
from engine.models.hf_source import HFConfigSource
from engine.trace.tracer import trace_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "benchmarks" / "gpu" / "h200" / "llm.json"
MIB = 1 << 20
PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def _rounded(n: int) -> int:
    sign = -1 if n < 0 else 1
    return sign * (-(-abs(n) // 512) * 512)


def phase_peaks(trace) -> tuple[int, int]:
    """(prefill peak, decode peak at the last token) of a traced generation, in 512-byte blocks."""
    last = max(e.step for e in trace.events if e.phase == "decode")
    running = prefill = decode = 0
    for e in trace.events:
        running += _rounded(e.nbytes)
        if e.phase == "prefill":
            prefill = max(prefill, running)
        elif e.phase == "decode" and e.step == last:
            decode = max(decode, running)
    return prefill, decode


def compare(path: Path) -> list[dict]:
    rows = []
    for c in json.loads(path.read_text(encoding="utf-8")):
        if c.get("kind") != "generate" or "prefill_peak" not in c:
            continue  # the static-cache case measured generate() alone, not the manual loop
        s = c["settings"]
        src = HFConfigSource({"model_type": "llama", **s["config"]}, c["case"], "llm.json")
        cfg = TrainConfig(mode="generate", batch_size=s["batch"], prompt_len=s["prompt"], new_tokens=s["new"],
                          cache=s["cache"], precision=PRECISION[s["dtype"]], device="cuda", gpu="H200",
                          generate_program="loop")  # the figures compared are the manual loop's
        trace, _info = trace_model(src, cfg)
        prefill, decode = phase_peaks(trace)
        ws = sum(workspace_allocations(find_gpu("H200").compute_capability, training=False))
        prefill, decode = prefill + ws, decode + ws
        rows.append({"case": c["case"], "prefill": (prefill, c["prefill_peak"]), "decode": (decode, c["decode_peak"]),
                     "transformers": c.get("transformers"), "torch": c.get("torch")})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows = compare(Path(args.path))
    if args.markdown:
        print("| case | prefill est (MiB) | prefill real (MiB) | error "
              "| decode est (MiB) | decode real (MiB) | error |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = [r["case"]]
        for k in ("prefill", "decode"):
            est, real = r[k]
            cells += [f"{est / MIB:.1f}", f"{real / MIB:.1f}", f"{100 * (est - real) / real:+.2f} %"]
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
