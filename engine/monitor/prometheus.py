"""A monitor source that reads a fleet's GPUs from a Prometheus server, as dcgm-exporter or nvitop-exporter put them.

`PrometheusSource.sample()` answers a `FleetSnapshot` (a Snapshot with the server's state) built from ONE instant
query for every metric of every GPU (`{__name__=~"..."}`), so a fleet of any size costs one round trip; each GPU
keeps a fleet-wide index for as long as the source lives, its host and its index on that host, and the exporter's
job/pod labels. A GPU that stops being reported is shown as lost. `history()` reads one GPU's past through range
queries. Nothing raises on a bad server: unreachable, slow, wrong credentials, no GPU metrics are states.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.units import MIB

from .promapi import AUTH, ERROR, TIMEOUT, UNREACHABLE, PromClient, PromError
from .samples import GPU_LOST, GPU_OK, GpuSnapshot, ProcessInfo, Snapshot

OK, NO_METRICS = "ok", "no-metrics"
STATES = (OK, NO_METRICS, UNREACHABLE, TIMEOUT, AUTH, ERROR)

DCGM, NVITOP, VRAMSCOPE = "dcgm-exporter", "nvitop-exporter", "vramscope"


@dataclass(frozen=True)
class Metric:
    """One GpuSnapshot field and the names the exporters give it, with the factor from their unit to ours."""

    field: str
    dcgm: str | None
    nvitop: str | None
    dcgm_scale: float = 1.0
    nvitop_scale: float = 1.0


METRICS: tuple[Metric, ...] = (
    Metric("memory_used", "DCGM_FI_DEV_FB_USED", "gpu_memory_used_MiB", MIB, MIB),
    Metric("memory_free", "DCGM_FI_DEV_FB_FREE", "gpu_memory_free_MiB", MIB, MIB),
    Metric("memory_reserved", "DCGM_FI_DEV_FB_RESERVED", None, MIB),
    Metric("memory_total", "DCGM_FI_DEV_FB_TOTAL", "gpu_memory_total_MiB", MIB, MIB),
    Metric("util_gpu", "DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_Percentage"),
    Metric("util_memory", "DCGM_FI_DEV_MEM_COPY_UTIL", "gpu_memory_utilization_Percentage"),
    Metric("temperature_c", "DCGM_FI_DEV_GPU_TEMP", "gpu_temperature_C"),
    Metric("power_mw", "DCGM_FI_DEV_POWER_USAGE", "gpu_power_usage_W", 1000.0, 1000.0),
    Metric("power_limit_mw", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "gpu_power_limit_W", 1000.0, 1000.0),
    Metric("fan_percent", "DCGM_FI_DEV_FAN_SPEED", "gpu_fan_speed_Percentage"),
    Metric("clock_sm_mhz", "DCGM_FI_DEV_SM_CLOCK", "gpu_clock_sm_MHz"),
    Metric("clock_mem_mhz", "DCGM_FI_DEV_MEM_CLOCK", "gpu_clock_memory_MHz"),
    Metric("pcie_tx_kbs", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "gpu_pcie_tx_throughput_MiBps", 1.0, 1024.0),
    Metric("pcie_rx_kbs", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "gpu_pcie_rx_throughput_MiBps", 1.0, 1024.0),
    Metric("xid_error", "DCGM_FI_DEV_XID_ERRORS", None),
)
# per-process GPU memory: ours in bytes (labels pid, user, command), nvitop's in MiB (labels pid, username)
PROCESS_METRIC = "vramscope_process_memory_used_bytes"
NVITOP_PROCESS_METRIC = "process_gpu_memory_MiB"

_BY_NAME: dict[str, tuple[Metric, str, float]] = {}
for _m in METRICS:
    if _m.dcgm:
        _BY_NAME[_m.dcgm] = (_m, DCGM, _m.dcgm_scale)
    if _m.nvitop:
        _BY_NAME[_m.nvitop] = (_m, NVITOP, _m.nvitop_scale)
ALL_NAMES: tuple[str, ...] = tuple(_BY_NAME) + (PROCESS_METRIC, NVITOP_PROCESS_METRIC)
_HOST_LABELS = ("Hostname", "hostname", "kubernetes_node", "node", "instance")
# a fleet of any size costs these two queries (and `up == 0`): one for every value of every metric of every GPU
# (kept with only the labels that say which GPU), one for the labels that name them and for the processes
VALUES_QUERY = (f"max by (__name__, {', '.join(_HOST_LABELS)}, gpu, index) "
                f'({{__name__=~"{"|".join(_BY_NAME)}"}})')
IDENTITY_QUERY = (f'{{__name__=~"DCGM_FI_DEV_FB_USED|gpu_memory_used_MiB|{PROCESS_METRIC}|'
                  f'{NVITOP_PROCESS_METRIC}"}}')
# the series that draw the history plots (HistoryPlots' memory, utilization, temperature, power)
HISTORY_FIELDS = ("memory_used", "memory_free", "memory_total", "util_gpu", "temperature_c", "power_mw")

# labels that tell which job or pod uses a GPU (dcgm-exporter's Kubernetes and HPC mappings, Prometheus's own)
# (not Prometheus's own `job`: that names the scrape job, the same for every GPU)
JOB_LABELS = ("namespace", "pod", "container", "exported_namespace", "exported_pod", "exported_container",
              "hpc_job", "exported_job")


@dataclass(frozen=True)
class FleetSnapshot(Snapshot):
    """A Snapshot of a fleet: `state` (OK, NO_METRICS, or the PromError kind), `message` for any state but OK,
    the server, how long the query took, and the scrape targets Prometheus reports down."""

    state: str = OK
    message: str | None = None
    server: str = ""
    query_s: float = 0.0
    targets_down: tuple[str, ...] = ()
    families: tuple[str, ...] = ()  # which exporters' names were found (dcgm-exporter, nvitop-exporter)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({g.host for g in self.gpus if g.host is not None}))


@dataclass
class _Gpu:
    """What one instant query says about one GPU, before it becomes a GpuSnapshot."""

    host: str
    gpu: str
    family: str
    selector: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    name: str | None = None
    uuid: str | None = None
    driver: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    processes: list[ProcessInfo] = field(default_factory=list)


def job_text(g: GpuSnapshot) -> str:
    """The exporter's job/pod labels in one short cell: namespace/pod/container, else the HPC job."""
    d = dict(g.labels)
    pod = "/".join(d[k] for k in ("namespace", "pod", "container") if d.get(k)) or \
        "/".join(d[k] for k in ("exported_namespace", "exported_pod", "exported_container") if d.get(k))
    return pod or d.get("hpc_job") or d.get("exported_job") or ""


