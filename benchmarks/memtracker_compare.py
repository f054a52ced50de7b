"""Speed and agreement against PyTorch's MemTracker on the same model, same step, same machine.

    python -m benchmarks.memtracker_compare [MODEL] [--seq-len N] [--batch-size N] [--optimizer adamw]

Both run two training steps on fake tensors (fp32). Prints each tool's peak and wall time, and the ratio.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch


def memtracker_peak(model_name: str, cfg) -> tuple[int, float]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from engine.models.sources import resolve_source
    from engine.trace.step import call_model, loss_of, make_optimizer

    src = resolve_source(model_name)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model, inputs = src.build(cfg)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        inputs = {k: torch.empty_like(v, device="cpu") for k, v in inputs.items()} if isinstance(inputs, dict) \
            else torch.empty_like(inputs, device="cpu")
        opt = make_optimizer(model.parameters(), cfg)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            for _ in range(2):
                loss = loss_of(call_model(model, inputs))
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
                mt.reset_mod_stats()  # MemTracker refuses a second iteration otherwise
        snap = mt.get_tracker_snapshot("peak")
    dt = time.perf_counter() - t0
    peak = max(v.get("Total", 0) for v in snap.values())
    return peak, dt


def ours(model_name: str, cfg) -> tuple[int, float]:
    from engine.planning.estimator import estimate

    t0 = time.perf_counter()
    est = estimate(model_name, cfg)
    return est.peak_bytes, time.perf_counter() - t0


def main() -> None:
    from engine.config.train_config import TrainConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="llama-7b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--optimizer", default="adamw")
    a = ap.parse_args()
    cfg = TrainConfig(batch_size=a.batch_size, seq_len=a.seq_len, optimizer=a.optimizer, device="cpu")
    p1, t1 = ours(a.model, cfg)
    p2, t2 = memtracker_peak(a.model, cfg)
    print(f"model {a.model} seq {a.seq_len} batch {a.batch_size} {a.optimizer} fp32; torch {torch.__version__}; "
          f"{platform.processor() or platform.machine()}")
    print(f"VRAMScope  peak {p1:,} B  time {t1:.1f} s")
    print(f"MemTracker peak {p2:,} B  time {t2:.1f} s")
    print(f"agreement {(p1 - p2) / p2 * 100:+.2f} %   time ratio ours/MemTracker {t1 / t2:.2f}")


if __name__ == "__main__":
    main()
