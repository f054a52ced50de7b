"""A memory guard for a project's own tests: `assert_peak_within(estimate, "baseline.json", percent=5)` fails the
test, saying what grew, when the estimate's peak or reserved figure is more than `percent` above the baseline's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.core.atomic_write import replace_atomically
from engine.planning.diff import EstimateDiff
from engine.results.types import Estimate

from .compare import EstimateLike, diff


def assert_peak_within(estimate: Estimate, baseline: EstimateLike, percent: float = 5.0, *,
                       update: bool = False) -> EstimateDiff:
    """Raise AssertionError (the growth, then the whole comparison) when `estimate`'s peak or reserved bytes are more
    than `percent` per cent above `baseline`'s: an Estimate, or a file written by `vramscope estimate -o` or by this
    function. With `update`, a baseline path is (re)written from `estimate` and the check passes: run it so once,
    then commit the file. Returns the comparison."""
    if not isinstance(baseline, Estimate):
        path = Path(baseline)
        if update:
            replace_atomically(path, json.dumps(estimate.to_json(), indent=2))
        elif not path.exists():
            raise AssertionError(f"memory baseline '{path}' not found: write it once with "
                                 f"assert_peak_within(..., update=True) (or `vramscope estimate ... -o {path}`) and "
                                 "commit it")
    elif update:
        raise ValueError("update=True needs the baseline as a path to write")
    d = diff(baseline, estimate)
    grew = d.grew(percent)
    if grew:
        raise AssertionError("memory grew: " + "; ".join(grew) + os.linesep + d.text())
    return d
