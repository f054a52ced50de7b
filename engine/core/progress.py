"""The two callbacks every long engine call takes: a cancel token it checks, and a progress callback it calls.

`progress(fraction, message)`: fraction in 0..1 (or -1 when unknown), and what is being done, in words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class CancelToken(Protocol):
    """What a job checks to know it should stop (threading.Event fits)."""

    def is_set(self) -> bool: ...


Progress = Callable[[float, str], None]
