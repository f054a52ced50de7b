"""The largest sizes the engine models, and the one-line "too large" errors beyond them.

Beyond these a figure would overflow torch's 64-bit sizes or the allocator model's 64-bit counters; a user
who types an extra digit gets the field named, not an OverflowError.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .errors import UserError

MAX_BYTES = 2**62  # 4 EiB: the live bytes of a step, and of any one tensor
# Upper bounds of the training configuration's whole numbers (each far beyond any real run).
MAX_CONFIG = {
    "batch_size": 2**40,
    "seq_len": 2**40,
    "image_size": 2**24,
    "grad_accum": 2**62,
    "world_size": 2**24,
    "tp": 2**24,
    "prompt_len": 2**40,
    "new_tokens": 2**40,
}
MAX_FIELD = 2**40  # a layer field (features, channels, vocabulary, kernel size, …)


def is_overflow(e: BaseException) -> bool:
    """torch's and Python's ways of saying a size does not fit 64 bits."""
    if isinstance(e, (OverflowError, MemoryError)):
        return True
    text = str(e).lower()
    return isinstance(e, (RuntimeError, TypeError, ValueError)) and (
        "overflow" in text or "too large" in text or "exceeds the limit" in text
    )


def too_large(what: str, sizes: str) -> UserError:
    """`what` was too large to model; `sizes` names the settings to lower."""
    return UserError(f"too large to model: {what}; lower {sizes}")


def check_live_bytes(events: Iterable[Sequence[Any]], sizes: str) -> None:
    """Raise the one-line error when any tensor, or the step's live total, passes MAX_BYTES."""
    running = 0
    for ev in events:
        n = ev[1]
        running += n
        if n > MAX_BYTES or running > MAX_BYTES:
            what = "one tensor" if n > MAX_BYTES else "the step's live tensors"
            raise too_large(f"{what} would take more than 4 EiB (2**62 bytes)", sizes)
