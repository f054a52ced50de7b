"""Checks the monitor's NVML figures against nvidia-smi's on a real GPU; without one, says so and exits 0.

    python -m benchmarks.check_monitor [--allocate GIB]

--allocate makes this process take GIB of GPU memory through torch (when it has CUDA) and checks that the monitor
sees this process, with that much more memory used. Exit 1 when a figure disagrees.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.units import GIB, MIB, format_bytes  # noqa: E402
from engine.monitor.nvml import NvmlSource  # noqa: E402

# (nvidia-smi field, monitor value from a GpuSnapshot, allowed difference, unit)
FIELDS = [
    ("uuid", lambda g: g.uuid, None, ""),
    ("name", lambda g: g.name, None, ""),
    ("memory.total", lambda g: g.memory_total / MIB if g.memory_total is not None else None, 1, "MiB"),
    ("memory.reserved", lambda g: g.memory_reserved / MIB if g.memory_reserved is not None else None, 1, "MiB"),
    # used/free move while other jobs run: allow 64 MiB between the two readings
    ("memory.used", lambda g: g.memory_used / MIB if g.memory_used is not None else None, 64, "MiB"),
    ("memory.free", lambda g: g.memory_free / MIB if g.memory_free is not None else None, 64, "MiB"),
    ("temperature.gpu", lambda g: g.temperature_c, 3, "C"),
    ("power.limit", lambda g: g.power_limit_mw / 1000 if g.power_limit_mw is not None else None, 1, "W"),
    ("fan.speed", lambda g: g.fan_percent, 5, "%"),
    ("mig.mode.current", lambda g: None if g.mig_mode is None else ("Enabled" if g.mig_mode else "Disabled"), None, ""),
]


def _smi(args: list[str]) -> list[list[str]] | None:
    try:
        r = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(r.stdout)) if row]


def _query_gpus() -> tuple[list[str], list[list[str]]]:
    fields = ["index"] + [f for f, *_ in FIELDS]
    rows = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if rows is None:  # an older nvidia-smi without memory.reserved
        fields.remove("memory.reserved")
        rows = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]) or []
    return fields, rows


def _compare(ours, theirs: str, tol) -> bool | None:
    if theirs in ("[N/A]", "N/A", "[Not Supported]", "") or ours is None:
        return None  # one side has no value: reported, not judged
    if tol is None:
        return str(ours) == theirs
    try:
        return abs(float(ours) - float(theirs)) <= tol
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocate", type=float, default=0.0, metavar="GIB", help="take this much GPU memory via torch")
    args = ap.parse_args(argv)

    src = NvmlSource()
    snap = src.sample()
    if snap.error or not snap.gpus:
        print(f"no GPU: {snap.error or 'NVML reports no GPUs'} — nothing to check on this machine")
        return 0
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi on PATH — cannot compare; the monitor itself works:")
        for g in snap.gpus:
            print(f"  GPU {g.index} {g.name}: {format_bytes(g.memory_used or 0)} / {format_bytes(g.memory_total or 0)}")
        return 0

    fields, rows = _query_gpus()
    snap = src.sample()  # right after nvidia-smi, so the moving figures are close in time
    bad = 0
    print(f"driver {snap.driver_version}; {len(snap.gpus)} GPU(s)")
    print(f"{'GPU':>3}  {'field':<18} {'monitor':>24} {'nvidia-smi':>24}  verdict")
    for row in rows:
        rec = dict(zip(fields, row, strict=False))
        g = snap.gpu(int(rec["index"]))
        if g is None:
            print(f"{rec['index']:>3}  missing from the monitor")
            bad += 1
            continue
        for name, get, tol, unit in FIELDS:
            if name not in rec:
                continue
            ours = get(g)
            verdict = _compare(ours, rec[name], tol)
            bad += verdict is False
            shown = f"{ours:.0f}" if isinstance(ours, float) else str(ours)
            word = {True: "ok", False: "DIFFERS", None: "n/a"}[verdict]
            print(f"{g.index:>3}  {name:<18} {shown + ' ' + unit:>24} {rec[name] + ' ' + unit:>24}  {word}")

    apps = _smi(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]) or []
    smi_pids = {int(r[1]) for r in apps if len(r) > 1 and r[1].isdigit()}
    our_pids = {p.pid for p in snap.processes}
    print(f"compute processes: nvidia-smi {sorted(smi_pids)}, monitor {sorted(our_pids)}")
    if smi_pids != our_pids:
        print("  DIFFERS: the monitor misses", sorted(smi_pids - our_pids))
        bad += 1

    if args.allocate > 0:
        bad += _check_allocation(src, args.allocate)
    src.close()
    print("all figures agree" if not bad else f"{bad} figure(s) differ")
    return 1 if bad else 0


def _check_allocation(src: NvmlSource, gib: float) -> int:
    try:
        import torch
    except ImportError:
        print("--allocate: torch is not installed; skipped")
        return 0
    if not torch.cuda.is_available():
        print("--allocate: this torch has no CUDA; skipped")
        return 0
    torch.cuda.init()
    torch.cuda.synchronize()
    before = src.sample().gpu(torch.cuda.current_device())
    x = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    after = src.sample().gpu(torch.cuda.current_device())
    grew = (after.memory_used or 0) - (before.memory_used or 0)
    mine = [p for p in after.processes if p.pid == os.getpid()]
    print(f"--allocate {gib} GiB: used grew by {format_bytes(grew)}; this process seen: {bool(mine)}"
          + (f" holding {format_bytes(mine[0].used_bytes or 0)}" if mine else ""))
    del x
    # the caching allocator rounds up to 2 MiB blocks: allow 64 MiB either way
    ok = abs(grew - gib * GIB) <= 64 * MIB
    if not mine:
        print("  note: this pid is not in the list (inside a container NVML reports the host's pids)")
    if not ok:
        print("  DIFFERS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
