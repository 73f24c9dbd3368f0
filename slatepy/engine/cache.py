"""A byte-bounded LRU cache shared by SST metas and decoded blocks."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """Least-recently-used eviction once the summed ``size`` of the entries passes ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._size -= old[1]
            self._entries[key] = (value, size)
            self._size += size
            while self._size > self.capacity and len(self._entries) > 1:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._size -= evicted

    @property
    def size(self) -> int:
        return self._size
