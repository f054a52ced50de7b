"""One validation of a PyTorch memory snapshot's structure, where the file is read: every trace entry, segment,
block, frame and annotation, field by field, naming the one that is wrong (as the unpickler checks globals).
The scan after it can then read every field as the type PyTorch writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import UserError, printable

MAX_SIZE = 2**62  # bytes: beyond any device; an infinite or 2**63 size is a damaged or forged file
_INT = "a whole number"


def _bad(p: Path | str, where: str, key: str, v: Any, want: str) -> UserError:
    shown = type(v).__name__ if isinstance(v, (dict, list, tuple)) else printable(repr(v), 30)
    return UserError(f"'{p}': {where}: '{key}' is {shown}, not {want}; the snapshot is damaged")


def _whole(v: Any, lo: int = 0, hi: int = MAX_SIZE) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _fields(p: Path | str, where: str, d: Any, ints: tuple[str, ...], texts: tuple[str, ...] = (),
            required: tuple[str, ...] = ()) -> None:
    if not isinstance(d, dict):
        raise UserError(f"'{p}': {where} is {type(d).__name__}, not an entry; the snapshot is damaged")
    for key in required:
        if d.get(key) is None:
            raise UserError(f"'{p}': {where} lacks '{key}'; the snapshot is damaged or from an unsupported "
                            "PyTorch version (2.1 or newer wrote it)")
    # A field may be absent (older PyTorch versions wrote fewer), but one that is there has its type: PyTorch never
    # writes None for these, and the scan reads them as numbers and text (None was an AttributeError/TypeError).
    for key in ints:
        if key in d and not _whole(d[key], -MAX_SIZE if key == "time_us" else 0):
            raise _bad(p, where, key, d[key], f"{_INT} from 0 to 2**62")
    for key in texts:
        if key in d and not isinstance(d[key], str):
            raise _bad(p, where, key, d[key], "text")
    if "frames" in d:
        _frames(p, where, d["frames"])


def _frames(p: Path | str, where: str, frames: Any) -> None:
    if frames is None:
        return
    if not isinstance(frames, (list, tuple)):
        raise _bad(p, where, "frames", frames, "a list of frames")
    for k, fr in enumerate(frames):
        _fields(p, f"{where}, frame {k}", fr, ("line",), ("name", "filename"))


def check_structure(data: dict[str, Any], p: Path | str) -> None:
    """UserError (one line naming the entry and field) for any part of `data` a snapshot cannot hold."""
    for i, seg in enumerate(data["segments"]):
        where = f"segment {i}"
        _fields(p, where, seg, ("device", "address", "total_size", "allocated_size", "active_size",
                                "requested_size", "stream"), ("segment_type",))
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise _bad(p, where, "blocks", blocks, "a list")
        for j, b in enumerate(blocks):
            _fields(p, f"{where}, block {j}", b, ("size", "requested_size", "address"), ("state",))
    for d, trace in enumerate(data.get("device_traces", [])):
        for k, e in enumerate(trace):
            _fields(p, f"trace entry {k} of device {d}", e, ("size", "addr", "time_us", "device_free", "stream"),
                    ("action",), required=("action", "size"))
    notes = data.get("external_annotations") or []
    if not isinstance(notes, list):
        raise _bad(p, "the snapshot", "external_annotations", notes, "a list")
    for k, a in enumerate(notes):
        _fields(p, f"annotation {k}", a, ("time_us", "device"), ("stage",))
        if not isinstance(a.get("name", ""), str):
            raise _bad(p, f"annotation {k}", "name", a.get("name"), "text")
    settings = data.get("allocator_settings")
    if settings is not None and not isinstance(settings, dict):
        raise _bad(p, "the snapshot", "allocator_settings", settings, "a dict")
