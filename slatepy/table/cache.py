"""A byte-bounded LRU cache, used for decoded data blocks and for SST index partitions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

import msgspec

V = TypeVar("V")

RECENCY_SHIFT = 4
"""A hit reorders its entry only once ``len >> RECENCY_SHIFT`` (a sixteenth of the entries)
insertions have happened since it was last moved to the young end (see :class:`LruCache`)."""


class _Entry(msgspec.Struct, Generic[V], gc=False):
    """A cached value, its size and its ``stamp``: the cache's insertion count when it was
    last made youngest. A ``msgspec.Struct`` without GC tracking: built in C (a put is on
    every cold read's path) and never traversed by the cyclic GC (an entry is in no cycle:
    nothing a cached value holds refers back to it)."""

    value: V
    size: int
    stamp: int


class LruCache(Generic[V]):
    """Least-recently-used eviction once the summed ``size`` of the entries passes ``capacity``.

    Recency is kept approximately, so that a hit costs no writes to other entries: a hit
    moves its entry to the young end only when a sixteenth of the cache's entries or more
    were inserted since it was last moved there. An exact LRU relinks the entry and its two
    neighbours on every hit, three scattered objects, which in a large warm cache is mostly
    memory latency and was a fifth of a warm point get. So eviction treats an entry as last
    used when it was last moved, which is fewer than a sixteenth of the cache's entries in
    insertions before it really was (the window counts entries, eviction bytes: one large
    insertion may evict several); a cache that takes no insertions (all warm) moves each
    entry at most once.

    Safe to share between threads. ``hits`` and ``misses`` count :meth:`get` calls only, so
    they measure what callers asked for, not the cache's own bookkeeping. The entry put last
    always stays, even when it alone exceeds ``capacity`` (a caller is about to use it).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, _Entry[V]] = OrderedDict()
        self._size = 0
        self._inserted = 0
        self._window = 0  # len(self._entries) >> RECENCY_SHIFT, kept by _put
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
        if self._inserted - found.stamp > self._window:
            found.stamp = self._inserted
            try:  # noqa: SIM105 (contextlib.suppress costs a context manager per get)
                self._entries.move_to_end(key)
            except KeyError:
                pass
        self.hits += 1
        return found.value

    def put(self, key: Hashable, value: V, size: int) -> None:
        # The lock by acquire/release, not ``with``: every cold read puts.
        lock = self._lock
        lock.acquire()
        try:
            self._put(key, value, size)
        finally:
            lock.release()

    def put_if_room(self, key: Hashable, value: V, size: int) -> bool:
        """Insert (or replace) ``value`` if that evicts nothing; return whether it did. A
        point read caches a block decoded only so (else as its bytes, half the memory): one
        call and one lock on its path."""
        lock = self._lock
        lock.acquire()
        try:
            entries = self._entries
            old = entries.pop(key, None)
            if old is not None:
                self._size -= old.size
            if self._size + size > self.capacity:
                if old is not None:
                    entries[key] = old  # put back (as the youngest: a caller just used it)
                    self._size += old.size
                return False
            self._inserted += 1
            entries[key] = _Entry(value, size, self._inserted)
            self._size += size
            self._window = len(entries) >> RECENCY_SHIFT
            return True
        finally:
            lock.release()

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
        """Insert (or replace), evicting the oldest entries past ``capacity``; under the lock.
        In locals: it is on every cold read's path."""
        entries = self._entries
        old = entries.pop(key, None)
        total = self._size + size if old is None else self._size - old.size + size
        self._inserted = inserted = self._inserted + 1
        entries[key] = _Entry(value, size, inserted)
        if total > self.capacity:
            capacity, popitem = self.capacity, entries.popitem
            while total > capacity and len(entries) > 1:
                total -= popitem(False)[1].size
        self._size = total
        self._window = len(entries) >> RECENCY_SHIFT

    @property
    def size(self) -> int:
        return self._size

    def values(self) -> list[V]:
        """The cached values, oldest first (for inspection and tests)."""
        return [entry.value for entry in list(self._entries.values())]

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()
            self._size = 0
            self._window = 0
