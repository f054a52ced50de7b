"""The one reader for every file and JSON text the project reads: bounded in size, nesting and numbers.

A file is read only when it is a regular file (a FIFO, a device, a socket or a folder is refused before it is
opened for reading, and it is opened non-blocking so one swapped in meanwhile cannot block), and only up to a
size cap. JSON is parsed with its nesting depth, the digits of each number and NaN/Infinity bounded. Every way
this fails is one `UserError` line naming the file and what to do.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, NoReturn

from .errors import UserError

MIB = 1 << 20
MAX_JSON_BYTES = 64 * MIB  # a sketch, a config, a profile, a settings value: real ones are kilobytes
MAX_DEPTH = 64  # the project's own formats nest at most 6 deep; Hugging Face configs about 4
MAX_NUMBER_CHARS = 100  # a number literal longer than this is not a size, a count or a measurement


class _Refused(ValueError):
    pass


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


def open_regular(path: str | os.PathLike[str], *, where: str | None = None, what: str = "file",
                 max_bytes: int | None = None) -> tuple[int, int]:
    """(an open descriptor, the size) of the regular file at `path`, opened without blocking (a FIFO or a device
    is refused, even one swapped in after the check); the caller closes it. UserError (one line) otherwise."""
    p = Path(path)
    name = where or str(p)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UserError(f"{name}: {what} not found") from None
    except OSError as e:
        raise UserError(f"{name}: cannot read the {what} ({_reason(e)})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise UserError(f"{name}: {kind}, not a {what}; give a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise UserError(f"{name}: {st.st_size:,} bytes, more than a {what} holds ({max_bytes:,} at most)")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise UserError(f"{name}: cannot read the {what} ({_reason(e)})") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise UserError(f"{name}: cannot read the {what} ({_reason(e)})") from None
    kind = _kind(st.st_mode)  # swapped for a pipe or a device between the stat and the open
    if kind is not None:
        os.close(fd)
        raise UserError(f"{name}: {kind}, not a {what}; give a regular file")
    if os.name == "posix":
        os.set_blocking(fd, True)  # a regular file: reads never wait; the flag only guarded the open
    return fd, st.st_size


def read_bytes(path: str | os.PathLike[str], *, where: str | None = None, max_bytes: int = MAX_JSON_BYTES,
               what: str = "file") -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes`. UserError (one line) for anything else."""
    name = where or str(path)
    fd, _size = open_regular(path, where=name, what=what, max_bytes=max_bytes)
    try:
        chunks: list[bytes] = []
        got = 0
        while True:
            chunk = os.read(fd, min(MIB, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got > max_bytes:
                raise UserError(f"{name}: more than a {what} holds ({max_bytes:,} bytes at most)")
    except OSError as e:
        raise UserError(f"{name}: cannot read the {what} ({_reason(e)})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], *, where: str | None = None, max_bytes: int = MAX_JSON_BYTES,
              what: str = "file") -> str:
    """`read_bytes` decoded as UTF-8 (a BOM allowed); a binary file is one line."""
    raw = read_bytes(path, where=where, max_bytes=max_bytes, what=what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{where or path}: not a {what} (not UTF-8 text at byte {e.start:,})") from None


def _no_constant(name: str) -> NoReturn:
    raise _Refused(f"holds {name}, which JSON does not allow; give a finite number")


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"holds a number too long to read ({len(text):,} digits; no size or count has more "
                       f"than {MAX_NUMBER_CHARS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"holds a number too long to read ({len(text):,} characters; give at most "
                       f"{MAX_NUMBER_CHARS})")
    x = float(text)
    if not math.isfinite(x):
        raise _Refused(f"holds {text[:20]}, too large to be a number (beyond 1.8e308)")
    return x


def depth_of(data: Any, limit: int) -> int:
    """How deep `data` nests (a scalar is 0), counted without recursion and stopping past `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (dict, list)):
            d += 1
            if d > deepest:
                deepest = d
                if deepest > limit:
                    return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, d) for c in children if isinstance(c, (dict, list)))
    return deepest


def parse_json(text: str | bytes, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """JSON text → Python data; every way it can fail is one line naming `where`: bad syntax, NaN or Infinity,
    a number too long or too large, nesting deeper than `max_depth`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise UserError(f"{where}: not UTF-8 text (at byte {e.start:,}); is it JSON?") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except _Refused as e:
        raise UserError(f"{where}: {e}") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply (more than {max_depth} levels)") from None
    except ValueError:  # Python's own limit on the digits of an int
        raise UserError(f"{where}: holds a number too long to read (thousands of digits)") from None
    if depth_of(data, max_depth) > max_depth:
        raise UserError(f"{where}: nested too deeply (more than {max_depth} levels)")
    return data


def read_json(path: str | os.PathLike[str], *, where: str | None = None, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_DEPTH, what: str = "JSON file") -> Any:
    """The JSON in the regular file at `path`, bounded as `read_bytes` and `parse_json` are."""
    name = where or str(path)
    return parse_json(read_text(path, where=name, max_bytes=max_bytes, what=what), name, max_depth=max_depth)
