"""`monitor --prometheus URL` (a fleet's GPUs read back from Prometheus) and `monitor --serve-metrics [HOST:]PORT`
(this machine's GPUs, or a replayed recording, served to Prometheus under dcgm-exporter's names)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.gpu_cells import memory_cell, na, temp_cell, util_cell, watts
from cli.terminal import shown, terminal_text
from cli.watch import check_watch_options, until_stopped, watch
from engine.core.units import format_bytes
from engine.monitor.exporter import MetricsServer, parse_listen
from engine.monitor.nvml import NvmlSource
from engine.monitor.promapi import DEFAULT_TIMEOUT_S, PromClient, check_timeout
from engine.monitor.prometheus import OK, FleetSnapshot, PrometheusSource, job_text
from engine.monitor.recording import Recorder, ReplaySource
from engine.monitor.sampler import check_interval
from engine.monitor.samples import GpuSnapshot


def _fleet_row(g: GpuSnapshot) -> str:
    host = shown(g.host or "?")[:20]
    gpu = "?" if g.host_gpu is None else str(g.host_gpu)
    name = shown(g.name or "?")[:22]
    if not g.ok:
        return f"{host:<20} {gpu:>3}  {name:<22}  {g.status.upper()}: {shown(g.error or '')}"
    xid = f"  XID {g.xid_error}" if g.xid_error else ""
    return (f"{host:<20} {gpu:>3}  {name:<22}  {memory_cell(g):<34} {util_cell(g):>5} {temp_cell(g):>6} "
            f"{na(g.power_mw, watts):>7}  {shown(job_text(g))}{xid}")


def format_fleet(snap: FleetSnapshot) -> str:
    if snap.state != OK:
        return f"Prometheus {shown(snap.server)}: {shown(snap.message)}"
    lines = [f"Prometheus {shown(snap.server)}: {len(snap.gpus)} GPUs on {len(snap.hosts)} hosts "
             f"({', '.join(map(shown, snap.families))}; query {snap.query_s * 1000:.0f} ms)"]
    if snap.targets_down:
        lines.append(f"scrape targets down: {', '.join(map(shown, snap.targets_down))}")
    lines.append(f"{'Host':<20} {'GPU':>3}  {'Name':<22}  {'Memory used / total':<34} {'Util':>5} {'Temp':>6} "
                 f"{'Power':>7}  Job / pod")
    lines += [_fleet_row(g) for g in snap.gpus]
    procs = [(g, p) for g in snap.gpus for p in g.processes]
    if procs:
        lines.append("")
        lines.append(f"{'Host':<20} {'GPU':>3}  {'PID':>8}  {'User':<12} {'Memory':>11}  Command")
        for g, p in procs:
            mem = na(p.used_bytes, format_bytes)
            command = shown(" ".join((p.command or "n/a").split()))[:60]
            lines.append(f"{shown(g.host or '?')[:20]:<20} {g.host_gpu if g.host_gpu is not None else '?':>3}  "
                         f"{p.pid:>8}  {shown(p.user or '?')[:12]:<12} {mem:>11}  {command}")
    return "\n".join(lines)


def fleet_json(snap: FleetSnapshot) -> dict[str, Any]:
    d = snap.to_json()
    d.update(server=snap.server, state=snap.state, message=snap.message, targets_down=list(snap.targets_down),
             exporters=list(snap.families), hosts=list(snap.hosts))
    return d


def run_prometheus(args: argparse.Namespace) -> int:
    interval = check_interval(args.interval)
    check_watch_options(args.duration, {"--csv": args.csv, "--jsonl": args.jsonl})
    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else check_timeout(args.timeout, "--timeout")
    src = PrometheusSource(PromClient(args.prometheus, timeout=timeout))
    recorders = [Recorder(p) for p in (args.csv, args.jsonl) if p]
    out = sys.stdout

    def show(snap: FleetSnapshot) -> None:
        if args.json:
            out.write(json.dumps(fleet_json(snap)) + "\n")
        else:
            out.write(terminal_text(format_fleet(snap)) + ("\n" if args.once else "\n\n"))
        out.flush()

    rc = 0
    with until_stopped(recorders) as asked:
        last = watch(src.sample, recorders, show, interval=interval, duration=args.duration,
                     stop=lambda _snap: bool(args.once), asked=asked)
        if args.once:
            rc = 0 if last.state == OK else 1  # the server could not be read: a failed command, said above
    return rc


def run_serve(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.serve_metrics)
    interval = check_interval(args.interval)
    check_watch_options(args.duration, {})
    source: ReplaySource | NvmlSource = ReplaySource.from_path(args.replay) if args.replay else NvmlSource()
    what = f"recording {args.replay}" if args.replay else "this machine's GPUs"
    # Ctrl+C and SIGTERM are noted from before the server starts: "serving…" is said only once they end it normally.
    with until_stopped([], source.close) as asked:
        server = MetricsServer(source, host, port, interval=interval, hostname=args.hostname)
        try:
            print(f"serving {shown(what)} at {shown(server.url)} (Hostname={shown(server.hostname)}); Ctrl+C stops",
                  file=sys.stderr, flush=True)
            asked.wait(args.duration)
        finally:
            server.close()
    return 0
