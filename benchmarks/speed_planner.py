"""The planner against one estimate of the same step (issue 24's target: the plan in at most 5× one estimate), and
the CLI's start-up.

    python -m benchmarks.speed_planner            # prints the figures as JSON
    python -m benchmarks.speed_planner --before /path/to/an/older/checkout   # start-up there too

Each model in a fresh child process, imports done first (as in the app's worker): one estimate (traced, the trace
kept), the quick plan from it (the answers needing no new forward/backward: other optimizers with only their
step traced, sharding, Adafactor's formula), and the full plan (every lever; the re-traced ones one after
another). Start-up: the wall time of `main.py --version` (the parser and every command's module) and of
`main.py estimate lstm-lm` in fresh processes, the best of 3, and `-X importtime`'s largest top-level imports.
Wall times only mean something beside each other: the machine they were taken on is named in RESULTS.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
import torch
from engine.config import TrainConfig
from engine.plan_reuse import traced_step
from engine.planner import recommend
from engine.sources import resolve_source
name, kw = sys.argv[1], json.loads(sys.argv[2])
src = resolve_source(name)
cfg = TrainConfig(**kw)
traced_step(src, cfg)  # warm: the first trace of a process pays torch's lazy set-up
t0 = time.perf_counter(); est, step = traced_step(src, cfg); t1 = time.perf_counter()
quick = recommend(src, cfg, base=est, traced=step, quick=True); t2 = time.perf_counter()
full = recommend(src, cfg, base=est, traced=step); t3 = time.perf_counter()
print(json.dumps({'estimate_s': t1 - t0, 'quick_s': t2 - t1, 'full_s': t3 - t2, 'quick': len(quick),
                  'full': len(full), 'peak': est.peak_bytes}))
"""

CASES: list[tuple[str, dict[str, Any]]] = [
    ("resnet18", {"batch_size": 32, "gpu": "T4"}),
    ("gpt2", {"batch_size": 8, "seq_len": 512, "gpu": "T4", "optimizer": "adamw"}),
]


def plan_vs_estimate(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(kw)], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(model=name, config=kw, quick_ratio=r["quick_s"] / r["estimate_s"],
             full_ratio=r["full_s"] / r["estimate_s"])
    return r


def startup(root: Path) -> dict[str, Any]:
    def best(argv: list[str]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "main.py", *argv], cwd=root, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        return min(times)

    estimate = ["estimate", "lstm-lm", "--seq-len", "8", "--device", "cpu"]
    prof = subprocess.run([sys.executable, "-X", "importtime", "main.py", *estimate], cwd=root,
                          capture_output=True, text=True, check=True).stderr
    top = []
    for line in prof.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m and not m.group(2).startswith(" "):
            top.append((int(m.group(1)) / 1e6, m.group(2)))
    top.sort(reverse=True)
    return {"version_s": best(["--version"]), "estimate_s": best(estimate),
            "top_imports": [(round(s, 2), n) for s, n in top[:5]]}


def main(argv: list[str]) -> None:
    result: dict[str, Any] = {"startup_after": startup(ROOT)}
    if "--before" in argv:
        result["startup_before"] = startup(Path(argv[argv.index("--before") + 1]))
    result["plans"] = [plan_vs_estimate(n, kw) for n, kw in CASES]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
