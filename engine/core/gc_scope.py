"""An estimate's full garbage collections without the objects that were alive before it.

Python's cyclic collector walks every tracked object in a full collection: with torch (and transformers) imported
that is some 300,000 objects, walked again by each full collection an estimate triggers (an 80-layer step's
trace makes enough objects for two, 0.2-0.3 s each on this machine). While an estimate runs, the objects alive
when it began are set aside (gc.freeze), so its collections walk only what it made; they go back to the
collector's oldest generation when it ends (gc.unfreeze). Nothing the collector would have freed is kept, only
freed later: garbage made before the estimate waits for the first full collection after it.

While it runs, the youngest generation is also collected less often (every YOUNG_THRESHOLD new objects, not 700):
an 80-layer step's trace makes a million short-lived objects, and 350 young collections found 29,000 of them
garbage (fake tensors' reference cycles) for 40 ms; at this threshold nine do it in under half that time
(benchmarks/RESULTS.md, depth section). The process's own thresholds come back when the last estimate ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # estimates running now (the planner's may overlap): the first to begin freezes, the last to end thaws
_frozen = False
_thresholds: tuple[int, int, int] | None = None  # the process's, while an estimate runs with YOUNG_THRESHOLD
YOUNG_THRESHOLD = 20_000


@contextmanager
def older_objects_set_aside() -> Iterator[None]:
    """The objects alive now left out of the collections made inside the block (see the module's docstring).
    Nothing is done when the collector is off or the process has set objects aside itself (gc.freeze): its own
    frozen objects are never thawed here."""
    global _depth, _frozen, _thresholds
    with _lock:
        if _depth == 0:
            _frozen = gc.isenabled() and gc.get_freeze_count() == 0
            if _frozen:
                gc.freeze()
            young, middle, old = gc.get_threshold()
            if 0 < young < YOUNG_THRESHOLD:  # (0: the process turned collection off by threshold)
                _thresholds = (young, middle, old)
                gc.set_threshold(YOUNG_THRESHOLD, middle, old)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _frozen:
                gc.unfreeze()
                _frozen = False
            if _depth == 0 and _thresholds is not None:
                gc.set_threshold(*_thresholds)
                _thresholds = None
