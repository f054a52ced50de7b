"""VRAMScope's desktop app: PySide6 + pyqtgraph. Shows and edits; never computes memory itself."""

from . import qt_workarounds  # noqa: F401  (must run before any signal is emitted)
