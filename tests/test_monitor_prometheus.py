"""The fleet monitor against a real Prometheus (Debian's `prometheus`) on loopback, scraping every second:
(a) our exporter serving a real H200 recording under dcgm-exporter's names, (b) a dcgm-exporter text exporter
for three hosts. The CLI and the source read them back through Prometheus's HTTP API; bad servers are states."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.core.units import MIB
from engine.monitor.alerts import AlertMonitor
from engine.monitor.exporter import MetricsServer, parse_listen
from engine.monitor.promapi import AUTH, ERROR, TIMEOUT, UNREACHABLE, Credentials, PromClient, check_url
from engine.monitor.prometheus import NO_METRICS, OK, PrometheusSource, job_text
from engine.monitor.recording import ReplaySource, load_recording
from engine.monitor.samples import GPU_LOST
from main import main
from tests.promserver import (
    BASIC_PASSWORD,
    BASIC_USER,
    FakeGpu,
    PrometheusServer,
    TextExporter,
    dcgm_text,
    ensure_prometheus,
    free_port,
    nvitop_text,
    wait_for,
)

RECORDING = Path(__file__).parent / "data" / "h200-monitor-excerpt.jsonl"


def fleet_gpus() -> list[FakeGpu]:
    gpus = [FakeGpu("gpu-node-a", i, used_mib=1000 * (i + 1), util=10 * i, temp=40 + i, power_w=100.25 + i,
                    labels={"namespace": "research", "pod": f"llm-train-{i // 4}", "container": "trainer"})
            for i in range(8)]
    gpus += [FakeGpu("gpu-node-b", i, model="NVIDIA A100-SXM4-80GB", total_mib=81920, used_mib=500) for i in range(4)]
    gpus += [FakeGpu("gpu-node-c", 0, used_mib=80000, util=99, temp=91, power_w=690.5,
                     labels={"hpc_job": "slurm-4242"}),
             FakeGpu("gpu-node-c", 1, xid=79, used_mib=12)]
    return gpus


@pytest.fixture(scope="module")
def prometheus_bin():
    path, why = ensure_prometheus()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def fleet(prometheus_bin, tmp_path_factory):
    """Both exporters and one Prometheus scraping them (and a dead target); all stopped at the end."""
    replay = load_recording(RECORDING)
    exporter = MetricsServer(ReplaySource(replay), interval=0.1, hostname="h200-box")
    dcgm = TextExporter(dcgm_text(fleet_gpus()))
    dead = f"127.0.0.1:{free_port()}"
    prom = None
    try:
        prom = PrometheusServer(prometheus_bin, tmp_path_factory.mktemp("prom"),
                                {"vramscope": [f"127.0.0.1:{exporter.port}"], "dcgm": [dcgm.target],
                                 "gone": [dead]})
        assert exporter.ended.wait(30), "the replay did not end"
        last = replay[-1].gpus[0]
        # the replay has ended: wait until Prometheus holds its last sample and every dcgm host
        wait_for(lambda: any(abs(float(r["value"][1]) * MIB - last.memory_used) < 1
                             for r in prom.series('DCGM_FI_DEV_FB_USED{Hostname="h200-box"}')),
                 30, "the recording's last sample in Prometheus", every=0.25)
        prom.wait_series("DCGM_FI_DEV_FB_USED", 15)
        # and until its first scrape of the dead target has failed (on a loaded machine it can come late)
        wait_for(lambda: bool(PrometheusSource(PromClient(prom.url)).sample().targets_down), 30,
                 "the dead target marked down", every=0.25)
        yield prom, exporter, dcgm, replay
    finally:
        if prom is not None:
            prom.close()
        dcgm.close()
        exporter.close()


def _by_host(snap) -> dict:
    return {(g.host, g.host_gpu): g for g in snap.gpus}


def test_recorded_session_reads_back_exactly_through_prometheus(fleet):
    prom, _exporter, _dcgm, replay = fleet
    snap = PrometheusSource(PromClient(prom.url)).sample()
    assert snap.state == OK, snap.message
    g = _by_host(snap)[("h200-box", 0)]
    want = replay[-1].gpus[0]  # a real H200 sample, served by our exporter, scraped, and queried back
    for f in ("memory_used", "memory_free", "memory_reserved", "memory_total", "util_gpu", "util_memory",
              "temperature_c", "power_mw", "power_limit_mw", "clock_sm_mhz", "clock_mem_mhz", "pcie_tx_kbs",
              "pcie_rx_kbs"):
        assert getattr(g, f) == getattr(want, f), f
    assert g.name == "NVIDIA H200" and g.uuid == want.uuid and snap.driver_version is None  # two drivers
    assert [(p.pid, p.used_bytes) for p in g.processes] == [(p.pid, p.used_bytes) for p in want.processes]
    assert g.fan_percent is None and g.why_unavailable("fan_percent") == "not exported by dcgm-exporter"
    assert snap.targets_down and snap.targets_down[0].startswith("gone/")


def test_dcgm_hosts_labels_and_alerts(fleet):
    prom = fleet[0]
    snap = PrometheusSource(PromClient(prom.url)).sample()
    got = _by_host(snap)
    assert sorted(snap.hosts) == ["gpu-node-a", "gpu-node-b", "gpu-node-c", "h200-box"]
    for fake in fleet_gpus():
        g = got[(fake.host, fake.gpu)]
        assert g.memory_used == fake.used_mib * MIB and g.memory_free == (fake.total_mib - fake.used_mib) * MIB
        assert g.memory_total == fake.total_mib * MIB and g.util_gpu == fake.util and g.temperature_c == fake.temp
        assert g.power_mw == round(fake.power_w * 1000) and g.name == fake.model and g.uuid == fake.uuid
        assert g.xid_error == fake.xid
    assert job_text(got[("gpu-node-a", 5)]) == "research/llm-train-1/trainer"
    assert job_text(got[("gpu-node-c", 0)]) == "slurm-4242" and job_text(got[("gpu-node-b", 0)]) == ""
    alerts = {(a.kind, a.message.split(" (")[0]) for a in AlertMonitor().update(snap)}
    assert ("memory", "gpu-node-c GPU 0") in alerts and ("xid", "gpu-node-c GPU 1") in alerts
    assert len({g.index for g in snap.gpus}) == len(snap.gpus) == 15  # fleet-wide indices


def test_cli_once_json_and_table(fleet, capsys):
    prom = fleet[0]
    assert main(["monitor", "--prometheus", prom.url, "--once", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["state"] == "ok" and d["exporters"] == ["dcgm-exporter"] and len(d["gpus"]) == 15
    assert main(["monitor", "--prometheus", prom.url, "--once"]) == 0
    out = capsys.readouterr().out
    assert "15 GPUs on 4 hosts" in out and "research/llm-train-0/trainer" in out and "XID 79" in out
    assert "scrape targets down: gone/" in out


def test_history_is_the_served_recording(fleet):
    prom, _exporter, _dcgm, replay = fleet
    src = PrometheusSource(PromClient(prom.url))
    snap = src.sample()
    g = _by_host(snap)[("h200-box", 0)]
    got: list = []

    def enough() -> bool:  # Prometheus may have scraped the exporter only once so far
        got[:] = src.history(g.index, time.time() - 120, time.time(), step=0.5)
        return len(got) >= 3

    wait_for(enough, 15, "three points of history")
    hist = got
    recorded = {s.gpus[0].memory_used for s in replay}
    assert all(h.gpus[0].memory_used in recorded for h in hist)  # every point is a recorded value
    assert hist[-1].gpus[0].memory_used == replay[-1].gpus[0].memory_used


def test_a_host_that_stops_reporting_is_lost(fleet):
    prom, _exporter, dcgm, _ = fleet
    src = PrometheusSource(PromClient(prom.url))
    assert src.sample().state == OK
    old = dcgm.text
    try:
        dcgm.text = dcgm_text([g for g in fleet_gpus() if g.host != "gpu-node-b"])
        wait_for(lambda: len(prom.series('DCGM_FI_DEV_FB_USED{Hostname="gpu-node-b"}')) == 0, 20,
                 "gpu-node-b's series to go stale")
        snap = src.sample()
        lost = [g for g in snap.gpus if g.status == GPU_LOST]
        assert sorted((g.host, g.host_gpu) for g in lost) == [("gpu-node-b", i) for i in range(4)]
        assert {a.kind for a in AlertMonitor().update(snap) if a.message.startswith("gpu-node-b")} == {"lost"}
    finally:
        dcgm.text = old


# -- states -------------------------------------------------------------------------------------------------

def test_unreachable_server_is_a_state(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    snap = PrometheusSource(PromClient(url, timeout=2)).sample()
    assert snap.state == UNREACHABLE and not snap.gpus and "cannot connect" in snap.message
    assert main(["monitor", "--prometheus", url, "--once"]) == 1
    assert "cannot connect" in capsys.readouterr().out


class _Slow(BaseHTTPRequestHandler):
    delay = 3.0
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        _Slow.seen.append(self.headers.get("Authorization") or "")
        time.sleep(self.delay)
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_api():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    _Slow.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    t.join(5)


def test_slow_answer_times_out_as_a_state(fake_api):
    _Slow.delay = 3.0
    t0 = time.monotonic()
    snap = PrometheusSource(PromClient(fake_api, timeout=0.3)).sample()
    assert snap.state == TIMEOUT and "no answer within 0.3 s" in snap.message
    assert time.monotonic() - t0 < 2.9  # the timeout ended it, not the server


def test_bearer_token_is_sent_and_no_metrics_is_a_state(fake_api):
    _Slow.delay = 0.0
    snap = PrometheusSource(PromClient(fake_api, Credentials(token="t0k"))).sample()
    assert snap.state == NO_METRICS and "no dcgm-exporter or nvitop-exporter GPU metrics" in snap.message
    assert _Slow.seen[0] == "Bearer t0k"
    assert "t0k" not in repr(PromClient(fake_api, Credentials(token="t0k")))


def test_not_a_prometheus_is_a_state(fleet):
    dcgm = fleet[2]
    snap = PrometheusSource(PromClient(f"http://{dcgm.target}")).sample()
    assert snap.state == ERROR


def test_basic_auth_right_and_wrong(prometheus_bin, tmp_path, monkeypatch):
    dcgm = TextExporter(dcgm_text(fleet_gpus()[:2]))
    prom = None
    try:
        prom = PrometheusServer(prometheus_bin, tmp_path, {"dcgm": [dcgm.target]}, basic_auth=True)
        prom.wait_series("DCGM_FI_DEV_FB_USED", 2)
        wrong = PrometheusSource(PromClient(prom.url, Credentials(user=BASIC_USER, password="nope"))).sample()
        assert wrong.state == AUTH and "wrong credentials (HTTP 401)" in wrong.message
        none = PrometheusSource(PromClient(prom.url, Credentials())).sample()
        assert none.state == AUTH and "needs credentials" in none.message
        monkeypatch.setenv("VRAMSCOPE_PROMETHEUS_USER", BASIC_USER)
        monkeypatch.setenv("VRAMSCOPE_PROMETHEUS_PASSWORD", BASIC_PASSWORD)
        ok = PrometheusSource(PromClient(prom.url)).sample()  # credentials from the environment
        assert ok.state == OK and len(ok.gpus) == 2
        host, port = prom.url.split("//")[1].split(":")
        inline = PromClient(f"http://{BASIC_USER}:{BASIC_PASSWORD}@{host}:{port}", credentials=None)
        assert inline.url == prom.url and PrometheusSource(inline).sample().state == OK
    finally:
        if prom is not None:
            prom.close()
        dcgm.close()


# -- small parts ------------------------------------------------------------------------------------------------

def test_listen_addresses_and_urls():
    assert parse_listen("9400") == ("127.0.0.1", 9400)
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("", "abc", "1:99999", "host:"):
        with pytest.raises(UserError):
            parse_listen(bad)
    assert check_url("prom:9090/")[0] == "http://prom:9090"
    for bad in ("ftp://x", "http://", "http://h:port"):
        with pytest.raises(UserError):
            check_url(bad)


def test_cli_mistakes_exit_2(capsys):
    assert main(["monitor", "--prometheus", "ftp://x", "--once"]) == 2
    assert main(["monitor", "--replay", str(RECORDING)]) == 2
    assert main(["monitor", "--serve-metrics", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 3


def test_exporter_binds_to_loopback_and_serves_dcgm_names():
    import urllib.request

    with MetricsServer(ReplaySource(load_recording(RECORDING)), port=0, interval=10, hostname="box") as srv:
        assert srv.host == "127.0.0.1"
        text = urllib.request.urlopen(srv.url, timeout=5).read().decode()
    first = load_recording(RECORDING)[0].gpus[0]
    assert f'DCGM_FI_DEV_FB_USED{{DCGM_FI_DRIVER_VERSION="580.159.04",Hostname="box",UUID="{first.uuid}"' in text
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_FB_USED{"))
    assert float(line.rsplit(" ", 1)[1]) * MIB == first.memory_used
    assert "vramscope_process_memory_used_bytes{" in text and "DCGM_FI_DEV_FAN_SPEED{" not in text  # n/a: left out


def test_serve_metrics_cli_with_replay(capsys):
    assert main(["monitor", "--serve-metrics", "127.0.0.1:0", "--replay", str(RECORDING), "--duration", "0.3"]) == 0
    assert "serving recording" in capsys.readouterr().err


def test_grafana_dashboard_is_importable_and_every_query_has_data(fleet):
    prom = fleet[0]
    dash = json.loads((Path(__file__).parent.parent / "resources" / "grafana" / "vramscope-dashboard.json").read_text())
    assert dash["uid"] and dash["schemaVersion"] >= 30 and "id" not in dash  # a fresh import, no server id
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    client = PromClient(prom.url)
    titles = []
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and set(p["gridPos"]) == {"h", "w", "x", "y"}
        for t in p["targets"]:
            expr = t["expr"].replace("$Hostname", ".*").replace("$gpu", ".*")
            result = client.query(expr)
            assert result, f"{p['title']}: {expr} returns nothing"
            titles.append(p["title"])
    assert {"Memory used per GPU", "Memory used per host", "GPU memory per process"} <= set(titles)
    per_process = client.query("vramscope_process_memory_used_bytes")
    want = fleet[3][-1].gpus[0].processes
    assert sorted(float(r["value"][1]) for r in per_process) == sorted(float(p.used_bytes) for p in want)


def test_queries_are_batched_not_per_gpu(fleet):
    prom = fleet[0]
    client = PromClient(prom.url)
    asked: list[str] = []
    real_query, real_range = client.query, client.query_range
    client.query = lambda q, at=None: asked.append(q) or real_query(q, at)  # type: ignore[method-assign]
    client.query_range = lambda q, *a: asked.append(q) or real_range(q, *a)  # type: ignore[method-assign]
    src = PrometheusSource(client)
    snap = src.sample()
    assert len(snap.gpus) == 15 and len(asked) == 3  # identities + processes, every value, `up == 0`
    asked.clear()
    src.history(snap.gpus[0].index, time.time() - 60, time.time())
    assert len(asked) == 6 and all(q.startswith("max(DCGM_FI_DEV_") for q in asked)  # one per plotted metric


def test_nvitop_exporter_names_read_back(prometheus_bin, tmp_path):
    gpus = [FakeGpu("10.0.0.7", i, model="NVIDIA RTX 6000 Ada Generation", total_mib=49140, used_mib=1200 * (i + 1),
                    util=5 * i, temp=50 + i, power_w=88.5) for i in range(2)]
    text = nvitop_text(gpus, {("10.0.0.7", 1): [(4242, "alice", 1100.5)]})
    assert "gpu_memory_used_MiB{" in text and "process_gpu_memory_MiB{" in text
    exporter = TextExporter(text)
    prom = None
    try:
        prom = PrometheusServer(prometheus_bin, tmp_path, {"nvitop": [exporter.target]})
        prom.wait_series("gpu_memory_used_MiB", 2)
        prom.wait_series("process_gpu_memory_MiB", 1)
        snap = PrometheusSource(PromClient(prom.url)).sample()
        assert snap.state == OK and snap.families == ("nvitop-exporter",)
        got = _by_host(snap)
        for fake in gpus:
            g = got[("10.0.0.7", fake.gpu)]
            assert g.memory_used == fake.used_mib * MIB and g.memory_total == fake.total_mib * MIB
            assert (g.util_gpu, g.temperature_c, g.power_mw, g.name) == (fake.util, fake.temp, 88500, fake.model)
            assert g.fan_percent is None  # NaN from the exporter is "n/a", not a number
        (p,) = got[("10.0.0.7", 1)].processes
        assert (p.pid, p.user, p.used_bytes) == (4242, "alice", round(1100.5 * MIB))
    finally:
        if prom is not None:
            prom.close()
        exporter.close()


def test_exporter_serves_nvml_readings_and_processes():
    """The NVML path (the stand-in of tests/fake_nvml.py: an A100, an A40 without fan/PCIe counters, an
    A100 in MIG mode): every served number is the source's own reading, in dcgm-exporter's units."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from engine.monitor.nvml import NvmlSource
    from tests.fake_nvml import FakeNvml, fake_details, three_gpus

    want = NvmlSource(FakeNvml(three_gpus()), process_details=fake_details).sample()
    with MetricsServer(NvmlSource(FakeNvml(three_gpus()), process_details=fake_details), interval=10,
                       hostname="ws") as srv:
        text = urllib.request.urlopen(srv.url, timeout=5).read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    served = {(f, s.labels["gpu"]): s.value for f, fam in fams.items() for s in fam.samples if "gpu" in s.labels}
    for g in want.gpus:
        i = str(g.index)
        assert served[("DCGM_FI_DEV_FB_USED", i)] * MIB == g.memory_used
        assert served[("DCGM_FI_DEV_FB_TOTAL", i)] * MIB == g.memory_total
        assert served[("DCGM_FI_DEV_POWER_USAGE", i)] * 1000 == g.power_mw
        assert served[("DCGM_FI_DEV_GPU_TEMP", i)] == g.temperature_c
        assert (("DCGM_FI_DEV_FAN_SPEED", i) in served) == (g.fan_percent is not None)  # n/a is left out
    procs = sorted((s.labels["gpu"], int(s.labels["pid"]), s.value)
                   for s in fams["vramscope_process_memory_used_bytes"].samples)
    expect = sorted((str(g.index), p.pid, float(p.used_bytes)) for g in want.gpus for p in g.processes
                    if p.used_bytes is not None)
    assert procs == expect and len(expect) >= 3


