"""The Prometheus reader against hostile servers on 127.0.0.1 (real sockets): credentials never cross origins,
one deadline bounds the whole request, the answer's size is capped, and every bad answer is one line."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.monitor.http_client import ERROR as HTTP_ERROR, HttpFailure, post_form
from engine.monitor.promapi import ENV_TOKEN, ERROR, TIMEOUT, Credentials, PromClient, rows_of
from engine.monitor.prometheus import NO_METRICS, OK, STATES, PrometheusSource
from main import main

EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


class RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with `script(conn, request_bytes)`."""

    def __init__(self, script: Callable[[socket.socket, bytes], None]):
        self.script = script
        self.requests: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                self.requests.append(head)
                self.script(conn, head)
            except OSError:
                pass

    def auth_seen(self) -> list[str]:
        return [line.split(b":", 1)[1].strip().decode() for h in self.requests for line in h.split(b"\r\n")
                if line.lower().startswith(b"authorization:")]

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], RawServer]]:
    made: list[RawServer] = []

    def make(script: Callable[[socket.socket, bytes], None]) -> RawServer:
        made.append(RawServer(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


def answer(body: bytes = EMPTY, status: str = "200 OK", headers: tuple[str, ...] = ()) -> Callable[..., None]:
    def script(conn: socket.socket, _head: bytes) -> None:
        extra = "".join(f"{h}\r\n" for h in headers)
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
                     .encode() + body)
    return script


def redirect_to(url: str, status: str = "302 Found") -> Callable[..., None]:
    return answer(b"", status, (f"Location: {url}/api/v1/query",))


# -- credentials never cross origins ------------------------------------------------------------------------

def test_a_token_is_not_sent_to_the_server_a_redirect_names(servers, monkeypatch):
    other = servers(answer())
    first = servers(redirect_to(other.url))
    monkeypatch.setenv(ENV_TOKEN, "s3cret-token")
    snap = PrometheusSource(PromClient(first.url, timeout=5)).sample()
    assert first.auth_seen() and first.auth_seen()[0] == "Bearer s3cret-token"
    assert other.auth_seen() == [] and other.requests == []  # the other origin got nothing, token least of all
    assert snap.state == ERROR and "redirects to another server" in snap.message
    assert f"127.0.0.1:{other.port}" in snap.message and "\n" not in snap.message
    assert "s3cret" not in snap.message


def test_basic_credentials_in_the_url_are_not_sent_to_another_port(servers, capsys):
    other = servers(answer())
    first = servers(redirect_to(other.url, "307 Temporary Redirect"))
    rc = main(["monitor", "--prometheus", f"http://fleet:pw0rd@127.0.0.1:{first.port}", "--once"])
    out = capsys.readouterr().out
    assert rc == 1 and "redirects to another server" in out and "pw0rd" not in out
    assert first.auth_seen()[0].startswith("Basic ") and other.requests == []


def test_without_credentials_a_redirect_is_followed_and_within_an_origin_credentials_are_kept(servers):
    other = servers(answer())
    plain = servers(redirect_to(other.url))
    assert PrometheusSource(PromClient(plain.url, Credentials(), timeout=5)).sample().state == NO_METRICS
    assert other.requests and other.auth_seen() == []
    # a redirect to another path on the same origin keeps the token (the same server asked for it)
    hops: list[int] = []

    def same_origin(conn: socket.socket, head: bytes) -> None:
        hops.append(1)
        if b"/moved" in head.split(b"\r\n")[0]:
            answer()(conn, head)
        else:
            conn.sendall(b"HTTP/1.1 308 Permanent Redirect\r\nLocation: /moved/api/v1/query\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n")
    home = servers(same_origin)
    snap = PrometheusSource(PromClient(home.url, Credentials(token="t0k"), timeout=5)).sample()
    assert snap.state == NO_METRICS and home.auth_seen()[:2] == ["Bearer t0k", "Bearer t0k"]


def test_a_redirect_loop_is_one_line(servers):
    loop = servers(lambda conn, head: conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: /api/v1/query\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
    snap = PrometheusSource(PromClient(loop.url, Credentials(), timeout=5)).sample()
    assert snap.state == ERROR and "more than 5 redirects" in snap.message


# -- one deadline for the whole request ---------------------------------------------------------------------

def _trickle(what: str) -> Callable[..., None]:
    """Sends its answer one byte every 50 ms (in the headers or in the body), each read well inside any timeout."""
    def script(conn: socket.socket, _head: bytes) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(EMPTY)}\r\nConnection: close\r\n\r\n".encode()
        slow = head + EMPTY if what == "headers" else EMPTY
        if what == "body":
            conn.sendall(head)
        stop = threading.Event()
        for b in slow:
            conn.sendall(bytes([b]))
            if stop.wait(0.05):
                return
    return script


@pytest.mark.parametrize("what", ["headers", "body"])
def test_a_server_sending_one_byte_at_a_time_does_not_hold_the_request_past_its_timeout(servers, what):
    slow = servers(_trickle(what))
    # the whole answer takes ~4 s (headers) or ~3 s (body) at 50 ms a byte; each read waits only 50 ms
    snap = PrometheusSource(PromClient(slow.url, Credentials(), timeout=0.5)).sample()
    assert snap.state == TIMEOUT and snap.message == "no answer within 0.5 s"


def test_the_answer_is_capped(servers):
    # no Content-Length: the body runs until the server closes, and the reading stops at the cap
    big = servers(lambda conn, head: conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 200_000))
    with pytest.raises(HttpFailure, match=r"more than 100,000 bytes") as e:
        post_form(big.url, {}, headers={}, auth=None, timeout=5, max_bytes=100_000)
    assert e.value.kind == HTTP_ERROR
    huge = servers(lambda conn, head: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 300000000000\r\n\r\n"))
    with pytest.raises(HttpFailure, match=r"300,000,000,000 bytes"):
        post_form(huge.url, {}, headers={}, auth=None, timeout=5)


# -- bad HTTP is one line -----------------------------------------------------------------------------------

BAD_HTTP = {
    "bad status line": b"HTTP/1.1 two hundred\r\n\r\n",
    "not HTTP": b"SSH-2.0-OpenSSH_9.6\r\n",
    "Content-Length longer than the body": b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{\"status\"",
    "bad chunked encoding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    "150 headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n",
    "a header over 64 KiB": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
    "closes at once": b"",
    "an escape sequence in the reason": b"HTTP/1.1 500 \x1b[2J\x1b[31mboom\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(BAD_HTTP))
def test_bad_http_is_one_line(servers, name):
    srv = servers(lambda conn, head: conn.sendall(BAD_HTTP[name]))
    snap = PrometheusSource(PromClient(srv.url, Credentials(), timeout=5)).sample()
    assert snap.state in (ERROR, "unreachable") and snap.message
    assert "\n" not in snap.message and "\x1b" not in snap.message


HOSTILE_JSON = {
    "100k-deep arrays": b"[" * 100_000 + b"]" * 100_000,
    "1e308 MiB": json.dumps({"status": "success", "data": {"result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0", "Hostname": "h"}, "value": [1, "1e308"]},
        {"metric": {"__name__": "DCGM_FI_DEV_FB_FREE", "gpu": "0", "Hostname": "h"}, "value": [1, "1e308"]}]}}
    ).encode(),
    "labels that are not strings": json.dumps({"status": "success", "data": {"result": [
        {"metric": {"__name__": ["DCGM_FI_DEV_FB_USED"], "gpu": 0, "Hostname": {"a": 1}}, "value": [1, "5"]}]}}
    ).encode(),
    "metric a list": json.dumps({"status": "success", "data": {"result": [
        {"metric": ["DCGM_FI_DEV_FB_USED"], "value": [1, "5"]}]}}).encode(),
    "a one-item value": json.dumps({"status": "success", "data": {"result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0"}, "value": [1]}]}}).encode(),
    "error a dict": json.dumps({"status": "error", "error": {"x": "\x1b[2J"}}).encode(),
}


