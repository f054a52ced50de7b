"""Real Prometheus for the fleet tests and the scale benchmark: find (or, as root with apt, install) Debian's
`prometheus`, run it on a loopback port scraping given targets every second, and a tiny exporter serving
dcgm-exporter's text format for any number of hosts. Every wait is bounded; every process is killed by its owner."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# bcrypt of BASIC_PASSWORD (cost 4, test only) for Prometheus's --web.config.file
BASIC_USER, BASIC_PASSWORD = "fleet", "fleet-test-pw"
BASIC_HASH = "$2b$04$qVutu/tG.EZvLVclKmxbpO0RvC5bqN.XoWErrYHBH504r6pl/2pay"


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next((p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus")
                                              if os.access(p, os.X_OK)), None)


def ensure_prometheus() -> tuple[str | None, str]:
    """(path, "") when Prometheus is here or could be installed; (None, why) when it cannot be had."""
    found = find_prometheus()
    if found:
        return found, ""
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, ("Prometheus is not installed and cannot be installed here (needs root and apt-get): "
                      "install Debian's 'prometheus' package to run the fleet tests")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
                ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]):
        try:
            subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired):
            break
        if find_prometheus():
            return find_prometheus(), ""
    return None, "apt-get could not install Debian's 'prometheus' package (no network?); the fleet tests need it"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(every)
    raise TimeoutError(f"gave up after {timeout:g} s waiting for {what}")


# -- a tiny dcgm-exporter -----------------------------------------------------------------------------------

_DCGM_HELP = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
}


@dataclass
class FakeGpu:
    host: str
    gpu: int
    model: str = "NVIDIA H100 80GB HBM3"
    total_mib: int = 81559
    used_mib: int = 0
    util: int = 0
    temp: int = 35
    power_w: float = 70.5
    xid: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return f"GPU-{zlib.crc32(self.host.encode()):08x}-0000-0000-0000-{self.gpu:012d}"


def dcgm_text(gpus: list[FakeGpu]) -> str:
    """dcgm-exporter's exposition (its default counters' names, labels and HELP texts) for these GPUs."""
    values: dict[str, Callable[[FakeGpu], str]] = {
        "DCGM_FI_DEV_SM_CLOCK": lambda g: "1980" if g.util else "345",
        "DCGM_FI_DEV_MEM_CLOCK": lambda g: "2619",
        "DCGM_FI_DEV_GPU_TEMP": lambda g: str(g.temp),
        "DCGM_FI_DEV_POWER_USAGE": lambda g: f"{g.power_w:.6f}",
        "DCGM_FI_DEV_GPU_UTIL": lambda g: str(g.util),
        "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g: str(g.util // 3),
        "DCGM_FI_DEV_XID_ERRORS": lambda g: str(g.xid),
        "DCGM_FI_DEV_FB_FREE": lambda g: str(g.total_mib - g.used_mib),
        "DCGM_FI_DEV_FB_USED": lambda g: str(g.used_mib),
    }
    out = []
    for name, value in values.items():
        out.append(f"# HELP {name} {_DCGM_HELP[name]}")
        out.append(f"# TYPE {name} gauge")
        for g in gpus:
            labels = {"gpu": str(g.gpu), "UUID": g.uuid, "pci_bus_id": f"00000000:{0x18 + g.gpu:02X}:00.0",
                      "device": f"nvidia{g.gpu}", "modelName": g.model, "Hostname": g.host,
                      "DCGM_FI_DRIVER_VERSION": "550.54.15", **g.labels}
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} {value(g)}")
    return "\n".join(out) + "\n"


def nvitop_text(gpus: list[FakeGpu], processes: dict[tuple[str, int], list[tuple[int, str, int]]]) -> str:
    """nvitop-exporter's exposition for these GPUs, made the way it makes it: prometheus_client gauges with its
    names, units and labels (`gpu_memory_used` + unit 'MiB' → `gpu_memory_used_MiB`, labels hostname, index,
    devicename, uuid; `process_gpu_memory` per pid and username). `processes[(host, gpu)]`: (pid, user, MiB)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    labels = ["hostname", "index", "devicename", "uuid"]

    def gauge(name: str, unit: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, f"{name} ({unit}).", unit=unit, labelnames=labels + list(extra), registry=reg)

    used, free = gauge("gpu_memory_used", "MiB"), gauge("gpu_memory_free", "MiB")
    total, util = gauge("gpu_memory_total", "MiB"), gauge("gpu_utilization", "Percentage")
    temp, power = gauge("gpu_temperature", "C"), gauge("gpu_power_usage", "W")
    fan = gauge("gpu_fan_speed", "Percentage")
    proc = gauge("process_gpu_memory", "MiB", ("pid", "username"))
    for g in gpus:
        key = (g.host, str(g.gpu), g.model, g.uuid)
        used.labels(*key).set(g.used_mib)
        free.labels(*key).set(g.total_mib - g.used_mib)
        total.labels(*key).set(g.total_mib)
        util.labels(*key).set(g.util)
        temp.labels(*key).set(g.temp)
        power.labels(*key).set(g.power_w)
        fan.labels(*key).set(float("nan"))  # nvitop's "not available"
        for pid, user, mib in processes.get((g.host, g.gpu), []):
            proc.labels(*key, str(pid), user).set(mib)
    return bytes(generate_latest(reg)).decode()


