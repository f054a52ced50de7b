"""The network probes of benchmarks/hostile_probes.py: `monitor --prometheus` against scripted bad servers (slow,
huge, malformed, redirecting credentials elsewhere) and `monitor --serve-metrics --replay` of malformed recordings."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.hostile_probe_kit import DATA, ODD, Probe, Scratch, call, cli

# ---------------------------------------------------------------------------------------------------------------
# monitor --prometheus against bad servers

class _Scripted(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: Callable[[socket.socket, bytes], None]):
        self.answer = answer
        self.seen: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ScriptedHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Scripted)
        self.request.settimeout(5)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 1 << 16:
                chunk = self.request.recv(4096)
                if not chunk:
                    break
                head += chunk
        server.seen.append(head)
        with contextlib.suppress(OSError):
            server.answer(self.request, head)


def _send(text: bytes) -> Callable[[socket.socket, bytes], None]:
    return lambda sock, _head: sock.sendall(text)


def _json_answer(doc: Any) -> Callable[[socket.socket, bytes], None]:
    body = json.dumps(doc, allow_nan=True).encode() if not isinstance(doc, bytes) else doc
    return _send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)


def _slow(first: bytes, drip: bytes) -> Callable[[socket.socket, bytes], None]:
    def answer(sock: socket.socket, _head: bytes) -> None:
        sock.sendall(first)
        for b in drip[:30]:
            time.sleep(1)
            sock.sendall(bytes([b]))
    return answer


def _flood(sock: socket.socket, _head: bytes) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200000000\r\n\r\n"
                 b'{"status": "success", "data": {"resultType": "vector", "result": [')
    chunk = b'{"metric": {}, "value": [1, "1"]},' * 1000
    for _ in range(200_000_000 // len(chunk)):
        sock.sendall(chunk)


def _vector(*series: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": list(series)}}


def _series(value: Any = "1000000", **labels: Any) -> dict[str, Any]:
    metric = {"__name__": "DCGM_FI_DEV_FB_USED", "Hostname": "node1", "gpu": "0", "modelName": "NVIDIA H200",
              **labels}
    return {"metric": metric, "value": [time.time(), value]}


def _no_escape(_rc: int, out: str, err: str) -> str:
    return "a control character printed" if "\x1b" in out + err else ""


def prometheus_probes(s: Scratch) -> Iterator[Probe]:
    ok_status = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    servers: list[tuple[str, Callable[[socket.socket, bytes], None]]] = [
        ("one byte a second in the headers", _slow(b"HTTP/1.1 200 OK\r\n", b"Content-Type: application/json\r\n")),
        ("one byte a second in the body", _slow(ok_status + b"Content-Length: 40\r\n\r\n", b'{"status": "success"}')),
        ("a 200 MB answer", _flood),
        ("100k-deep JSON", _json_answer(b"[" * 100_000 + b"]" * 100_000)),
        ("Content-Length longer than the body", _send(ok_status + b"Content-Length: 999\r\n\r\n{}")),
        ("a bad status line", _send(b"HTTP/1.1 abc\r\n\r\n")), ("not HTTP", _send(b"SSH-2.0-OpenSSH\r\n")),
        ("a header over 64 KiB", _send(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n{}")),
        ("150 headers", _send(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150))
                              + b"Content-Length: 2\r\n\r\n{}")),
        ("bad chunked encoding", _send(ok_status + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n")),
        ("closes at once", _send(b"")), ("HTML", _json_answer(b"<html>hi</html>")),
        ("status error", _json_answer({"status": "error", "error": "bad\nforged line\x1b[2J"})),
        ("data not an object", _json_answer({"status": "success", "data": [1]})),
        ("result not a list", _json_answer({"status": "success", "data": {"result": 5}})),
        ("a metric that is a list", _json_answer(_vector({"metric": [1], "value": [1, "1"]}))),
        ("a one-item value", _json_answer(_vector({"metric": {"__name__": "DCGM_FI_DEV_FB_USED"}, "value": [1]}))),
        ("a value of 1e308 MiB", _json_answer(_vector(_series("1e308")))),
        ("values NaN and -Inf", _json_answer(_vector(_series("NaN"), _series("-Inf", gpu="1")))),
        ("labels that are not strings", _json_answer(_vector(_series(Hostname=5, gpu=[1], modelName=None)))),
        ("a hostile hostname label", _json_answer(_vector(_series(Hostname="evil\n\x1b[2Jforged")))),
        ("100,000 series", _json_answer(_vector(*[_series(gpu=str(i)) for i in range(100_000)]))),
    ]
    for name, answer in servers:
        srv = _Scripted(answer)
        # --timeout bounds the request; reading 100,000 series after it takes 5 s of CPU here
        yield Probe("prometheus", name, cli("monitor", "--prometheus", srv.url, "--once", "--timeout", "2"), None,
                    bound_s=60 if name == "100,000 series" else 15, check=_no_escape)
    for url in ("", "ftp://x", "http://", "http://a b", "http://x\n", "http://[::1", "http://127.0.0.1:99999",
                "javascript:alert(1)"):
        yield Probe("prometheus", f"--prometheus {url!r}", cli("monitor", "--prometheus", url, "--once"), True)
    yield Probe("prometheus", "--timeout without --prometheus", cli("monitor", "--once", "--timeout", "3"), True)
    yield Probe("prometheus", "--hostname without --serve-metrics", cli("monitor", "--once", "--hostname", "x"), True)
    for t in ("inf", "1e300", "-1", "nan", "0"):
        yield Probe("prometheus", f"--timeout {t}", cli("monitor", "--prometheus", "http://127.0.0.1:9",
                                                        "--once", "--timeout", t), True)
    # credentials must stay with their origin: a 302 to another host (here: another port) gets none
    for how in ("token", "basic"):
        other = _Scripted(_json_answer(_vector()))
        redirect = _Scripted(_send(b"HTTP/1.1 302 Found\r\nLocation: " + other.url.encode()
                                   + b"/api/v1/query?query=up\r\nContent-Length: 0\r\n\r\n"))
        url = redirect.url.replace("http://", "http://u:pw@") if how == "basic" else redirect.url

        def run(url: str = url, how: str = how) -> tuple[int, str, str]:
            key = "VRAMSCOPE_PROMETHEUS_TOKEN"
            old = os.environ.get(key)
            if how == "token":
                os.environ[key] = "s3cret-token"
            try:
                return cli("monitor", "--prometheus", url, "--once", "--timeout", "2")()
            finally:
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old

        def leaked(_rc: int, _o: str, _e: str, other: _Scripted = other) -> str:
            seen = b"".join(other.seen).lower()
            return "the credentials reached another origin" if b"authorization" in seen else ""
        yield Probe("prometheus", f"a 302 to another origin with {how} credentials", run, None, bound_s=15,
                    check=leaked)


# ---------------------------------------------------------------------------------------------------------------
# monitor --serve-metrics and its replays

def exporter_probes(s: Scratch) -> Iterator[Probe]:
    lines = (DATA / "h200-monitor-excerpt.jsonl").read_text().splitlines()[:3]
    header, samples = lines[0], [json.loads(x) for x in lines[1:]]

    def replay(path: Path) -> Callable[[], tuple[int, str, str]]:
        def run() -> tuple[int, str, str]:
            from engine.monitor.exporter import SnapshotCollector
            from engine.monitor.recording import load_recording

            rc, out, err = call(lambda: load_recording(path))()
            if rc:
                return rc, out, err
            for snap in load_recording(path):  # what each scrape serves
                list(SnapshotCollector(lambda snap=snap: snap, "probe").collect())
            return cli("monitor", "--serve-metrics", "127.0.0.1:0", "--replay", str(path), "--duration", "0.3",
                       "--interval", "0.1")()
        return run

    for key in ("memory_used", "index", "name", "processes", "mig_devices", "unavailable", "labels", "status",
                "power_mw", "temperature_c"):
        for label, value in ODD:
            rec = [dict(x) for x in samples]
            rec[0] = dict(rec[0], gpus=[dict(rec[0]["gpus"][0], **{key: value})])
            p = s.write("r.jsonl", "\n".join([header, *(json.dumps(x, allow_nan=True) for x in rec)]))
            taken = (label == "None" and key in ("name", "status", "power_mw", "temperature_c", "memory_used",
                                                 "processes", "mig_devices", "unavailable", "labels")
                     or label == "a string" and key in ("name", "status")  # text, as NVML's
                     or label == "an object" and key == "unavailable")  # {field: reason}, as recorded
            yield Probe("exporter", f"gpu '{key}' {label}", replay(p), None if taken else True, bound_s=20)
    for key, value in (("gpus", {"0": {}}), ("gpus", ["GPU 0"]), ("time", "now"), ("time", None)):
        rec = [dict(samples[0], **{key: value})]
        p = s.write("r.jsonl", "\n".join([header, json.dumps(rec[0])]))
        yield Probe("exporter", f"snapshot '{key}' = {value!r}", replay(p), True)
    for name, text in (("no header", "\n".join(lines[1:])), ("another version", '{"format": "vramscope-monitor", '
                                                                             '"version": 99}\n' + lines[1]),
                       ("a torn last line", "\n".join(lines)[:-40]), ("binary", "\x00\xff" * 100), ("empty", "")):
        either = name in ("a torn last line", "no header")  # the header is optional; a torn line is named
        yield Probe("exporter", name, replay(s.write("r.jsonl", text)), None if either else True)
    yield Probe("exporter", "the real excerpt", replay(DATA / "h200-monitor-excerpt.jsonl"), False)
    for listen in ("٣", "9400٣", "99999", "-1", "host:", "[::1", "a b:80"):
        yield Probe("exporter", f"--serve-metrics {listen!r}", cli("monitor", "--serve-metrics", listen,
                                                                   "--duration", "0.2"), True)


