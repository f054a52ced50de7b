"""A small client of Prometheus's HTTP API (instant and range queries) over urllib, with timeouts and credentials.

Every failure becomes a `PromError` with a `kind` a view can show as a state: "unreachable" (refused, no such
host), "timeout" (no answer in time), "auth" (wrong or missing credentials), "error" (the server refused the
query or did not answer like Prometheus). Credentials live in memory only: a bearer token or a user and password,
given directly or named by environment variables; nothing here writes them anywhere.
"""

from __future__ import annotations

import base64
import math
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

from engine.core.bounded_read import parse_json
from engine.core.errors import UserError

from .http_client import ERROR, TIMEOUT, UNREACHABLE, HttpFailure, post_form, printable

AUTH = "auth"
__all__ = ["AUTH", "ERROR", "TIMEOUT", "UNREACHABLE", "Credentials", "PromClient", "PromError", "check_url",
           "check_timeout"]
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 3600.0  # an hour: a monitor that waits longer for one answer is not watching
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
    if not text.isprintable() or " " in text:
        raise UserError(f"Prometheus URL {printable(url)}: holds a space or a control character (a newline?); "
                        "give one address, e.g. http://prometheus:9090")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # 'http://[::1': an IPv6 address not closed
        raise UserError(f"Prometheus URL {printable(url)}: not an address (an IPv6 address needs its closing ']'); "
                        "use e.g. http://prometheus:9090") from None
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


def check_timeout(timeout: float, where: str = "timeout") -> float:
    """A request's deadline in seconds: positive, finite and at most MAX_TIMEOUT_S, else one line."""
    t = float(timeout)
    if not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        raise UserError(f"{where} {timeout:g}: give a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return t


class PromClient:
    """Queries one Prometheus server. Thread-safe (no shared state beyond settings)."""

    def __init__(self, url: str, credentials: Credentials | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.url, from_url = check_url(url)
        self.credentials = credentials if credentials is not None else from_url or Credentials.from_env()
        self.timeout = check_timeout(timeout)

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
        auth = self.credentials.header()
        try:
            answer = post_form(self.url + path, params, auth=auth, timeout=self.timeout,
                               headers={"Content-Type": "application/x-www-form-urlencoded",
                                        "Accept": "application/json"})
        except HttpFailure as e:
            raise PromError(e.kind, e.message) from None
        if answer.status in (401, 403):
            what = "wrong credentials" if auth else "this server needs credentials"
            raise PromError(AUTH, f"{what} (HTTP {answer.status}); set a bearer token or user and password")
        if answer.status >= 300:
            raise PromError(ERROR, f"HTTP {answer.status}: {_api_error(answer.body) or answer.reason or 'refused'}")
        return rows_of(answer.body)


def rows_of(body: bytes) -> list[dict[str, Any]]:
    """The result series of an API answer, each in the shape the reader expects; PromError when it is not one."""
    try:
        doc = parse_json(body, "the answer")
    except UserError:
        raise PromError(ERROR, "the answer is not Prometheus's JSON; is this the Prometheus URL?") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise PromError(ERROR, f"query refused: {printable(err or 'unexpected answer')}")
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PromError(ERROR, "the answer has no result list; is this the Prometheus URL?")
    return [row for r in data["result"] if (row := _row(r)) is not None]


def _row(r: object) -> dict[str, Any] | None:
    """One result series as the reader expects it, or None: `metric` a dict of string labels (others dropped),
    `value` a [time, "v"] pair, `values` a list of such pairs (others dropped)."""
    if not isinstance(r, dict) or not isinstance(r.get("metric", {}), dict):
        return None
    row: dict[str, Any] = {"metric": {k: v for k, v in r.get("metric", {}).items()
                                      if isinstance(k, str) and isinstance(v, str)}}
    if "value" in r:
        if not _pair(r["value"]):
            return None
        row["value"] = r["value"]
    if "values" in r:
        if not isinstance(r["values"], list):
            return None
        row["values"] = [p for p in r["values"] if _pair(p)]
    return row


def _pair(p: object) -> bool:
    return isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float)) and not isinstance(p[0], bool) \
        and isinstance(p[1], str)


def _api_error(raw: bytes) -> str | None:
    try:
        doc = parse_json(raw, "the answer")
    except UserError:
        return None
    return printable(doc.get("error")) if isinstance(doc, dict) and doc.get("error") else None