class TextExporter:
    """Serves `text` at /metrics on 127.0.0.1 (any free port); `text` may be swapped while it runs."""

    def __init__(self, text: str = ""):
        self.text = text
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = owner.text.encode()
                owner.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="dcgm-text-exporter", daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


# -- Prometheus ---------------------------------------------------------------------------------------------

class PrometheusServer:
    """`prometheus` on 127.0.0.1:<free port>, scraping `jobs` ({job: [host:port, ...]}) every second."""

    def __init__(self, binary: str, workdir: Path, jobs: dict[str, list[str]], *, basic_auth: bool = False):
        workdir.mkdir(parents=True, exist_ok=True)
        lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "  evaluation_interval: 1s",
                 "scrape_configs:"]
        for job, targets in jobs.items():
            lines += [f"  - job_name: {json.dumps(job)}", "    static_configs:",
                      f"      - targets: {json.dumps(targets)}"]
        (workdir / "prometheus.yml").write_text("\n".join(lines) + "\n")
        self.auth = (BASIC_USER, BASIC_PASSWORD) if basic_auth else None
        if basic_auth:
            (workdir / "web.yml").write_text(f"basic_auth_users:\n  {BASIC_USER}: {BASIC_HASH}\n")
        # free_port() lets the port go before Prometheus binds it: under pytest-xdist another worker's exporter may
        # take it meanwhile. Then another port, a few times.
        for attempt in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                   f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
            if basic_auth:
                cmd.append(f"--web.config.file={workdir / 'web.yml'}")
            self.log = open(workdir / "prometheus.log", "wb")
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)
            try:
                wait_for(self._ready, 30, f"Prometheus on port {self.port} to start")
                return
            except RuntimeError as e:
                self.close()
                if "address already in use" not in str(e) or attempt == 2:
                    raise
            except BaseException:
                self.close()
                raise

    def _get(self, path: str) -> bytes:
        req = urllib.request.Request(self.url + path)
        if self.auth:
            import base64

            req.add_header("Authorization", "Basic " + base64.b64encode(":".join(self.auth).encode()).decode())
        with urllib.request.urlopen(req, timeout=2) as r:
            return bytes(r.read())

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: "
                               f"{Path(self.log.name).read_text(errors='replace')[-500:]}")
        try:
            self._get("/-/ready")
            return True
        except OSError:
            return False

    def series(self, promql: str) -> list[dict]:
        import urllib.parse

        doc = json.loads(self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
        return list(doc["data"]["result"])

    def wait_series(self, promql: str, count: int = 1, timeout: float = 30) -> None:
        """Until `promql` returns at least `count` series (scrapes happen every second)."""
        wait_for(lambda: len(self.series(promql)) >= count, timeout, f"{count} series of {promql}", every=0.25)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


if __name__ == "__main__":  # `make test`: have Prometheus before the suite, quietly; one line when it cannot be had
    import sys

    found, why = ensure_prometheus()
    if found is None:
        print(f"note: {why}", file=sys.stderr)
