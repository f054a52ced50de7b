"""The one HTTP client policy of the readers that ask a server (the Prometheus reader): one deadline for the
whole request (connecting, the headers, the body and any redirect), a cap on the answer's size, credentials sent
only to the origin (scheme, host, port) they were given for, and every bad answer one line.

A server that sends one byte a second cannot hold a request past its deadline: a watchdog shuts the socket
down when the deadline passes, whichever read is waiting. A redirect to another origin is followed only when
there are no credentials to send; with credentials it is refused, naming where it pointed.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from engine.core.errors import printable

__all__ = ["ERROR", "MAX_ANSWER_BYTES", "TIMEOUT", "UNREACHABLE", "Answer", "HttpFailure", "post_form", "printable"]

UNREACHABLE, TIMEOUT, ERROR = "unreachable", "timeout", "error"
MAX_ANSWER_BYTES = 64 << 20  # 10,000 GPUs answer about 25 MB (15 series of ~150 bytes each); beyond: not a fleet
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


class HttpFailure(Exception):
    """A request that got no usable answer: `kind` is UNREACHABLE, TIMEOUT or ERROR; `message` one line."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the port made explicit."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def _shown(url: str) -> str:
    """A URL without any user:password in it, safe to print."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return printable(urllib.parse.urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""),
                                              parts.path, "", "")))


def post_form(url: str, form: dict[str, str], *, headers: dict[str, str], auth: str | None, timeout: float,
              max_bytes: int = MAX_ANSWER_BYTES) -> Answer:
    """POST `form` to `url` and read the whole answer within `timeout` seconds, redirects included.
    `auth` (an Authorization header) goes only to `url`'s origin. Raises HttpFailure."""
    deadline = time.monotonic() + timeout
    home = origin(url)
    body: bytes | None = urllib.parse.urlencode(form).encode()
    method = "POST"
    for _hop in range(MAX_REDIRECTS + 1):
        answer, location = _one_request(url, method, body, headers, auth if origin(url) == home else None,
                                        deadline, timeout, max_bytes)
        if location is None:
            return answer
        target = urllib.parse.urljoin(url, location)
        if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
            raise HttpFailure(ERROR, f"the server redirects to {_shown(target)}, which is not an http(s) address")
        if origin(target) != home and auth is not None:
            raise HttpFailure(ERROR, f"the server redirects to another server ({_shown(target)}); credentials are "
                                     "sent only to the URL given: give that address as the URL if you trust it")
        if answer.status == 303 or (answer.status in (301, 302) and method == "POST"):
            # as browsers and urllib do: the form goes into the query of a GET
            split = urllib.parse.urlsplit(target)
            target = urllib.parse.urlunsplit(split._replace(query=urllib.parse.urlencode(form)))
            method, body = "GET", None
        url = target
    raise HttpFailure(ERROR, f"more than {MAX_REDIRECTS} redirects; give the address they end at as the URL")


def _one_request(url: str, method: str, body: bytes | None, headers: dict[str, str], auth: str | None,
                 deadline: float, timeout: float, max_bytes: int) -> tuple[Answer, str | None]:
    """One request and its whole answer; (answer, Location) for a redirect, (answer, None) otherwise."""
    remaining = deadline - time.monotonic()
    late = HttpFailure(TIMEOUT, f"no answer within {timeout:g} s")
    if remaining <= 0:
        raise late
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme.lower() == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=remaining, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=remaining)
    fired = threading.Event()

    def abort() -> None:
        fired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(remaining, abort)
    watchdog.daemon = True
    watchdog.start()
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    send = dict(headers)
    if auth is not None:
        send["Authorization"] = auth
    try:
        try:
            conn.request(method, path, body=body, headers=send)
        except (http.client.HTTPException, ValueError):  # a control character in the URL or a header
            # (not shown: the header may be a credential)
            raise HttpFailure(ERROR, "cannot send the request: the URL or a credential holds a character HTTP "
                                     "does not allow (a newline?)") from None
        except OSError as e:
            if fired.is_set() or isinstance(e, TimeoutError):
                raise late from None
            raise HttpFailure(UNREACHABLE, f"cannot connect ({_why(e)})") from None
        resp = conn.getresponse()
        location = resp.getheader("Location") if resp.status in _REDIRECTS else None
        data = _read_capped(resp, max_bytes)
        if fired.is_set():  # the watchdog's shutdown can end a body early without an error
            raise late
        return Answer(resp.status, printable(resp.reason or "", 60), data), location
    except HttpFailure:
        raise
    except TimeoutError:
        raise late from None
    except (http.client.HTTPException, ValueError) as e:
        if fired.is_set():
            raise late from None
        raise HttpFailure(ERROR, f"not a valid HTTP answer ({printable(str(e) or 'malformed', 80)})") from None
    except OSError as e:
        if fired.is_set():
            raise late from None
        raise HttpFailure(UNREACHABLE, f"connection failed ({_why(e)})") from None
    finally:
        watchdog.cancel()
        conn.close()


def _read_capped(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise HttpFailure(ERROR, f"the answer is {int(declared):,} bytes, more than {max_bytes:,}; "
                                 "narrow the query or check the URL")
    chunks: list[bytes] = []
    got = 0
    while True:
        chunk = resp.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        got += len(chunk)
        if got > max_bytes:
            raise HttpFailure(ERROR, f"the answer is more than {max_bytes:,} bytes; narrow the query or check the URL")
        chunks.append(chunk)


def _why(e: OSError) -> str:
    if isinstance(e, ssl.SSLError):
        return printable(f"TLS: {e.reason or e}")
    if isinstance(e, socket.gaierror):
        return printable(f"no such host: {e.strerror or e}")
    return printable(e.strerror or str(e) or type(e).__name__)
