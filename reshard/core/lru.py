"""A thread-safe least-recently-used cache bounded by total weight."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Values by key, least recently used out first once their weights sum over
    ``capacity``. A value heavier than the capacity is not kept.

    Args:
        capacity: the total weight kept.
        weigh: a value's weight (default 1 each: ``capacity`` counts entries).
    """

    def __init__(self, capacity: int, weigh: Callable[[V], int] = lambda _: 1) -> None:
        self.capacity = capacity
        self._weigh = weigh
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used as needed."""
        weight = self._weigh(value)
        if weight > self.capacity:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._data[key] = (value, weight)
            self._weight += weight
            while self._weight > self.capacity:
                _, (_, w) = self._data.popitem(last=False)
                self._weight -= w

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value under ``key``, made (outside the lock) and kept if absent."""
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def weight(self) -> int:
        """The total weight of what is kept."""
        with self._lock:
            return self._weight
