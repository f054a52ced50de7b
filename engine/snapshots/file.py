"""Reading a PyTorch memory snapshot file (`torch.cuda.memory._dump_snapshot`, gzip or plain) safely.

A snapshot is a pickle of builtin containers only (dicts, lists, tuples, strings, numbers). The unpickler here
refuses every global a pickle names (so nothing in the file is ever called), then checks the layout PyTorch has
written since 2.1: `segments`, `device_traces` and, in newer versions, `allocator_settings` and
`external_annotations`; trace entries carry `action`, `addr`, `size`, `stream`, `time_us` and `frames`.
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.bounded_read import open_regular
from ..core.errors import Cancelled, UserError
from ..core.memory_budget import MemoryBudget, memory_budget
from ..core.units import format_bytes
from .layout import check_structure

GZIP_MAGIC = b"\x1f\x8b"
ProgressFn = Callable[[float, str], None]

# What a snapshot's pickle may cost. Python objects built from a real one take 3.4-5.6 times its pickle's bytes
# (the five H200 snapshots in tests/data, a synthetic 200,000-event one); a pickle that needs more than
# MEMORY_PER_BYTE times (beyond MEMORY_FLOOR) builds something no snapshot holds: a memo index of a billion, a list
# of a billion Nones. Real snapshots compress 10-17 times; a gzip that unpacks to more than MAX_GZIP_RATIO times
# its size (beyond GZIP_FLOOR) is a bomb.
MEMORY_PER_BYTE = 24
MEMORY_FLOOR = 512 << 20
MAX_PICKLE_BYTES = 8 << 30
MAX_GZIP_RATIO = 250
GZIP_FLOOR = 16 << 20


class _Refused(pickle.UnpicklingError):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class _ContainersOnly(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; any global (a class, a function to call) is refused
    before it is looked up, so a hostile file's reduce never runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent object")


class _Counting(io.RawIOBase):
    """The file as read, reporting how far through it is (and checking for cancellation) every few MiB."""

    def __init__(self, f: io.BufferedReader, size: int, progress: ProgressFn | None, cancel: Any) -> None:
        self._f, self._size, self._progress, self._cancel = f, max(1, size), progress, cancel
        self._next = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        pos = self._f.tell()
        if pos >= self._next:
            self._next = pos + (4 << 20)
            if self._cancel is not None and self._cancel.is_set():
                raise Cancelled()
            if self._progress is not None:
                self._progress(0.5 * pos / self._size, "reading the snapshot")
        return n or 0


class _TooBig(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class _Budgeted(io.RawIOBase):
    """The pickle's bytes as the unpickler reads them (after gzip): at most `limit` of them, and the memory ceiling
    raised with each chunk to what that many bytes of a real snapshot can need."""

    def __init__(self, f: Any, limit: int, budget: MemoryBudget) -> None:
        self._f, self._limit, self._budget = f, limit, budget
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b) or 0
        self.count += n
        if self.count > self._limit:
            raise _TooBig(self._limit)
        self._budget.allow(MEMORY_FLOOR + MEMORY_PER_BYTE * self.count)
        return n


def load_snapshot_file(path: str | Path, *, progress: ProgressFn | None = None, cancel: Any = None) -> dict[str, Any]:
    """The snapshot's dict, read without executing anything. Every bad file is one UserError line."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"'{p}': no such file")
    if p.is_dir():
        raise UserError(f"'{p}' is a folder, not a snapshot file")
    # a regular file only: a FIFO would block the reader (and the app's later opens), a device never end
    fd, size = open_regular(p, what="snapshot file")
    raw = open(fd, "rb")  # noqa: SIM115 - closed below
    head = b""
    budgeted: _Budgeted | None = None
    try:
        with raw, memory_budget(MEMORY_FLOOR) as budget:
            head = raw.read(2)
            raw.seek(0)
            stream: Any = io.BufferedReader(_Counting(raw, size, progress, cancel), 1 << 20)
            limit = MAX_PICKLE_BYTES
            if head == GZIP_MAGIC:
                stream = gzip.GzipFile(fileobj=stream, mode="rb")
                limit = min(limit, max(GZIP_FLOOR, MAX_GZIP_RATIO * size))
            budgeted = _Budgeted(stream, limit, budget)
            stream = io.BufferedReader(budgeted, 1 << 20)
            data = _ContainersOnly(stream).load()
            if head == GZIP_MAGIC:
                # the pickle ends before the gzip trailer: read to the end, so that its CRC and length are checked
                while stream.read(1 << 20):
                    pass
    except Cancelled:
        raise
    except _TooBig as e:
        what = (f"its {size:,} bytes of gzip unpack to more than {e.limit:,} bytes (real snapshots compress "
                "10-17 times)" if head == GZIP_MAGIC else f"it is more than {format_bytes(e.limit)} of pickle")
        raise UserError(f"'{p}' is not a PyTorch memory snapshot this reader takes: {what}; refused") from None
    except MemoryError:
        n = budgeted.count if budgeted is not None else 0
        raise UserError(f"'{p}' is not a PyTorch memory snapshot: its first {n:,} bytes of pickle ask for more "
                        f"than {format_bytes(MEMORY_FLOOR + MEMORY_PER_BYTE * n)} of memory (a real snapshot needs "
                        "about 6 times its pickle; this one builds a huge memo or list); refused") from None
    except _Refused as e:
        raise UserError(f"'{p}' is not a PyTorch memory snapshot: it asks to load {e.what}, which a snapshot "
                        "never does; refused without running it") from None
    except (EOFError, gzip.BadGzipFile, zlib.error):
        what = "the gzip stream ends early or fails its CRC" if head == GZIP_MAGIC else "the pickle ends early"
        raise UserError(f"'{p}' is cut short or corrupt ({what}); copy the whole file again") from None
    except (pickle.UnpicklingError, ValueError, IndexError, KeyError, TypeError, AttributeError,
            UnicodeDecodeError):
        raise UserError(f"'{p}' is not a PyTorch memory snapshot (not a readable pickle); give the file "
                        "torch.cuda.memory._dump_snapshot wrote") from None
    except OSError as e:
        raise UserError(f"cannot read '{p}': {e.strerror or e}") from None
    return check_layout(data, p)


