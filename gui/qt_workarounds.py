"""Work-arounds for defects of the Qt binding this app ships with; each names the defect and when it can go.

PySide6 6.12.0 on Python < 3.12: `SignalInstance.emit()` returns `True` without taking a reference, so each
emit of a Python-defined signal steals one reference to `True`. After some thousands of emits (a live
monitor, progress, edits) `True`'s count reaches zero and the interpreter aborts ("bool_dealloc: deallocating
True or False"), at the latest while finalising. Python 3.12+ makes True immortal, which is what this does for
older Pythons: True and False are static objects that are never freed, so a huge reference count is harmless.
Remove when the binding is fixed (check: `sys.getrefcount(True)` stays put across `sig.emit()`).
"""

from __future__ import annotations

import sys

_DONE = False


def make_bools_immortal() -> None:
    global _DONE
    if _DONE or sys.version_info >= (3, 12):
        return
    try:
        import PySide6
    except ImportError:
        return
    if not PySide6.__version__.startswith("6.12.0"):
        return  # pyproject.toml excludes 6.12.0; this guards environments installed otherwise
    import ctypes

    for obj in (True, False):
        # ob_refcnt is the first field of every CPython object.
        ctypes.c_ssize_t.from_address(id(obj)).value += 1 << 40
    _DONE = True


make_bools_immortal()
