"""Speed and scale of the estimator, on this machine.

    python -m benchmarks.speed            # prints and appends a section to benchmarks/RESULTS.md

- a 100-layer model of the kind the builder makes (Linear/LayerNorm/GELU blocks), CUDA target: estimate time;
- llama-70b (AdamW, fp32, batch 1, seq 2048): peak host memory of the whole estimate (in a child process).
The MemTracker comparison on llama-7b is benchmarks/memtracker_compare.py.

    python -m benchmarks.speed --depth    # only the depth section (issue 24), its own part of RESULTS.md

The depth section (depth-independent tracing, engine.trace.folded_trace), measured as ratios in one run, one process
(warm: imports and fake-tensor caches paid first):
- the same Llama-shaped model (the llama templates' code, 7B widths, seq 2048, AdamW, A100 target) at 80 layers
  and at 4 layers (target: at most 1.5×), and the 80 layers traced in full (--full-trace);
- llama-70b against llama-7b (the templates, same settings);
- MemTracker on llama-7b against our estimate (benchmarks/memtracker_compare.py's runs; target: at most 1/20);
- llama-3.1-8b under QLoRA (rank 16, bf16, paged AdamW 8-bit, A100 target), folded and in full.
Each figure is the median of `repeats` runs (5), the two sides of a ratio estimated in turn (`alternating`: a shared
machine's load weighs on both alike); the folded and full estimates' peaks are checked equal.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from engine.config.train_config import TrainConfig
from engine.models.source import ModelSource
from engine.planning.estimator import estimate

from .zoo_models import FunctionSource

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- speed:begin -->", "<!-- speed:end -->"


def hundred_layers(cfg):
    layers = []
    for _ in range(25):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers), torch.randn(cfg.batch_size, 512)


def builder_model_time(repeats: int = 5) -> float:
    src = FunctionSource("100 layers", hundred_layers)
    cfg = TrainConfig(batch_size=32, optimizer="adam")
    estimate(src, cfg)  # warm-up: imports and fake-tensor caches, as in a running app
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        estimate(src, cfg)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def llama70b_host_memory() -> tuple[float, float]:
    code = (
        "import time,resource; from engine.config.train_config import TrainConfig;"
        " from engine.planning.estimator import estimate;"
        "t=time.perf_counter(); e=estimate('llama-70b', TrainConfig(optimizer='adamw', seq_len=2048));"
        "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024, e.peak_bytes)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    return float(out[0]), int(out[1])


DEPTH_BEGIN, DEPTH_END = "<!-- speed-depth:begin -->", "<!-- speed-depth:end -->"


def llama_shaped(layers: int) -> FunctionSource:
    from engine.models.templates.inputs import token_ids
    from engine.models.templates.llama import LLAMA2_7B, LlamaForCausalLM

    c = replace(LLAMA2_7B, layers=layers)

    def build(cfg: TrainConfig):
        ids = token_ids(cfg.batch_size, 2048, c.vocab_size)
        return LlamaForCausalLM(c), {"input_ids": ids, "labels": ids}

    return FunctionSource(f"llama-shaped {layers} layers", build)


def timed(source, cfg: TrainConfig, repeats: int) -> tuple[float, int]:
    """(median seconds of `repeats` estimates, the peak)."""
    times, peak = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        peak = estimate(source, cfg).peak_bytes
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], peak


def alternating(a: ModelSource | str, b: ModelSource | str, cfg: TrainConfig, repeats: int
                ) -> tuple[float, float, int]:
    """(median seconds of `a`'s estimate, of `b`'s, `b`'s peak): the two estimated in turn, each warmed first, so
    that a shared machine's load weighs on both alike (their ratio is the figure)."""
    estimate(a, cfg)  # warm: each side's shapes in the fake-tensor cache
    estimate(b, cfg)
    ta, tb, peak = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        estimate(a, cfg)
        t1 = time.perf_counter()
        peak = estimate(b, cfg).peak_bytes
        ta.append(t1 - t0)
        tb.append(time.perf_counter() - t1)
    return sorted(ta)[len(ta) // 2], sorted(tb)[len(tb) // 2], peak


def depth_figures(repeats: int = 5) -> list[tuple[str, str]]:
    from .memtracker_compare import memtracker_peak

    cfg = TrainConfig(batch_size=1, optimizer="adamw", gpu="A100 80GB")
    estimate(llama_shaped(2), cfg)  # warm-up
    rows: list[tuple[str, str]] = []
    t4, t80, p80 = alternating(llama_shaped(4), llama_shaped(80), cfg, repeats)
    t80_full, p80_full = timed(llama_shaped(80), cfg.with_(full_trace=True), 1)
    assert p80 == p80_full, (p80, p80_full)
    fold = estimate(llama_shaped(80), cfg).trace_fold
    assert fold is not None and fold.folded
    rows += [("Llama-shaped (7B widths), 4 layers: estimate", f"{t4:.2f} s"),
             (f"the same at 80 layers (folded: {fold.traced_blocks} blocks traced)", f"{t80:.2f} s"),
             ("**80 layers / 4 layers** (target ≤ 1.5×)", f"**{t80 / t4:.1f}×**"),
             ("the same at 80 layers, --full-trace (one run)", f"{t80_full:.2f} s"),
             ("80 layers: full trace / folded", f"{t80_full / t80:.1f}×")]
    t7, t70, _ = alternating("llama-7b", "llama-70b", cfg.with_(seq_len=2048), repeats)
    rows += [("llama-7b estimate (32 layers)", f"{t7:.2f} s"), ("llama-70b estimate (80 layers)", f"{t70:.2f} s"),
             ("**llama-70b / llama-7b**", f"**{t70 / t7:.2f}×**")]
    mcfg = TrainConfig(batch_size=1, seq_len=2048, optimizer="adamw", device="cpu")  # memtracker_compare's step
    estimate("llama-7b", mcfg)  # warm-up, as for the others: a CPU target's first estimate in a process is slower
    tours, pours = timed("llama-7b", mcfg, repeats)
    pmt, tmt = memtracker_peak("llama-7b", mcfg)
    rows += [("llama-7b, CPU target, fp32 AdamW: our estimate", f"{tours:.1f} s (peak {pours:,} B)"),
             ("the same step under PyTorch's MemTracker", f"{tmt:.1f} s (peak {pmt:,} B)"),
             ("**ours / MemTracker** (target ≤ 1/20 = 0.05)", f"**{tours / tmt:.3f}** (1/{tmt / tours:.0f})")]
    qcfg = TrainConfig(batch_size=1, seq_len=2048, peft="qlora", precision="bf16", optimizer="paged-adamw8bit",
                       gpu="A100 80GB")
    estimate("llama-3.1-8b", qcfg)  # warm-up: peft, bitsandbytes, transformers
    tq, pq = timed("llama-3.1-8b", qcfg, repeats)
    tq_full, pq_full = timed("llama-3.1-8b", qcfg.with_(full_trace=True), 1)
    assert pq == pq_full, (pq, pq_full)
    rows += [("llama-3.1-8b QLoRA (r=16, bf16, paged AdamW 8-bit, seq 2048) estimate, folded", f"{tq:.2f} s"),
             ("the same, --full-trace (one run)", f"{tq_full:.2f} s")]
    return rows


def depth_section(repeats: int = 5) -> str:
    load = os.getloadavg()[0]
    rows = depth_figures(repeats)
    return "\n".join([
        f"Date {dt.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}; "
        f"load average {load:.1f} when it began, {os.getloadavg()[0]:.1f} when it finished: the seconds move with "
        "what else runs on this shared machine; the ratios (measured in one run, one process) are the figures.",
        "",
        "| what | figure |",
        "|---|---:|",
        *[f"| {a} | {b} |" for a, b in rows],
    ])


def write_section(begin: str, end: str, title: str, command: str, text: str) -> None:
    old = RESULTS.read_text() if RESULTS.exists() else "# Measured figures\n"
    block = f"{begin}\n## {title}\n\nCommand: `{command}`.\n\n{text}\n{end}"
    new = (old[: old.index(begin)] + block + old[old.index(end) + len(end):]) if begin in old else \
        old.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(new)


def main() -> int:
    if "--depth" in sys.argv[1:]:
        text = depth_section()
        print(text)
        write_section(DEPTH_BEGIN, DEPTH_END, "Depth-independent tracing (issue 24)", "python -m benchmarks.speed "
                      "--depth", text)
        return 0
    t100 = builder_model_time()
    t70, rss = llama70b_host_memory()
    text = "\n".join([
        f"Date {dt.date.today().isoformat()}, {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}; "
        f"load average {os.getloadavg()[0]:.1f} when it finished (other jobs share the cores).",
        "",
        "| what | figure |",
        "|---|---:|",
        "| 100-layer builder model (25 × Linear/LayerNorm/GELU/Dropout, batch 32, Adam, CUDA target), median of 5 "
        f"| {t100:.2f} s |",
        "| llama-70b estimate (AdamW, fp32, batch 1, seq 2048): peak host memory of the whole process "
        f"| {rss / 1024**3:.2f} GiB |",
        f"| llama-70b estimate: wall time | {t70:.1f} s |",
    ])
    print(text)
    old = RESULTS.read_text() if RESULTS.exists() else "# Measured figures\n"
    block = f"{BEGIN}\n## Speed and scale\n\nCommand: `python -m benchmarks.speed`.\n\n{text}\n{END}"
    new = (old[: old.index(BEGIN)] + block + old[old.index(END) + len(END):]) if BEGIN in old else \
        old.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
