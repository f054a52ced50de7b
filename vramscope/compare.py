"""`vramscope.diff(a, b)`: two estimates side by side, as `vramscope diff A B` prints them."""

from __future__ import annotations

import os
from pathlib import Path

from engine.planning.diff import TOP_MODULES, EstimateDiff, diff_estimates, load_estimate
from engine.results.types import Estimate

EstimateLike = Estimate | str | os.PathLike[str]


def as_estimate(x: EstimateLike) -> tuple[Estimate, str]:
    """(the estimate, its name for the comparison): an Estimate as it is, a path read as `vramscope diff` reads it."""
    if isinstance(x, Estimate):
        return x, x.model_name
    return load_estimate(x), str(Path(x))


def diff(a: EstimateLike, b: EstimateLike, *, top: int = TOP_MODULES) -> EstimateDiff:
    """B against A: peak, reserved and nvidia-smi, each category at the peak, the `top` modules that changed most,
    and the configuration differences. Each may be an Estimate, a JSON file written by `vramscope estimate -o` or a
    memory snapshot. `print()` it for the table; `.grew(pct)` says what grew more than pct per cent."""
    ea, na = as_estimate(a)
    eb, nb = as_estimate(b)
    return diff_estimates(ea, eb, a_name=na, b_name=nb, top=top)
