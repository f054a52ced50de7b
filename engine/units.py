"""Byte formatting in binary units (KiB, MiB, GiB), labelled so, used by the CLI, the app and the report."""

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: int | float, digits: int = 2) -> str:
    """1536 -> '1.50 KiB'; negative values keep their sign."""
    sign = "-" if n < 0 else ""
    v = float(abs(n))
    for unit in _UNITS:
        if v < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(v)} B"
            return f"{sign}{v:.{digits}f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


GIB = 1024**3
MIB = 1024**2
KIB = 1024
