"""`monitor` subcommand: a table or JSON snapshot of the local NVIDIA GPUs, once or every interval, optionally recorded;
with --prometheus a fleet's GPUs read from a Prometheus server, with --serve-metrics an exporter (cli/fleet.py).

With no NVIDIA driver it prints `{"gpus": [], "error": "<reason>"}` (or the reason as text) and exits 0:
having no GPU is a state to report, not a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from cli import fleet
from cli.gpu_cells import memory_cell, na, temp_cell, util_cell, watts
from cli.terminal import shown, terminal_text
from cli.watch import check_watch_options, until_stopped, watch
from engine.core.errors import UserError
from engine.core.units import format_bytes
from engine.monitor.nvml import NvmlSource
from engine.monitor.promapi import ENV_PASSWORD, ENV_TOKEN, ENV_USER
from engine.monitor.recording import Recorder
from engine.monitor.sampler import DEFAULT_INTERVAL_S, check_interval
from engine.monitor.samples import GpuSnapshot, Snapshot


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="take one snapshot and exit")
    p.add_argument("--json", action="store_true", help="print JSON (one object per snapshot) instead of a table")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between samples (default {DEFAULT_INTERVAL_S:g}, minimum 0.1)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl+C)")
    p.add_argument("--csv", metavar="FILE", help="record the session to a CSV file")
    p.add_argument("--jsonl", metavar="FILE", help="record the session to a JSON Lines file")
    g = p.add_argument_group("fleets (Prometheus)")
    g.add_argument("--prometheus", metavar="URL",
                   help="read every GPU a Prometheus server has from dcgm-exporter or nvitop-exporter; credentials "
                        f"from ${ENV_TOKEN} (bearer) or ${ENV_USER} / ${ENV_PASSWORD} (basic auth)")
    g.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds to wait for Prometheus's answer (default 5)")
    g.add_argument("--serve-metrics", metavar="[HOST:]PORT",
                   help="serve this machine's GPUs (and processes' memory) to Prometheus under dcgm-exporter's "
                        "names at http://HOST:PORT/metrics; HOST defaults to 127.0.0.1")
    g.add_argument("--replay", metavar="FILE", help="with --serve-metrics: serve a recorded session instead, "
                                                     "one sample per --interval")
    g.add_argument("--hostname", metavar="NAME", help="with --serve-metrics: the Hostname label (default: this "
                                                       "machine's name)")


def _gpu_row(g: GpuSnapshot) -> str:
    name = shown(g.name or "?")[:24]
    if not g.ok:
        return f"{g.index:>3}  {name:<24}  {g.status.upper()}: {shown(g.error or '')}"
    resv = na(g.memory_reserved, format_bytes)
    if g.power_mw is not None:
        power = watts(g.power_mw) + (f" / {watts(g.power_limit_mw)}" if g.power_limit_mw else "")
    else:
        power = "n/a"
    fan = na(g.fan_percent, lambda v: f"{v}%")
    mig = "" if not g.mig_mode else f"  MIG ×{len(g.mig_devices)}"
    return (f"{g.index:>3}  {name:<24}  {memory_cell(g):<34} {resv:>11} {util_cell(g):>5} {temp_cell(g):>6} "
            f"{power:>13} {fan:>5}{mig}")


def format_table(snap: Snapshot) -> str:
    if snap.error and not snap.gpus:
        return f"No NVIDIA GPU / driver found: {shown(snap.error)}"
    lines = []
    if snap.driver_version:
        lines.append(f"NVIDIA driver {shown(snap.driver_version)}")
    lines.append(f"{'GPU':>3}  {'Name':<24}  {'Memory used / total':<34} {'Reserved':>11} {'Util':>5} "
                 f"{'Temp':>6} {'Power':>13} {'Fan':>5}")
    lines += [_gpu_row(g) for g in snap.gpus]
    procs = snap.processes
    if procs:
        lines.append("")
        lines.append(f"{'GPU':>3}  {'PID':>8}  {'Type':<4} {'User':<12} {'Memory':>11}  Command")
        for p in sorted(procs, key=lambda p: (p.gpu_index, -(p.used_bytes or 0))):
            lines.append(f"{p.gpu_index:>3}  {p.pid:>8}  {p.kind:<4} {shown(p.user or '?')[:12]:<12} "
                         f"{na(p.used_bytes, format_bytes):>11}  "
                         f"{shown(p.command or ('(access denied)' if p.denied else 'n/a'))[:60]}")
    return "\n".join(lines)


def _as_json(snap: Snapshot) -> dict[str, Any]:
    if snap.error and not snap.gpus:
        return {"gpus": [], "error": snap.error}
    return snap.to_json()


def run(args: argparse.Namespace) -> int:
    if args.prometheus is not None and args.serve_metrics:
        raise UserError("--prometheus and --serve-metrics: one at a time (read a fleet, or serve this machine)")
    if args.replay and not args.serve_metrics:
        raise UserError("--replay FILE goes with --serve-metrics PORT (to watch a recording, open it in the app)")
    # options that only one mode reads are refused elsewhere, as --replay is (they were silently ignored)
    if args.hostname is not None and not args.serve_metrics:
        raise UserError("--hostname NAME labels what --serve-metrics serves; add --serve-metrics PORT or drop it")
    if args.timeout is not None and args.prometheus is None:
        raise UserError("--timeout S bounds a Prometheus query; add --prometheus URL or drop it")
    if args.prometheus is not None:  # '' too: PromClient names it as no address
        return fleet.run_prometheus(args)
    if args.serve_metrics:
        return fleet.run_serve(args)
    interval = check_interval(args.interval)
    check_watch_options(args.duration, {"--csv": args.csv, "--jsonl": args.jsonl})
    recorders = [Recorder(path) for path in (args.csv, args.jsonl) if path]
    src = NvmlSource()
    out = sys.stdout

    def show(snap: Snapshot) -> None:
        if args.json:
            out.write(json.dumps(_as_json(snap)) + "\n")
        else:
            if not args.once and snap.gpus:
                out.write(time.strftime("%H:%M:%S", time.localtime(snap.time)) + "\n")
            out.write(terminal_text(format_table(snap)) + ("\n" if args.once else "\n\n"))
        out.flush()

    with until_stopped(recorders, src.close) as asked:
        # nothing to watch on a machine without a driver: one snapshot says so
        watch(src.sample, recorders, show, interval=interval, duration=args.duration,
              stop=lambda snap: bool(args.once or (snap.error and not snap.gpus)), asked=asked)
    return 0
