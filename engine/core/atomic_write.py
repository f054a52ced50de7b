"""Atomic file replacement: readers see the old file or the whole new one, never a part, and a failure leaves
no temporary file behind. Every save in the project (sketches, exported code, JSON, reports) goes through it.

A symbolic link is written through (its target is replaced, the link stays); a device or a pipe (`-o /dev/null`,
`-o /dev/stdout`, a named pipe) is written directly, never replaced. New files get the mode the umask gives
(0o666 & ~umask), existing ones keep theirs. Temp files a killed process left behind (`.name.XXXXXXXX.tmp`,
this module's pattern only) are removed once they are older than STALE_S.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time
from pathlib import Path

STALE_S = 15 * 60  # a temp file this old belongs to no running save (each takes seconds at most)
NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems
_TEMP_EXTRA = len(".") + len(".12345678.tmp")  # what a temp file's name adds to its target's


def target_of(path: str | os.PathLike[str]) -> Path:
    """The file a save to `path` writes: through symbolic links (and `~`)."""
    p = Path(path).expanduser()
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def writes_in_place(path: str | os.PathLike[str]) -> bool:
    """True for an existing file that is not a regular one (a device, a pipe, a socket): written directly."""
    try:
        mode = os.stat(target_of(path)).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _open_in_place(p: Path) -> int:
    """A descriptor to write a device or a pipe. A named pipe nobody reads would block the open for ever: it is
    opened without waiting, and one with no reader is an OSError saying so."""
    if not stat.S_ISFIFO(os.stat(p).st_mode):
        return os.open(p, os.O_WRONLY)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "no program is reading this named pipe; start its reader first",
                          str(p)) from None
        raise
    os.set_blocking(fd, True)  # a reader is there: write all of it, waiting for the reader as a pipe does
    return fd


def replace_atomically(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to a temp file beside `path`'s target, then rename it over. Raises OSError."""
    p = target_of(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if writes_in_place(p):
        with os.fdopen(_open_in_place(p), "wb") as f:
            f.write(raw)
        return Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    clean_stale_temps(folder, p.name)
    tmp, fd = _create_temp(folder, p.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, os.stat(p).st_mode & 0o7777)  # an existing file keeps its mode
        except FileNotFoundError:
            pass  # a new file: the umask already applied when the temp file was created with 0o666
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return Path(path)


def _create_temp(folder: Path, name: str) -> tuple[Path, int]:
    stem = _temp_stem(name)
    for _ in range(100):
        tmp = folder / f".{stem}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {folder / name}")


def name_too_long(path: str | os.PathLike[str]) -> str | None:
    """Why `path`'s file name cannot exist (more than NAME_MAX bytes), in words; None when it can."""
    name = Path(path).name
    size = len(name.encode("utf-8", "surrogateescape"))
    if size <= NAME_MAX:
        return None
    return f"cannot write '{name[:40]}…': its name is {size} bytes, more than a file name holds ({NAME_MAX}); " \
           "give a shorter name"


def _temp_stem(name: str) -> str:
    """`name`, cut (at a character) so that its temp file's name stays within NAME_MAX bytes: a target with a
    legal long name (250 bytes) can still be saved."""
    raw = name.encode("utf-8", "surrogateescape")
    room = NAME_MAX - _TEMP_EXTRA
    return name if len(raw) <= room else raw[:room].decode("utf-8", "ignore")


def _temp_pattern(name: str) -> re.Pattern[str]:
    # 8 characters: token_hex(4) here, and tempfile.mkstemp's names of earlier versions
    return re.compile(rf"^\.{re.escape(_temp_stem(name))}\.[a-z0-9_]{{8}}\.tmp$")


def clean_stale_temps(folder: str | os.PathLike[str], name: str, *, now: float | None = None) -> list[Path]:
    """Remove this module's temp files for `name` in `folder` older than STALE_S; the ones removed."""
    pattern = _temp_pattern(name)
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = list(os.scandir(os.fspath(folder)))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.match(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_S:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed
