"""Recording a real run for VRAMScope: PyTorch's allocator history around a user's own training loop, written as a
gzip snapshot when the loop ends and, through the out-of-memory observer, at the moment an allocation fails."""

from __future__ import annotations

import gzip
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core.atomic_write import replace_atomically
from ..cuda.alloc_history import start_history, stop_history

_active: list[_Recording] = []  # the recording the (process-wide, never removable) OOM observer writes for
_observer_installed = False


class _Recording:
    def __init__(self, path: Path, on_oom: bool):
        self.path, self.on_oom = path, on_oom
        self.oom_written = False  # the observer wrote the snapshot (said once; later ones rewrite it quietly)


def write_snapshot(path: str | Path, data: Any) -> Path:
    """`data` (torch.cuda.memory._snapshot()) as a pickle at `path`, gzip'd when the name ends in .gz; atomic."""
    p = Path(path)
    raw = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    return replace_atomically(p, gzip.compress(raw, compresslevel=6) if p.name.endswith(".gz") else raw)


def _on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
    import torch

    if not _active or not _active[-1].on_oom:
        return
    rec = _active[-1]
    try:
        write_snapshot(rec.path, torch.cuda.memory._snapshot())
        if not rec.oom_written:
            warnings.warn(f"vramscope.record: out of memory; the snapshot is in {rec.path} "
                          f"(open it with: vramscope open {rec.path})", RuntimeWarning, stacklevel=2)
        rec.oom_written = True
    except Exception as e:  # noqa: BLE001 - the observer must never hide the OOM error itself
        warnings.warn(f"vramscope.record: could not write {rec.path}: {e}", RuntimeWarning, stacklevel=2)


@contextmanager
def record(path: str | Path, *, on_oom: bool = True, max_entries: int = 100_000, dump_on_exit: bool = True,
           stacks: str = "all") -> Iterator[Path | None]:
    """Record the CUDA caching allocator's history around the block; write it to `path` (.pickle or .pickle.gz).

    `max_entries` bounds the history (the oldest events are dropped first; VRAMScope reconstructs what they left
    alive). With `on_oom`, the out-of-memory observer writes the snapshot at the failing allocation, with its
    stack (PyTorch also calls it for failures it recovers from, such as a cuDNN workspace it does without: each
    rewrites the file). When the block ends normally the snapshot of the whole run is written; when it ends with
    an exception after an out-of-memory snapshot, that one is kept.
    On a machine without a CUDA GPU it warns once and records nothing. Yields the path (None when not recording).
    """
    global _observer_installed
    import torch

    p = Path(path)
    if not p.parent.is_dir():
        raise FileNotFoundError(f"vramscope.record: folder '{p.parent}' does not exist")
    if not torch.cuda.is_available():
        warnings.warn("vramscope.record: no CUDA GPU on this machine; nothing is recorded", RuntimeWarning,
                      stacklevel=3)
        yield None
        return
    rec = _Recording(p, on_oom)
    start_history(max_entries, stacks=stacks)
    if on_oom and not _observer_installed:
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)  # type: ignore[attr-defined]
        _observer_installed = True
    _active.append(rec)
    failed = False
    try:
        yield p
    except BaseException:
        failed = True
        raise
    finally:
        _active.remove(rec)
        try:
            if dump_on_exit and not (failed and rec.oom_written):
                write_snapshot(p, torch.cuda.memory._snapshot())
        finally:
            if not _active:
                stop_history()
