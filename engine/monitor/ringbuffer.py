"""A thread-safe ring buffer of the latest snapshots: the sampler appends, the plots read on their own timer."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

HOUR_AT_1HZ = 3600


class RingBuffer(Generic[T]):
    """Keeps the newest `capacity` items. `version` grows on every change so a reader can skip unchanged data."""

    def __init__(self, capacity: int = HOUR_AT_1HZ, items: Iterable[T] = ()):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._lock = threading.Lock()
        self._items: deque[T] = deque(items, maxlen=capacity)
        self._version = 0

    @property
    def capacity(self) -> int:
        return self._items.maxlen or 0

    @property
    def version(self) -> int:
        return self._version

    def append(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            self._version += 1

    def extend(self, items: Iterable[T]) -> None:
        with self._lock:
            self._items.extend(items)
            self._version += 1

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._version += 1

    def resize(self, capacity: int) -> None:
        """Change the capacity, keeping the newest items."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        with self._lock:
            self._items = deque(self._items, maxlen=capacity)
            self._version += 1

    def items(self) -> list[T]:
        """A copy, oldest first; safe to iterate while the sampler keeps appending."""
        with self._lock:
            return list(self._items)

    def last(self) -> T | None:
        with self._lock:
            return self._items[-1] if self._items else None

    def __len__(self) -> int:
        return len(self._items)
