"""Recording monitor sessions to CSV or JSON Lines, and reading them back as a replay source.

JSON Lines: one Snapshot per line (after a header line). CSV: one row per GPU per snapshot, the nested parts
(processes, MIG devices, unavailable metrics) as JSON cells. Both round-trip every value exactly.
The file appears under its name only when the recording is closed (written to a temp file, then renamed).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from engine.core.bounded_read import parse_json, read_text
from engine.core.errors import UserError, printable

from .samples import GpuSnapshot, Snapshot

HEADER = {"format": "vramscope-monitor", "version": 1}
_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}

_NESTED = ("mig_devices", "processes", "unavailable", "labels")
_GPU_COLUMNS = [f.name for f in fields(GpuSnapshot) if f.name not in _NESTED]
CSV_COLUMNS = ["time", "driver_version", "error"] + ["gpu_" + c for c in _GPU_COLUMNS] + list(_NESTED)
_INT_FIELDS = {f.name for f in fields(GpuSnapshot) if str(f.type).startswith("int")}

MAX_RECORDING_BYTES = 1 << 30  # a week of one sample a second from 8 GPUs is a few hundred MiB


def format_for(path: str | Path, fmt: str | None = None) -> str:
    if fmt:
        if fmt not in ("csv", "jsonl"):
            raise UserError(f"unknown recording format {fmt!r}; use csv or jsonl")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise UserError(f"{path}: cannot tell the format from the name; end it in .csv or .jsonl")
    return _SUFFIXES[suffix]


def _csv_rows(snap: Snapshot) -> list[list[object]]:
    head: list[object] = [repr(snap.time), snap.driver_version or "", snap.error or ""]
    if not snap.gpus:
        return [head + [""] * (len(CSV_COLUMNS) - 3)]
    rows = []
    for g in snap.gpus:
        d = g.to_json()
        cells = ["" if d[c] is None else d[c] for c in _GPU_COLUMNS]
        nested = [json.dumps(d[c], separators=(",", ":")) for c in _NESTED]
        rows.append(head + cells + nested)
    return rows


class Recorder:
    """Appends snapshots to a file; `close()` puts it in place. Safe to call from the sampler thread."""

    def __init__(self, path: str | Path, fmt: str | None = None):
        self.path = Path(path)
        self.format = format_for(self.path, fmt)
        if not self.path.parent.is_dir():
            raise UserError(f"{self.path}: folder {self.path.parent} does not exist; pick an existing folder")
        self._tmp = self.path.with_name(self.path.name + ".part")
        self._lock = threading.Lock()
        try:
            self._f: io.TextIOBase | None = open(self._tmp, "w", encoding="utf-8", newline="")
        except OSError as e:
            raise UserError(f"{self.path}: cannot write here ({e.strerror}); pick another file") from None
        self._csv = csv.writer(self._f) if self.format == "csv" else None
        if self._csv is not None:
            self._csv.writerow(CSV_COLUMNS)
        else:
            self._f.write(json.dumps(HEADER) + "\n")
        self.count = 0
        self._good = 0  # bytes of the .part file that hold whole samples (a failed write may leave a torn line)
        try:
            self._f.flush()
            self._good = self._f.tell()
        except OSError as e:
            self._abandon()
            raise UserError(f"{self.path}: cannot write here ({e.strerror or e}); pick another file") from None

    def write(self, snap: Snapshot) -> None:
        """Appends one snapshot; on a write failure (a full disk) the recording ends: the samples written so far
        are put in place, and one UserError says so."""
        with self._lock:
            if self._f is None:
                return
            try:
                if self._csv is not None:
                    self._csv.writerows(_csv_rows(snap))
                else:
                    self._f.write(json.dumps(snap.to_json(), separators=(",", ":")) + "\n")
                self._f.flush()  # a crash still leaves everything up to the last sample in the .part file
                self._good = self._f.tell()
            except OSError as e:
                kept = self._end_early()
                reason = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
                what = f"the {self.count} samples before it are in {self.path}" if kept else "nothing was recorded"
                raise UserError(f"recording to {self.path} stopped: {reason}; {what}") from None
            self.count += 1

    def _end_early(self) -> bool:
        """After a failed write: the whole samples so far in place (True), or no file at all (False)."""
        f, self._f = self._f, None
        try:
            if f is not None:
                f.close()  # flushing the rest fails again on a full disk; what was flushed stays
        except OSError:
            pass
        try:
            if self.count:
                os.truncate(self._tmp, self._good)  # drop a torn last line
                os.replace(self._tmp, self.path)
                return True
            os.unlink(self._tmp)
        except OSError:
            pass
        return False

    def _abandon(self) -> None:
        f, self._f = self._f, None
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    def close(self) -> Path:
        with self._lock:
            if self._f is not None:
                f, self._f = self._f, None
                try:
                    f.close()
                    os.replace(self._tmp, self.path)
                except OSError as e:
                    if not self._good:
                        raise UserError(f"recording to {self.path} failed: {e.strerror or e}") from None
                    try:
                        os.truncate(self._tmp, self._good)
                        os.replace(self._tmp, self.path)
                    except OSError:
                        raise UserError(f"recording to {self.path} failed: {e.strerror or e}; what was "
                                        f"recorded is in {self._tmp}") from None
        return self.path

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save_recording(path: str | Path, snapshots: Iterable[Snapshot], fmt: str | None = None) -> Path:
    with Recorder(path, fmt) as r:
        for s in snapshots:
            r.write(s)
    return r.path


# -- reading ------------------------------------------------------------------------------------------


def _cell(name: str, text: str) -> bool | int | str | None:
    if text == "":
        return None
    if name in ("mig_mode",):
        return text == "True"
    if name in _INT_FIELDS:
        return int(text)
    return text


def _read_csv(path: Path, text: str) -> list[Snapshot]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None or header[:3] != CSV_COLUMNS[:3] or "gpu_index" not in header:
        raise UserError(f"{path}: not a VRAMScope monitor recording (unexpected CSV header); record one first")
    col = {c: k for k, c in enumerate(header)}
    out: list[Snapshot] = []
    key: tuple[str, str, str] | None = None
    gpus: list[GpuSnapshot] = []
    for lineno, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            rec = {c: row[k] if k < len(row) else "" for c, k in col.items()}
            float(rec["time"])  # a damaged time cell fails here, with its line number
            this = (rec["time"], rec["driver_version"], rec["error"])
            g = None
            if rec.get("gpu_index", "") != "":
                d: dict[str, Any] = {c: _cell(c, rec.get("gpu_" + c, "")) for c in _GPU_COLUMNS}
                for c in _NESTED:
                    d[c] = parse_json(rec[c], f"{path} line {lineno}") if rec.get(c) else \
                        ({} if c == "unavailable" else [])
                d["status"] = d["status"] or "ok"
                g = GpuSnapshot.from_json(d)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
            raise UserError(f"{path} line {lineno}: unreadable row ({printable(e, 80)}); the recording is damaged") \
                from None
        if this != key:
            if key is not None:
                out.append(Snapshot(time=float(key[0]), gpus=tuple(gpus), error=key[2] or None,
                                    driver_version=key[1] or None))
            key, gpus = this, []
        if g is not None:
            gpus.append(g)
    if key is not None:
        out.append(Snapshot(time=float(key[0]), gpus=tuple(gpus), error=key[2] or None, driver_version=key[1] or None))
    return out


def _read_jsonl(path: Path, text: str) -> list[Snapshot]:
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = parse_json(line, f"{path} line {lineno}")
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            if "time" not in d:
                if d.get("format") == HEADER["format"]:
                    if d.get("version") != HEADER["version"]:  # another version's fields may mean other things
                        raise ValueError(f"a recording of version {printable(d.get('version'), 20)}; this "
                                         f"VRAMScope reads version {HEADER['version']}")
                    continue
                raise ValueError("no 'time' field")
            out.append(Snapshot.from_json(d))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
            raise UserError(f"{path} line {lineno}: not a monitor snapshot ({printable(e, 80)}); open a VRAMScope "
                            "recording") from None
    return out


def load_recording(path: str | Path) -> list[Snapshot]:
    """All snapshots of a recording, oldest first. Bad files → UserError naming the file and line."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file; pick a recorded .csv or .jsonl session")
    # a regular file (a FIFO or /dev/zero: one line), of at most MAX_RECORDING_BYTES
    text = read_text(p, max_bytes=MAX_RECORDING_BYTES, what="monitor recording")
    stripped = text.lstrip()
    fmt = "jsonl" if stripped.startswith("{") else "csv" if stripped.startswith("time,") else None
    if fmt is None:
        if not stripped:
            raise UserError(f"{p}: the file is empty; record a session first")
        raise UserError(f"{p}: not a VRAMScope monitor recording; open a .csv or .jsonl recorded by VRAMScope")
    snaps = _read_jsonl(p, text) if fmt == "jsonl" else _read_csv(p, text)
    if not snaps:
        raise UserError(f"{p}: the recording holds no samples; record a longer session")
    return snaps


class ReplaySource:
    """Plays recorded snapshots back, one per `sample()`, with their original times; None at the end."""

    def __init__(self, snapshots: Iterable[Snapshot]):
        self.snapshots: list[Snapshot] = list(snapshots)
        self.position = 0

    @classmethod
    def from_path(cls, path: str | Path) -> ReplaySource:
        return cls(load_recording(path))

    def __len__(self) -> int:
        return len(self.snapshots)

    @property
    def finished(self) -> bool:
        return self.position >= len(self.snapshots)

    def rewind(self) -> None:
        self.position = 0

    def sample(self) -> Snapshot | None:
        if self.finished:
            return None
        s = self.snapshots[self.position]
        self.position += 1
        return s

    def close(self) -> None:
        pass