@pytest.mark.parametrize("name", list(HOSTILE_JSON))
def test_hostile_answers_are_states(servers, name):
    srv = servers(answer(HOSTILE_JSON[name]))
    snap = PrometheusSource(PromClient(srv.url, Credentials(), timeout=5)).sample()
    assert snap.state in STATES and "\x1b" not in (snap.message or "")
    for g in snap.gpus:
        assert g.memory_used is None or 0 <= g.memory_used <= 2**62


_label = st.one_of(st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers(), max_size=2))
_row = st.fixed_dictionaries({}, optional={
    "metric": st.one_of(st.dictionaries(st.sampled_from(["__name__", "gpu", "Hostname", "pid", "index", "modelName"]),
                                        st.one_of(st.sampled_from(["DCGM_FI_DEV_FB_USED", "gpu_memory_used_MiB",
                                                                   "vramscope_process_memory_used_bytes", "0", "1"]),
                                                  _label)),
                        _label),
    "value": st.one_of(st.lists(st.one_of(st.integers(), st.floats(), st.text(max_size=6),
                                          st.sampled_from(["1e308", "-1e400", "nan", "5"])), max_size=3), _label),
})


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_row, max_size=6))
def test_any_answer_shape_is_a_state_never_an_exception(rows):
    """The parse behind sample() (the answer's rows as the client hands them on) never raises."""
    client = PromClient("http://127.0.0.1:9", Credentials(), timeout=1)
    doc = json.dumps({"status": "success", "data": {"result": rows}}).encode()

    class Canned(PromClient):
        def _call(self, path: str, params: dict[str, str]) -> list[dict[str, object]]:  # noqa: ARG002
            return rows_of(doc)

    canned = Canned(client.url, Credentials(), timeout=1)
    snap = PrometheusSource(canned).sample()
    assert snap.state in (OK, NO_METRICS)


# -- the options -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "0", "-1"])
def test_timeout_out_of_range_is_one_line(capsys, value):
    assert main(["monitor", "--prometheus", "http://127.0.0.1:9", "--timeout", value, "--once"]) == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and "at most 3600" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:9\nX-Injected: 1", "", "http://a b:9090"])
def test_a_bad_url_is_one_line(capsys, url):
    assert main(["monitor", "--prometheus", url, "--once"]) == 2
    err = capsys.readouterr().err
    assert "Prometheus URL" in err and len(err.strip().splitlines()) == 1


def test_a_200_mb_answer_is_refused_by_the_reader(servers):
    """The issue's 200 MB answer: refused once it passes the 64 MiB cap, not read into memory whole."""
    def script(conn: socket.socket, _head: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        chunk = b" " * (1 << 20)
        for _ in range(200):
            conn.sendall(chunk)
    big = servers(script)
    snap = PrometheusSource(PromClient(big.url, Credentials(), timeout=30)).sample()
    assert snap.state == ERROR and "more than 67,108,864 bytes" in snap.message
