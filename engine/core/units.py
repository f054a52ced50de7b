"""Byte formatting in binary units (KiB, MiB, GiB) and counts in decimal ones (k, M, B), used by the CLI, the app
and the report."""

from __future__ import annotations

import math
from decimal import Decimal

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int | float, digits: int = 2) -> str:
    """1536 -> '1.50 KiB'; negative values keep their sign; never raises (a 400-digit count, NaN, infinity)."""
    try:
        v = float(abs(n))
    except OverflowError:  # an int beyond a float: Decimal keeps its magnitude
        return f"{'-' if n < 0 else ''}{Decimal(abs(n)) / Decimal(1024) ** 6:.{digits}e} EiB"
    if math.isnan(v):
        return "n/a"
    sign = "-" if n < 0 else ""
    if math.isinf(v):
        return f"{sign}∞ B"
    for unit in _UNITS:
        if v < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(v)} B"
            if v >= 1e6:  # beyond a million EiB: scientific, not a 300-digit row
                return f"{sign}{v:.{digits}e} {unit}"
            return f"{sign}{v:.{digits}f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def format_count(n: int | float | None) -> str:
    """11689512 -> '11.69 M' (parameter counts, in decimal units as papers quote them); None -> '—'."""
    if n is None:
        return "—"
    try:
        v = float(n)
    except OverflowError:  # a count beyond a float (a sketch field of 400 digits): never raise while painting
        return f"{Decimal(n) / Decimal(10**9):.2e} B"
    if not math.isfinite(v):
        return "—"
    if abs(v) >= 1e15:
        return f"{v / 1e9:.2e} B"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{int(v)}"


GIB = 1024**3
MIB = 1024**2
KIB = 1024