def check_layout(data: Any, p: Path | str) -> dict[str, Any]:
    """The snapshot's dict when its shape is PyTorch's; else one line saying what is wrong."""
    if isinstance(data, list) and all(isinstance(s, dict) and "blocks" in s for s in data):
        data = {"segments": data, "device_traces": []}  # torch.cuda.memory_snapshot(): the segments alone
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        got = type(data).__name__ if not isinstance(data, dict) else "a dict with keys " + ", ".join(
            map(str, list(data)[:5]))
        raise UserError(f"'{p}' is a pickle but not a PyTorch memory snapshot (it holds {got}, not 'segments' "
                        "and 'device_traces'); give the file torch.cuda.memory._dump_snapshot wrote")
    traces = data.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise UserError(f"'{p}': 'device_traces' is not a list of per-device lists; the snapshot is damaged")
    check_structure(data, p)  # every entry, field by field (it was the first and last trace entry only)
    return data


def alloc_conf_of(data: dict[str, Any]) -> str:
    """The PYTORCH_CUDA_ALLOC_CONF a snapshot was recorded with ("" when it does not say). A run that turned
    expandable segments on in code (`torch.cuda.memory._set_allocator_settings`) has an empty variable but says
    `expandable_segments: True`; that is what the allocator ran with."""
    settings = data.get("allocator_settings") or {}
    if not isinstance(settings, dict):
        return ""
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    conf = conf.strip() if isinstance(conf, str) else ""
    if settings.get("expandable_segments") is True and "expandable_segments" not in conf:
        conf = ",".join(filter(None, (conf, "expandable_segments:True")))
    return conf
