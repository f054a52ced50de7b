"""The longest event-loop stall of the app's GUI thread while a LLaMA-7B step is estimated through the bridge.

A 10 ms QTimer records the gap between its ticks; the worst gap minus the interval is the stall a user would
feel. Target: under 100 ms. Run: `QT_QPA_PLATFORM=offscreen python -m benchmarks.ui_stall [--model NAME]`;
`--threads` runs the engine on a thread of the app's process instead, to see why it does not (the tracer's
garbage collections hold the GIL for hundreds of milliseconds). `--snapshot PATH` opens a memory snapshot the way
File ▸ Open memory snapshot… does instead (its own engine process). Exit status 0 when under target.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

TICK_MS = 10
TARGET_MS = 100


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    ap.add_argument("--snapshot", metavar="PATH", help="open this PyTorch memory snapshot instead of estimating")
    ap.add_argument("--threads", action="store_true",
                    help="run the engine on a thread of this process instead of the engine process (to compare)")
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from engine.config.train_config import TrainConfig
    from engine.core.units import format_bytes
    from engine.jobs.calls import EngineCall, estimate, open_snapshot
    from gui.bridge import EngineBridge

    app = QApplication.instance() or QApplication(sys.argv[:1])
    cfg = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len, optimizer=args.optimizer, device="cuda")
    bridge = EngineBridge(processes=not args.threads)
    gaps: list[float] = []
    at: list[float] = []
    clock = QElapsedTimer()
    state = {"last": None, "done": False, "error": "", "est": None, "t0": 0.0, "t1": 0.0}

    gc_pauses: list[tuple[float, int]] = []  # (ms, generation) of each garbage collection during the run
    gc_start = {}

    def gc_cb(phase, info):
        if phase == "start":
            gc_start["t"] = time.perf_counter()
        elif "t" in gc_start:
            gc_pauses.append(((time.perf_counter() - gc_start.pop("t")) * 1e3, info.get("generation", -1)))

    def tick():
        now = clock.nsecsElapsed() / 1e6
        if state["last"] is not None:
            gaps.append(now - state["last"])
            at.append(now)
        state["last"] = now

    # Exactly what the app submits for a built-in model.
    job = EngineCall(estimate, (("ref", args.model), cfg))
    kind = "estimate"
    if args.snapshot:
        job, kind = EngineCall(open_snapshot, (args.snapshot,)), "snapshot"

    def on_result(kind, jid, est):
        state["est"], state["done"], state["t1"] = est, True, time.perf_counter()
        app.quit()

    def on_error(kind, jid, msg):
        state["error"], state["done"], state["t1"] = msg, True, time.perf_counter()
        app.quit()

    bridge.result.connect(on_result)
    bridge.error.connect(on_error)
    timer = QTimer()
    timer.setInterval(TICK_MS)
    timer.timeout.connect(tick)
    clock.start()
    timer.start()
    # Warm the engine's imports on this thread first: importing torch is not the bridge's stall to measure.
    import engine.models.sources  # noqa: F401
    import engine.planning.estimator  # noqa: F401

    baseline: list[float] = []

    def go():
        # The gaps so far are the machine's own jitter with nothing running: the baseline to compare with.
        baseline.extend(gaps)
        state["t0"] = time.perf_counter()
        state["last"] = None
        gaps.clear()
        at.clear()
        import gc

        gc.callbacks.append(gc_cb)
        bridge.submit(kind, job)

    QTimer.singleShot(2000, go)
    QTimer.singleShot(int(args.timeout * 1000), app.quit)
    app.exec()
    timer.stop()
    bridge.shutdown()

    if state["error"]:
        print(f"error: {state['error']}", file=sys.stderr)
        return 2
    if not state["done"]:
        print(f"error: the estimate did not finish in {args.timeout:.0f} s", file=sys.stderr)
        return 2
    worst = max(gaps) if gaps else 0.0
    stall = max(0.0, worst - TICK_MS)
    over = sum(1 for g in gaps if g - TICK_MS > TARGET_MS)
    what = (f"snapshot {args.snapshot} ({state['est'].snapshot.events:,} events): peak"
            if args.snapshot else
            f"model {args.model}, seq {args.seq_len}, batch {args.batch_size}, {args.optimizer}: estimated peak")
    print(f"engine on {'a thread' if args.threads else 'the engine process'}; "
          f"{what} {format_bytes(state['est'].peak_bytes)} in {state['t1'] - state['t0']:.2f} s")
    print(f"ticks {len(gaps)}, longest gap {worst:.1f} ms, longest stall {stall:.1f} ms "
          f"(target < {TARGET_MS} ms), stalls over target: {over}")
    base = max(0.0, max(baseline) - TICK_MS) if baseline else 0.0
    print(f"baseline (idle, 2 s): longest stall {base:.1f} ms — the machine's own scheduling jitter")
    worst5 = sorted(zip(gaps, at, strict=False), reverse=True)[:5]
    print("longest gaps (ms @ s into the run): " + ", ".join(f"{g:.0f} @ {t / 1e3:.1f}" for g, t in worst5))
    if gc_pauses:
        g = max(gc_pauses)
        print(f"garbage collections {len(gc_pauses)}, longest {g[0]:.1f} ms (generation {g[1]})")
    print(f"max_stall_ms {stall:.1f}")
    return 0 if stall < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
