"""A byte-bounded LRU cache, used for decoded data blocks and for SST index partitions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """Least-recently-used eviction once the summed ``size`` of the entries passes ``capacity``.

    Safe to share between threads. ``hits`` and ``misses`` count :meth:`get` calls only, so
    they measure what callers asked for, not the cache's own bookkeeping. The entry put last
    always stays, even when it alone exceeds ``capacity`` (a caller is about to use it).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        # No lock: each OrderedDict call is atomic under the GIL (the keys are tuples of str
        # and int, hashed and compared in C), and an entry evicted between the two calls
        # only loses its recency bump. The counters may miss an increment under threads.
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per get)
            self._entries.move_to_end(key)
        except KeyError:
            pass
        self.hits += 1
        return found[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        with self._lock:
            self._put(key, value, size)

    def add(self, key: Hashable, value: V, size: int) -> bool:
        """Insert ``value`` unless ``key`` is present (then leave the entry, and its recency,
        alone); return whether it was inserted. Used to seed the cache with bytes read in
        passing, which must never replace what a caller already decoded."""
        with self._lock:
            if key in self._entries:
                return False
            self._put(key, value, size)
            return True

    def _put(self, key: Hashable, value: V, size: int) -> None:
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

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()
            self._size = 0
