"""On a CUDA machine: `vramscope.record` around a real training loop, then `vramscope open`'s reading of what it
wrote, checked against PyTorch's own counters (max_memory_allocated / max_memory_reserved) and, for a run made to
fail under a memory cap, against the out-of-memory error PyTorch raised.

Usage, from the project's root: python -m benchmarks.snapshot_gpu_check OUT_DIR
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path


def _train(batch: int, steps: int = 2):
    import torch

    from engine.config.train_config import TrainConfig
    from engine.models.sources import resolve_source

    model, x = resolve_source("resnet18").build(TrainConfig(batch_size=batch, device="cuda"))
    model.cuda()
    x = x.cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def main() -> int:
    import torch

    from engine.core.units import format_bytes
    from engine.snapshots.reader import open_snapshot
    from vramscope import record

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check")
        return 0
    print(f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}")

    # 1. a run that fits: the snapshot's figures against PyTorch's counters
    torch.cuda.reset_peak_memory_stats()
    path = out / "resnet18-b32-adam.pickle.gz"
    with record(path):
        _train(32)
    real_alloc, real_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    t0 = time.perf_counter()
    snap = open_snapshot(path)
    dt = time.perf_counter() - t0
    ours_alloc = snap.measured.max_memory_allocated
    print(f"fits: opened {path.name} ({path.stat().st_size:,} bytes, {snap.snapshot.events:,} events) "
          f"in {dt:.2f} s")
    for name, ours, real in (("max_memory_allocated", ours_alloc, real_alloc),
                             ("max_memory_reserved", snap.gpu.reserved_bytes, real_res)):
        print(f"  {name:<22} snapshot {ours:>14,}  torch {real:>14,}  ({100 * (ours - real) / real:+.3f} %)")
    print(f"  peak of live tensors {format_bytes(snap.peak_bytes)} in step {snap.peak_step + 1} {snap.peak_phase}; "
          f"config read: {snap.config.optimizer}, {snap.config.precision}")
    print("  breakdown at the peak: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in snap.breakdown_at_peak.items()
                                                  if v))

    # 2. a run made to fail under a 2 GiB cap: the observer's snapshot against the error PyTorch raised
    del snap
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(2 * 2**30 / total)
    path = out / "resnet18-b512-oom-at-2gib.pickle.gz"
    error = ""
    try:
        with record(path):
            _train(512)
    except torch.cuda.OutOfMemoryError as e:
        error = str(e).splitlines()[0]
    print(f"oom: PyTorch said: {error[:200]}")
    snap = open_snapshot(path)
    d = snap.oom
    m = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", error)
    print(f"  snapshot says: {d.message[:300]}")
    print(f"  requested {format_bytes(d.requested_bytes)} (PyTorch: {m.group(1) if m else '?'}); "
          f"live by category: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in d.live_by_category.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
