"""VRAMScope's public Python API: `from vramscope import record` (see engine.snapshot_record)."""

from engine import __version__
from engine.snapshot_record import record

__all__ = ["__version__", "record"]
