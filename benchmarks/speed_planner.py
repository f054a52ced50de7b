"""The planner against one estimate of the same step (issue 24's target: the plan in at most 5× one estimate), and
the CLI's start-up.

    python -m benchmarks.speed_planner            # prints the figures as JSON
    python -m benchmarks.speed_planner --before /path/to/an/older/checkout   # start-up there too
    python -m benchmarks.speed_planner --no-startup --only gpt2,resnet18     # some plans only

Each model in a fresh child process, imports done first (torch, peft, bitsandbytes: as in the app's worker): one
estimate (traced, the trace kept), the quick plan from it (the answers needing no new forward/backward: other
optimizers with only their step traced, sharding, Adafactor's formula), the full plan (every lever; the
re-traced ones one after another) and the full plan with its re-traced candidates in 2 worker processes (forked
copies of the child on Linux, `plan`'s default there: the same answers, asserted).
Start-up: the wall time of `main.py --version` (the parser and every command's module) and of
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
import torch, peft, bitsandbytes  # once per process, as the app's worker imports them
from engine.config.train_config import TrainConfig
from engine.planning.reuse import traced_step
from engine.planning.planner import recommend
from engine.models.sources import resolve_source
name, kw, how = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
src = resolve_source(name)
cfg = TrainConfig(**kw)
if how['warm']:
    traced_step(src, cfg)  # warm: the first trace of a process pays torch's lazy set-up
t0 = time.perf_counter(); est, step = traced_step(src, cfg); t1 = time.perf_counter()
quick = recommend(src, cfg, base=est, traced=step, quick=True); t2 = time.perf_counter()
r = {'estimate_s': t1 - t0, 'quick_s': t2 - t1, 'quick': len(quick), 'peak': est.peak_bytes}
if how['full']:
    full = recommend(src, cfg, base=est, traced=step); t3 = time.perf_counter()
    r.update(full_s=t3 - t2, full=len(full))
if how['jobs'] > 1:
    t3 = time.perf_counter()
    two = recommend(src, cfg, base=est, traced=step, workers=how['jobs'], ref=name); t4 = time.perf_counter()
    assert [x.to_json() for x in two] == [x.to_json() for x in full]
    r.update(jobs=how['jobs'], full_jobs_s=t4 - t3)
print(json.dumps(r))
"""

# (model, configuration, what is measured): a warm-up trace first, the full plan, the full plan in N processes
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("resnet18", {"batch_size": 32, "gpu": "T4"}, {"warm": True, "full": True, "jobs": 2}),
    ("gpt2", {"batch_size": 8, "seq_len": 512, "gpu": "T4", "optimizer": "adamw"},
     {"warm": True, "full": True, "jobs": 2}),
    ("llama-3.1-8b", {"peft": "qlora", "precision": "bf16", "seq_len": 2048, "optimizer": "adamw",
                      "gpu": "A100 80GB"}, {"warm": False, "full": True, "jobs": 2}),
]


def plan_vs_estimate(name: str, kw: dict[str, Any], how: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(kw), json.dumps(how)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(model=name, config=kw, quick_ratio=r["quick_s"] / r["estimate_s"])
    if "full_s" in r:
        r["full_ratio"] = r["full_s"] / r["estimate_s"]
    if "full_jobs_s" in r:
        r["full_jobs_ratio"] = r["full_jobs_s"] / r["estimate_s"]
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
    result: dict[str, Any] = {}
    if "--no-startup" not in argv:
        result["startup_after"] = startup(ROOT)
        if "--before" in argv:
            result["startup_before"] = startup(Path(argv[argv.index("--before") + 1]))
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else None
    result["plans"] = [plan_vs_estimate(n, kw, how) for n, kw, how in CASES if only is None or n in only]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
