"""The harness of benchmarks/hostile_probes.py: a probe (the project's entry point called in this process), its
time bound, and how its outcome is judged (good, weak, failed: see hostile_probes' docstring)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import resource
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GIB = 1 << 30
EXC_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b")


class _Hang(BaseException):
    pass


@dataclass
class Outcome:
    cls: str
    name: str
    verdict: str  # good | weak | failed
    why: str
    seconds: float


@dataclass
class Probe:
    cls: str
    name: str
    run: Callable[[], tuple[int, str, str]]  # (exit status, stdout, stderr)
    bad: bool | None = True  # True: must be refused; False: must be taken; None: either
    bound_s: float = 20.0
    check: Callable[[int, str, str], str] | None = None  # a failure's reason, or ""


def cli(*argv: str) -> Callable[[], tuple[int, str, str]]:
    def run() -> tuple[int, str, str]:
        import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main.main(list(argv))
            except SystemExit as e:  # argparse's usage errors
                rc = int(e.code) if isinstance(e.code, int) else 2
        return rc, out.getvalue(), err.getvalue()
    return run


def call(fn: Callable[[], object]) -> Callable[[], tuple[int, str, str]]:
    """A reader the app calls: a UserError is its one-line refusal (exit 2), a return is taken (exit 0)."""
    def run() -> tuple[int, str, str]:
        from engine.core.errors import UserError

        try:
            fn()
        except UserError as e:
            return 2, "", f"error: {e}\n"
        return 0, "", ""
    return run


@contextlib.contextmanager
def _bounded(seconds: float) -> Iterator[None]:
    def ring(_s: int, _f: object) -> None:
        raise _Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def judge(p: Probe) -> Outcome:
    rss = _peak_rss()
    t0 = time.monotonic()
    try:
        with _bounded(p.bound_s):
            rc, out, err = p.run()
    except _Hang:
        return Outcome(p.cls, p.name, "failed", f"still running after {p.bound_s:g} s", time.monotonic() - t0)
    except MemoryError:
        return Outcome(p.cls, p.name, "failed", "MemoryError (past the harness's memory ceiling)",
                       time.monotonic() - t0)
    except BaseException as e:  # noqa: BLE001 — a traceback is the finding
        return Outcome(p.cls, p.name, "failed", f"traceback: {type(e).__name__}: {str(e)[:120]}",
                       time.monotonic() - t0)
    dt = time.monotonic() - t0
    grew = _peak_rss() - rss
    if grew > GIB:
        return Outcome(p.cls, p.name, "failed", f"peak memory grew {grew / GIB:.1f} GiB", dt)
    if "Traceback (most recent call last)" in err + out:
        return Outcome(p.cls, p.name, "failed", "a traceback printed", dt)
    extra = p.check(rc, out, err) if p.check is not None else ""
    if extra:
        return Outcome(p.cls, p.name, "failed", extra, dt)
    if p.bad is True and rc == 0:
        return Outcome(p.cls, p.name, "failed", "exit 0 on bad input", dt)
    if p.bad is False and rc != 0:
        return Outcome(p.cls, p.name, "weak", f"good input refused: {err.strip()[:160]}", dt)
    if rc != 0:
        msg = err.strip() or out.strip()
        if msg.count("\n") > 0:
            return Outcome(p.cls, p.name, "weak", f"{msg.count(chr(10)) + 1} lines: {msg[:120]!r}", dt)
        if len(msg) > 400:
            return Outcome(p.cls, p.name, "weak", f"{len(msg)} characters", dt)
        if EXC_NAME.search(msg):
            return Outcome(p.cls, p.name, "weak", f"an exception's name: {msg[:160]}", dt)
        if dt > 10:
            return Outcome(p.cls, p.name, "weak", f"refused after {dt:.1f} s", dt)
    return Outcome(p.cls, p.name, "good", f"exit {rc}", dt)


# ---------------------------------------------------------------------------------------------------------------
# helpers for files

class Scratch:
    def __init__(self, root: Path):
        self.root = root
        self._n = 0

    def path(self, name: str) -> Path:
        self._n += 1
        d = self.root / f"p{self._n}"
        d.mkdir()
        return d / name

    def write(self, name: str, data: bytes | str) -> Path:
        p = self.path(name)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    def fifo(self, name: str) -> Path:
        p = self.path(name)
        os.mkfifo(p)
        return p

    def zero(self, name: str) -> Path:
        p = self.path(name)
        p.symlink_to("/dev/zero")
        return p


# values a field should never hold, and whether each is of a number's type at all
ODD: list[tuple[str, Any]] = [("a string", "512"), ("a list", [1]), ("None", None), ("NaN", math.nan),
                              ("-1", -1), ("2**63", 2**63), ("inf", math.inf), ("an object", {"a": 1}),
                              ("True", True), ("1.5", 1.5)]


