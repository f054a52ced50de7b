"""Atomic file replacement: readers see the old file or the whole new one, never a part, and a failure leaves
no temporary file behind. Every save in the project (sketches, exported code, JSON, reports) goes through it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_atomically(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to a temp file beside `path`, then rename it over. Raises OSError."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent) if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); keep an existing file's mode, else the usual rw-r--r--.
        # (Not os.umask: it is process-wide and saves may run in a worker thread.)
        os.chmod(tmp, (p.stat().st_mode & 0o777) if p.exists() else 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p
