"""A small client of Prometheus's HTTP API (instant and range queries) over urllib, with timeouts and credentials.

Every failure becomes a `PromError` with a `kind` a view can show as a state: "unreachable" (refused, no such
host), "timeout" (no answer in time), "auth" (wrong or missing credentials), "error" (the server refused the
query or did not answer like Prometheus). Credentials live in memory only: a bearer token or a user and password,
given directly or named by environment variables; nothing here writes them anywhere.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from engine.errors import UserError

UNREACHABLE, TIMEOUT, AUTH, ERROR = "unreachable", "timeout", "auth", "error"
DEFAULT_TIMEOUT_S = 5.0
# environment variables read when no credentials are given explicitly
ENV_TOKEN = "VRAMSCOPE_PROMETHEUS_TOKEN"
ENV_USER = "VRAMSCOPE_PROMETHEUS_USER"
ENV_PASSWORD = "VRAMSCOPE_PROMETHEUS_PASSWORD"


class PromError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Credentials:
    """A bearer token, or a user and password (basic auth), or nothing. `repr` never shows the secrets."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        kind = "token" if self.token else "basic" if self.user else "none"
        return f"Credentials({kind})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Credentials:
        e = os.environ if env is None else env
        token = e.get(ENV_TOKEN) or None
        user = e.get(ENV_USER) or None
        return cls(token=token, user=user, password=(e.get(ENV_PASSWORD) or "") if user else None)

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.user:
            raw = f"{self.user}:{self.password or ''}".encode()
            return "Basic " + base64.b64encode(raw).decode("ascii")
        return None


def check_url(url: str) -> tuple[str, Credentials | None]:
    """The server's base URL (no trailing slash), and credentials if the URL carried them (user:pass@host),
    which are taken out of the URL so it can be shown and stored. Bad URL → UserError with the fix."""
    text = str(url).strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"Prometheus URL {url!r}: not an http(s) address; use e.g. http://prometheus:9090")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise UserError(f"Prometheus URL {url!r}: the port is not a number; use e.g. http://prometheus:9090") from None
    creds = None
    if parts.username is not None:
        creds = Credentials(user=urllib.parse.unquote(parts.username),
                            password=urllib.parse.unquote(parts.password or ""))
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return clean, creds


class PromClient:
    """Queries one Prometheus server. Thread-safe (no shared state beyond settings)."""

    def __init__(self, url: str, credentials: Credentials | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.url, from_url = check_url(url)
        self.credentials = credentials if credentials is not None else from_url or Credentials.from_env()
        self.timeout = float(timeout)

    def __repr__(self) -> str:
        return f"PromClient({self.url!r}, {self.credentials!r})"

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: the result vector, one {"metric": labels, "value": [t, "v"]} per series."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._call("/api/v1/query", params)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query: one {"metric": labels, "values": [[t, "v"], ...]} per series."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):.3f}"}
        return self._call("/api/v1/query_range", params)

    def _call(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.url + path, data=body, method="POST")
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        req.add_header("Accept", "application/json")
        auth = self.credentials.header()
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = _read_quietly(e)
            if e.code in (401, 403):
                what = "wrong credentials" if auth else "this server needs credentials"
                raise PromError(AUTH, f"{what} (HTTP {e.code}); set a bearer token or user and password") from None
            raise PromError(ERROR, f"HTTP {e.code}: {_api_error(raw) or e.reason}") from None
        except TimeoutError:
            raise PromError(TIMEOUT, f"no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise PromError(TIMEOUT, f"no answer within {self.timeout:g} s") from None
            raise PromError(UNREACHABLE, f"cannot connect ({_reason(e.reason)})") from None
        except (ConnectionError, OSError) as e:
            raise PromError(UNREACHABLE, f"connection failed ({_reason(e)})") from None
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise PromError(ERROR, "the answer is not Prometheus's JSON; is this the Prometheus URL?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error") if isinstance(doc, dict) else None
            raise PromError(ERROR, f"query refused: {err or 'unexpected answer'}")
        data = doc.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise PromError(ERROR, "the answer has no result list; is this the Prometheus URL?")
        return [r for r in data["result"] if isinstance(r, dict)]


def _read_quietly(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read() or b""
    except OSError:
        return b""


def _api_error(raw: bytes) -> str | None:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return str(doc.get("error")) if isinstance(doc, dict) and doc.get("error") else None


def _reason(r: object) -> str:
    if isinstance(r, OSError) and r.strerror:
        return r.strerror
    return str(r) or type(r).__name__