def test_fleet_snapshots_record_and_replay_exactly(fleet, tmp_path):
    snap = PrometheusSource(PromClient(fleet[0].url)).sample()
    from engine.monitor.recording import save_recording

    for name in ("fleet.csv", "fleet.jsonl"):
        back = load_recording(save_recording(tmp_path / name, [snap]))[0]
        assert back.gpus == snap.gpus  # hosts, indices on the host, job/pod labels, XID errors included


def test_without_prometheus_the_reason_is_one_clear_line(monkeypatch):
    import tests.promserver as ps

    monkeypatch.setattr(ps, "find_prometheus", lambda: None)
    monkeypatch.setattr(ps.os, "geteuid", lambda: 1000)
    path, why = ps.ensure_prometheus()
    assert path is None and "install Debian's 'prometheus' package" in why and "\n" not in why


def test_fleet_and_serve_refuse_what_the_local_monitor_refuses(capsys):
    """--prometheus and --serve-metrics take --duration and the recording names as `monitor` does."""
    assert main(["monitor", "--prometheus", "http://127.0.0.1:1", "--csv", "", "--once"]) == 2
    assert main(["monitor", "--prometheus", "http://127.0.0.1:1", "--duration", "inf"]) == 2
    assert main(["monitor", "--serve-metrics", "127.0.0.1:0", "--replay", str(RECORDING), "--duration", "nan"]) == 2
    err = capsys.readouterr().err
    assert "--csv: is an empty file name" in err and err.count("must be a positive, finite number") == 2
    assert "Traceback" not in err


def test_a_fleet_recording_is_put_in_place_and_counted(fleet, tmp_path, capsys):
    path = tmp_path / "fleet.jsonl"
    assert main(["monitor", "--prometheus", fleet[0].url, "--jsonl", str(path), "--interval", "0.1",
                 "--duration", "0.35", "--json"]) == 0
    samples = load_recording(path)
    assert f"recorded {len(samples)} samples to {path}" in capsys.readouterr().err
    assert len(samples) >= 2 and len(samples[0].gpus) == 15


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
def test_sigterm_stops_the_exporter_cleanly():
    code = ("import sys; from main import main\n"
            f"sys.exit(main(['monitor', '--serve-metrics', '127.0.0.1:0', '--replay', {str(RECORDING)!r}]))\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    first = p.stderr.readline()  # "serving recording … at http://127.0.0.1:PORT/metrics …": it is up
    assert "serving recording" in first
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err
