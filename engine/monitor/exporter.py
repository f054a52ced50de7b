"""Serve the monitor's readings to Prometheus under dcgm-exporter's metric names, so a workstation without DCGM
joins the same dashboards (`vramscope monitor --serve-metrics [HOST:]PORT`).

A Sampler reads the source (NVML, or a replayed recording) every interval; each scrape serves the newest sample:
dcgm-exporter's gauges and labels (gpu, UUID, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION), memory in MiB
as dcgm-exporter has it (fractions kept, so bytes round-trip exactly), power in W, plus each process's GPU memory
as `vramscope_process_memory_used_bytes`. A value the source could not read is left out, never served as 0.
Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.errors import UserError
from engine.core.units import MIB

from .prometheus import PROCESS_METRIC
from .sampler import Sampler, SnapshotSource
from .samples import GpuSnapshot, Snapshot

DEFAULT_HOST = "127.0.0.1"
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")

# (dcgm-exporter name, help text as dcgm-exporter words it, value from a GpuSnapshot in the metric's unit)
SERVED: tuple[tuple[str, str, Callable[[GpuSnapshot], float | None]], ...] = (
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: _per(g.memory_used, MIB)),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda g: _per(g.memory_free, MIB)),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda g: _per(g.memory_reserved, MIB)),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda g: _per(g.memory_total, MIB)),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util_gpu),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.util_memory),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: _per(g.power_mw, 1000)),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g: _per(g.power_limit_mw, 1000)),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", lambda g: g.fan_percent),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.clock_sm_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.clock_mem_mhz),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe transmit throughput (in KB/s).", lambda g: g.pcie_tx_kbs),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe receive throughput (in KB/s).", lambda g: g.pcie_rx_kbs),
)


def _per(v: int | None, unit: float) -> float | None:
    return None if v is None else v / unit


def parse_listen(text: str) -> tuple[str, int]:
    """'[HOST:]PORT' → (host, port); host 127.0.0.1 when left out; '[::1]:9400' for IPv6. Port 0: any free one."""
    t = str(text).strip()
    host, _, port_text = t.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:  # not '٣
        raise UserError(f"--serve-metrics {text!r}: give a port (0-65535), e.g. 9400 or 0.0.0.0:9400")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not (host.isascii() and host.replace("-", "").replace(".", "").isalnum()):
            raise UserError(f"--serve-metrics {text!r}: {host!r} is not a host name or address") from None
    return host, int(port_text)


def _load_client() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 (GaugeMetricFamily)
    except ImportError:
        raise UserError("serving metrics needs the prometheus_client package: pip install prometheus_client") \
            from None
    return prometheus_client


class SnapshotCollector:
    """A prometheus_client collector over `latest()`: the newest Snapshot, or None before the first one."""

    def __init__(self, latest: Callable[[], Snapshot | None], hostname: str):
        self.latest = latest
        self.hostname = hostname
        self._families = _load_client().core

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the label values change with the GPUs present

    def collect(self) -> Iterator[Any]:
        core = self._families
        snap = self.latest()
        gpus = [g for g in (snap.gpus if snap is not None else ()) if g.ok]
        driver = (snap.driver_version if snap is not None else None) or ""
        for name, doc, value in SERVED:
            fam = core.GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for g in gpus:
                v = value(g)
                if v is not None:
                    fam.add_metric(self._labels(g, driver), float(v))
            yield fam
        fam = core.GaugeMetricFamily(PROCESS_METRIC, "GPU memory used by one process (in bytes), as NVML reports it.",
                                     labels=("gpu", "UUID", "Hostname", "pid", "user", "command"))
        for g in gpus:
            for p in g.processes:
                if p.used_bytes is not None:
                    fam.add_metric([str(g.index), g.uuid or "", self.hostname, str(p.pid), p.user or "",
                                    " ".join((p.command or "").split())[:200]], float(p.used_bytes))
        yield fam

    def _labels(self, g: GpuSnapshot, driver: str) -> list[str]:
        return [str(g.index), g.uuid or "", f"nvidia{g.index}", g.name or "", self.hostname, driver]


class MetricsServer:
    """Samples `source` every `interval` seconds and serves the newest sample over HTTP at /metrics."""

    def __init__(self, source: SnapshotSource[Snapshot], host: str = DEFAULT_HOST, port: int = 0, *,
                 interval: float = 1.0, hostname: str | None = None):
        pc = _load_client()
        self.hostname = hostname or socket.gethostname()
        self.sampler = Sampler(source, interval=interval, on_error=self._on_error)
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self.sampler.buffer.last, self.hostname))
        self.errors: list[str] = []
        self.ended = threading.Event()
        self.sampler.on_end = self.ended.set
        try:
            self._httpd, self._thread = pc.start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise UserError(f"--serve-metrics {host}:{port}: cannot listen there ({e.strerror or e}); "
                            "pick another port") from None
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self.sampler.sample_now()  # the first scrape already has data
        self.sampler.start()

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    def _on_error(self, e: BaseException) -> None:
        self.errors.append(f"{type(e).__name__}: {e}")
        del self.errors[:-20]

    def close(self) -> None:
        self.sampler.stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
