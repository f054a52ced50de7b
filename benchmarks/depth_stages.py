"""Where an estimate's time goes, stage by stage, at 4 and at 80 layers of the same Llama-shaped model (the depth
section of benchmarks/speed.py: issue 24's 1.5× target). What an 80-layer model adds to a 4-layer one is either
per module or parameter (building it, planning the fold, faking the parameters) or per event (the categories,
the events, the summary, the allocator replay), or both (the trace: its written-out blocks and copied second step
are per event, the optimizer's construction and the gradients' bookkeeping per parameter): in milliseconds.

    python -m benchmarks.depth_stages [--repeats 7]

Each stage is timed by wrapping the function that does it (unittest.mock.patch.object, `wraps=`: the same code
runs); each figure is the median of `repeats` warm estimates, one process. "trace" is the recorded step, with the
written-out blocks, the copied second step and the folded optimizer; "other" is the estimate's total less the
stages.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any
from unittest import mock

from engine.config.train_config import TrainConfig
from engine.cuda import device_model
from engine.planning import estimator
from engine.planning.estimator import estimate
from engine.trace import recorded_step, tracer

from .speed import llama_shaped

# (module, function, the stage's name in the table; what grows with the model: "module" or "event")
STAGES: list[tuple[Any, str, str, str]] = [
    (tracer, "_build", "build the model", "module"),
    (tracer, "check_no_optimizer_in_hooks", "hooks: no optimizer in them", "module"),
    (tracer, "model_info", "the model's facts", "module"),
    (tracer, "plan_fold", "plan the fold (signatures, own code)", "module"),
    (tracer, "_fakeify", "fake the parameters", "module"),
    (tracer, "_record", "trace (written-out blocks, second step, optimizer)", "both"),
    (tracer, "check_live_bytes", "check live bytes", "event"),
    (recorded_step, "categorize", "categories", "event"),
    (recorded_step, "mem_events", "events", "event"),
    (estimator, "summarise", "summary (timeline, rows)", "event"),
    (device_model, "replay", "allocator replay", "event"),
]


def _timer(acc: dict[str, float], label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - t0

    return timed


def stage_times(repeats: int) -> dict[int, dict[str, float]]:
    """{layers: median seconds of each stage (and "total", "other")} over `repeats` estimates at 4 and at 80
    layers, the two depths alternating (a shared machine's load then weighs on both alike)."""
    cfg = TrainConfig(batch_size=1, optimizer="adamw", gpu="A100 80GB")
    runs: dict[int, list[dict[str, float]]] = {4: [], 80: []}
    acc: dict[str, float] = defaultdict(float)
    with ExitStack() as stack:
        for module, name, label, _kind in STAGES:
            stack.enter_context(mock.patch.object(module, name, _timer(acc, label, vars(module)[name])))
        for layers in runs:
            estimate(llama_shaped(layers), cfg)  # warm: this depth's shapes in the fake-tensor cache
        for _ in range(repeats):
            for layers, done in runs.items():
                acc.clear()
                t0 = time.perf_counter()
                estimate(llama_shaped(layers), cfg)
                run = dict(acc)
                run["total"] = time.perf_counter() - t0
                run["other"] = run["total"] - sum(acc.values())
                done.append(run)
    return {layers: {k: sorted(r.get(k, 0.0) for r in rs)[len(rs) // 2] for k in rs[0]}
            for layers, rs in runs.items()}


def table(repeats: int = 7) -> str:
    estimate(llama_shaped(2), TrainConfig(batch_size=1, optimizer="adamw", gpu="A100 80GB"))  # imports, caches
    times = stage_times(repeats)
    t4, t80 = times[4], times[80]
    rows = ["| stage | grows with | 4 layers | 80 layers | added |", "|---|---|---:|---:|---:|"]
    added = {"module": 0.0, "event": 0.0, "both": 0.0}
    for _m, _n, label, kind in STAGES:
        a, b = t4.get(label, 0.0), t80.get(label, 0.0)
        added[kind] += b - a
        rows.append(f"| {label} | {kind} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {(b - a) * 1e3:+.1f} ms |")
    rows.append(f"| other | | {t4['other'] * 1e3:.1f} ms | {t80['other'] * 1e3:.1f} ms | "
                f"{(t80['other'] - t4['other']) * 1e3:+.1f} ms |")
    rows.append(f"| **estimate** | | **{t4['total'] * 1e3:.0f} ms** | **{t80['total'] * 1e3:.0f} ms** | "
                f"**{t80['total'] / t4['total']:.2f}×** |")
    rows.append("")
    rows.append(f"Added by the 76 more blocks: {added['module'] * 1e3:.0f} ms in the stages that go over every module "
                f"or parameter, {added['event'] * 1e3:.0f} ms in those that go over every event, "
                f"{added['both'] * 1e3:.0f} ms in the trace (both); the 1.5× target leaves "
                f"{t4['total'] * 0.5 * 1e3:.0f} ms for all of it.")
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 7
    print(table(repeats))


if __name__ == "__main__":
    main(sys.argv[1:])
