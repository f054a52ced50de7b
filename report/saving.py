"""Writing an export to disk atomically: a temp file in the target folder, fsync, then rename over the target.

Any failure (missing or read-only folder, full disk) becomes one UserError and leaves no temp file behind.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from engine.core.atomic_write import name_too_long, replace_atomically, target_of, writes_in_place
from engine.core.errors import UserError


def _reason(path: Path, err: OSError) -> str:
    if err.errno == errno.ENAMETOOLONG:
        return _too_long(path)
    if err.errno == errno.ENOSPC or err.errno == errno.EDQUOT:
        return f"cannot write '{path}': the disk is full; free some space or choose another folder"
    if isinstance(err, IsADirectoryError) or path.is_dir():
        return f"cannot write '{path}': it is a folder; give a file name such as '{path / 'report.pdf'}'"
    if isinstance(err, (FileNotFoundError, NotADirectoryError)):
        return f"cannot write '{path}': folder '{path.parent}' does not exist; create it or choose another"
    if isinstance(err, PermissionError) or err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write '{path}': permission denied; choose a folder you can write to"
    return f"cannot write '{path}': {err.strerror or err}"


def _too_long(path: Path) -> str:
    return name_too_long(path) or f"cannot write '{str(path)[:60]}…': the path is too long; give a shorter one"


def check_target(path: str | os.PathLike[str]) -> Path:
    """Fail before any work when `path` can obviously not be written (through links; devices and pipes as
    themselves)."""
    p = Path(path).expanduser()
    if name_too_long(p):
        raise UserError(_too_long(p))
    try:
        return _check_target(p)
    except OSError as e:  # a path the system refuses to look at (too long, a loop of links)
        raise UserError(_reason(p, e)) from None


def check_distinct(outputs: dict[str, Path]) -> None:
    """Refuse two outputs (option → checked target) that are one file, by name, through links or as hard links:
    the second would destroy the first."""
    seen: dict[str, tuple[str, Path]] = {}
    for opt, path in outputs.items():
        real = os.path.realpath(path)
        for other_real, (other_opt, other) in seen.items():
            same = real == other_real
            if not same and path.exists() and other.exists():
                try:
                    same = os.path.samefile(path, other)
                except OSError:
                    same = False
            if same:
                raise UserError(f"{other_opt} and {opt} name one file ({real}); give each output its own file")
        seen[real] = (opt, path)


def _check_target(p: Path) -> Path:
    if writes_in_place(p):
        if not os.access(p, os.W_OK):
            raise UserError(_reason(p, PermissionError(errno.EACCES, "permission denied")))
        return p
    p = target_of(p)
    if p.is_dir():
        raise UserError(_reason(p, IsADirectoryError(errno.EISDIR, "is a directory")))
    parent = p.parent
    if not parent.is_dir():
        raise UserError(_reason(p, FileNotFoundError(errno.ENOENT, "no such folder")))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(_reason(p, PermissionError(errno.EACCES, "permission denied")))
    return p


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` so that readers see either the old file or the whole new one, never a part."""
    p = check_target(path)
    try:
        return replace_atomically(p, data)
    except OSError as e:
        raise UserError(_reason(p, e)) from None