_MAX_READING = float(2**62)  # beyond any GPU's bytes, milliwatts or counters: a reading this large is garbage


def _value(v: Any, scale: float = 1.0) -> float | None:
    """A reading in our unit, or None for one that is not a finite number from 0 to _MAX_READING (no byte count,
    watt, degree, per cent or counter an exporter sends is below 0: a recording keeps only what it can replay)."""
    try:
        x = float(v) * scale
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) and 0 <= x <= _MAX_READING else None


def _host_of(labels: dict[str, str]) -> str:
    for k in _HOST_LABELS:
        if labels.get(k):
            return labels[k]
    return "?"


def _gpu_of(labels: dict[str, str], family: str) -> str:
    return labels.get("gpu") if family == DCGM else labels.get("index") or labels.get("gpu")  # type: ignore[return-value]


def _selector(labels: dict[str, str], family: str) -> dict[str, str]:
    """The labels that pick out this one GPU again in a range query."""
    keys = ("gpu", "UUID", "Hostname", "instance") if family == DCGM else ("index", "uuid", "hostname", "instance")
    return {k: labels[k] for k in keys if labels.get(k)}


def _int_or_none(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def _sort_key(host: str, gpu: str) -> tuple[str, int, str]:
    return (host, int(gpu) if gpu.isdigit() else 1 << 30, gpu)


class PrometheusSource:
    """Produces FleetSnapshots of every GPU a Prometheus server knows. Call `sample()` from one thread (the
    sampler's); `history()` may run on another thread at the same time."""

    def __init__(self, client: PromClient, *, clock: Callable[[], float] = time.time, keep_lost_s: float = 3600.0):
        self.client = client
        self._clock = clock
        self._keep_lost_s = keep_lost_s
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], int] = {}  # (host, gpu) → fleet index, stable for the session
        self._last: dict[tuple[str, str], tuple[float, GpuSnapshot]] = {}  # last seen, to report it lost
        self._where: dict[int, tuple[str, dict[str, str]]] = {}  # fleet index → (family, selector)
        self.last: FleetSnapshot | None = None

    @property
    def server(self) -> str:
        return self.client.url

    def close(self) -> None:
        pass

    # -- instant ------------------------------------------------------------------------------------------
    def sample(self) -> FleetSnapshot:
        now = self._clock()
        t0 = time.monotonic()
        try:
            # identities (full labels) of the memory-used series and the processes; then every value with only
            # the labels that find its GPU (a third of the bytes to parse)
            result = self.client.query(IDENTITY_QUERY) + self.client.query(VALUES_QUERY)
            down = self._targets_down()
        except PromError as e:
            snap = FleetSnapshot(time=now, error=f"{self.server}: {e.message}", state=e.kind, message=e.message,
                                 server=self.server, query_s=time.monotonic() - t0)
            self.last = snap
            return snap
        gpus, families = self._parse(result)
        snaps = self._snapshots(gpus, now)
        elapsed = time.monotonic() - t0
        if not snaps:
            msg = ("no dcgm-exporter or nvitop-exporter GPU metrics on this server"
                   + (f" ({len(down)} scrape target(s) down)" if down else "")
                   + "; check that it scrapes an exporter")
            snap = FleetSnapshot(time=now, error=f"{self.server}: {msg}", state=NO_METRICS, message=msg,
                                 server=self.server, query_s=elapsed, targets_down=down)
        else:
            snap = FleetSnapshot(time=now, gpus=snaps, state=OK, server=self.server, query_s=elapsed,
                                 targets_down=down, families=tuple(sorted(families)),
                                 driver_version=_one({g.driver for g in gpus.values() if g.driver}))
        self.last = snap
        return snap

    def _targets_down(self) -> tuple[str, ...]:
        try:
            ups = self.client.query("up == 0")
        except PromError as e:
            if e.kind == ERROR:
                return ()
            raise
        return tuple(sorted(f"{r['metric'].get('job', '?')}/{r['metric'].get('instance', '?')}" for r in ups))

    def _parse(self, result: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], _Gpu], set[str]]:
        gpus: dict[tuple[str, str], _Gpu] = {}
        procs: list[tuple[dict[str, str], float, str]] = []
        families: set[str] = set()
        for r in result:
            labels = r.get("metric") or {}
            name = labels.get("__name__", "")
            raw = (r.get("value") or (None, None))[1]
            if name in (PROCESS_METRIC, NVITOP_PROCESS_METRIC):
                used = _value(raw, 1.0 if name == PROCESS_METRIC else MIB)
                if used is not None:
                    procs.append((labels, used, name))
                continue
            spec = _BY_NAME.get(name)
            if spec is None:
                continue
            metric, family, scale = spec
            gpu = _gpu_of(labels, family)
            if gpu is None:
                continue
            families.add(family)
            host = _host_of(labels)
            g = gpus.get((host, gpu))
            if g is None:
                g = gpus[(host, gpu)] = _Gpu(host, gpu, family, _selector(labels, family))
            v = _value(raw, scale)
            if v is not None and metric.field not in g.values:
                g.values[metric.field] = v
            g.name = g.name or labels.get("modelName") or labels.get("devicename")
            g.uuid = g.uuid or labels.get("UUID") or labels.get("uuid")
            g.driver = g.driver or labels.get("DCGM_FI_DRIVER_VERSION")
            for k in JOB_LABELS:
                if labels.get(k) and k not in g.labels:
                    g.labels[k] = labels[k]
        for labels, v, name in procs:
            family = VRAMSCOPE if name == PROCESS_METRIC else NVITOP
            on = labels.get("gpu") if family == VRAMSCOPE else labels.get("index")
            g = gpus.get((_host_of(labels), on or ""))
            if g is None or not (labels.get("pid") or "").isdigit():
                continue
            used = int(round(v))
            g.processes.append(ProcessInfo(pid=int(labels["pid"]), gpu_index=-1, used_bytes=used,
                                           user=labels.get("user") or labels.get("username") or None,
                                           command=labels.get("command") or None))
        return gpus, families

    def _snapshots(self, gpus: dict[tuple[str, str], _Gpu], now: float) -> tuple[GpuSnapshot, ...]:
        out: list[GpuSnapshot] = []
        with self._lock:
            for key in sorted(gpus, key=lambda k: _sort_key(*k)):
                g = gpus[key]
                idx = self._index.setdefault(key, len(self._index))
                self._where[idx] = (g.family, g.selector)
                snap = _gpu_snapshot(idx, g)
                self._last[key] = (now, snap)
                out.append(snap)
            for key, (seen, last) in list(self._last.items()):
                if key in gpus:
                    continue
                if now - seen > self._keep_lost_s:
                    del self._last[key]
                    continue
                ago = time.strftime("%H:%M:%S", time.localtime(seen))
                out.append(GpuSnapshot(index=last.index, name=last.name, uuid=last.uuid, status=GPU_LOST,
                                       error=f"no longer reported by Prometheus (last seen {ago}); "
                                             "its exporter or host may be down",
                                       host=last.host, host_gpu=last.host_gpu, labels=last.labels,
                                       memory_total=last.memory_total))
        out.sort(key=lambda s: _sort_key(s.host or "", str(s.host_gpu if s.host_gpu is not None else s.index)))
        return tuple(out)

    # -- history ------------------------------------------------------------------------------------------
    def history(self, index: int, start: float, end: float, step: float | None = None) -> list[Snapshot]:
        """One GPU's readings between `start` and `end` (seconds since the epoch), one Snapshot per step holding
        only that GPU: one range query per plotted metric. Raises PromError (the caller shows it)."""
        with self._lock:
            where = self._where.get(index)
            last = next((s for _, s in self._last.values() if s.index == index), None)
        if where is None:
            raise PromError(ERROR, f"GPU {index} is not known to this source; sample the fleet first")
        family, selector = where
        if step is None:
            step = max(1.0, (end - start) / 1000.0)  # well under Prometheus's 11,000 points per series
        sel = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(selector.items()))
        per_field: dict[str, dict[float, float]] = {}
        for f in HISTORY_FIELDS:
            m = next(x for x in METRICS if x.field == f)
            name = m.dcgm if family == DCGM else m.nvitop
            if name is None:
                continue
            scale = m.dcgm_scale if family == DCGM else m.nvitop_scale
            # max(): a GPU whose pod label changed is several series; it is one GPU
            rows = self.client.query_range(f"max({name}{{{sel}}})", start, end, step)
            series: dict[float, float] = {}
            for r in rows[:1]:
                for t, v in r.get("values") or ():
                    x = _value(v, scale)
                    if x is not None:
                        series[float(t)] = x
            per_field[f] = series
        times = sorted({t for s in per_field.values() for t in s})
        out: list[Snapshot] = []
        for t in times:
            vals = {f: per_field.get(f, {}).get(t) for f in HISTORY_FIELDS}
            _fill_total(vals)
            g = GpuSnapshot(index=index, name=last.name if last else None, uuid=last.uuid if last else None,
                            host=last.host if last else None, host_gpu=last.host_gpu if last else None,
                            memory_used=_int_or_none(vals["memory_used"]),
                            memory_free=_int_or_none(vals["memory_free"]),
                            memory_total=_int_or_none(vals["memory_total"]),
                            util_gpu=_int_or_none(vals["util_gpu"]),
                            temperature_c=_int_or_none(vals["temperature_c"]),
                            power_mw=_int_or_none(vals["power_mw"]))
            out.append(Snapshot(time=t, gpus=(g,)))
        return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _one(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else None


def _fill_total(vals: dict[str, float | None]) -> None:
    """dcgm-exporter's default set has used and free but not total: total = used + free (+ reserved)."""
    if vals.get("memory_total") is None and vals.get("memory_used") is not None and vals.get("memory_free") is not None:
        vals["memory_total"] = (vals["memory_used"] or 0.0) + (vals["memory_free"] or 0.0) \
            + (vals.get("memory_reserved") or 0.0)


def _gpu_snapshot(idx: int, g: _Gpu) -> GpuSnapshot:
    vals: dict[str, float | None] = dict(g.values)
    _fill_total(vals)
    na = tuple((m.field, f"not exported by {g.family}") for m in METRICS if vals.get(m.field) is None)
    i = {m.field: _int_or_none(vals.get(m.field)) for m in METRICS}
    procs = tuple(ProcessInfo(pid=p.pid, gpu_index=idx, used_bytes=p.used_bytes, user=p.user, command=p.command)
                  for p in sorted(g.processes, key=lambda p: -(p.used_bytes or 0)))
    return GpuSnapshot(index=idx, name=g.name, uuid=g.uuid, status=GPU_OK, host=g.host,
                       host_gpu=int(g.gpu) if g.gpu.isdigit() else None, labels=tuple(sorted(g.labels.items())),
                       processes=procs, unavailable=na,
                       memory_used=i["memory_used"], memory_free=i["memory_free"], memory_total=i["memory_total"],
                       memory_reserved=i["memory_reserved"], util_gpu=i["util_gpu"], util_memory=i["util_memory"],
                       temperature_c=i["temperature_c"], power_mw=i["power_mw"], power_limit_mw=i["power_limit_mw"],
                       fan_percent=i["fan_percent"], clock_sm_mhz=i["clock_sm_mhz"], clock_mem_mhz=i["clock_mem_mhz"],
                       pcie_tx_kbs=i["pcie_tx_kbs"], pcie_rx_kbs=i["pcie_rx_kbs"], xid_error=i["xid_error"])
