"""Speed and scale of the estimator, on this machine.

    python -m benchmarks.speed            # prints and appends a section to benchmarks/RESULTS.md

- a 100-layer model of the kind the builder makes (Linear/LayerNorm/GELU blocks), CUDA target: estimate time;
- llama-70b (AdamW, fp32, batch 1, seq 2048): peak host memory of the whole estimate (in a child process).
The MemTracker comparison on llama-7b is benchmarks/memtracker_compare.py.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from engine.config import TrainConfig
from engine.estimator import estimate

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
        "import time,resource; from engine.config import TrainConfig;"
        " from engine.estimator import estimate;"
        "t=time.perf_counter(); e=estimate('llama-70b', TrainConfig(optimizer='adamw', seq_len=2048));"
        "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024, e.peak_bytes)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    return float(out[0]), int(out[1])


def main() -> int:
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
