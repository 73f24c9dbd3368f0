"""A wrapping store that counts requests and bytes per operation kind.

Benchmarks, the demo and the closing notes quote these counts; they are what an object
store bills for. A store stack with a local disk cache (RFC 0010) also counts the cache's
hits, misses and bytes here, beside the requests it saved or made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from slatepy.store.base import (
    ObjectMeta,
    ObjectStore,
    ObjectWriter,
    PutData,
    PutMode,
    WrappingStore,
)

T = TypeVar("T")


@dataclass(slots=True)
class OpStats:
    """Counters for one operation kind."""

    requests: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass(slots=True)
class CacheStats:
    """Counters of a local disk cache of object data, as seen by one store stack.

    A *part* is one aligned range of an object (or one cached suffix read); hits and misses
    count parts, so ``hit_rate`` is the share of parts a read needed that the disk had.

    Attributes:
        hits: Parts served from the disk cache.
        misses: Parts fetched from the store (and then written to the cache).
        hit_bytes: Bytes served from the disk cache.
        fetched_bytes: Bytes fetched from the store for missing parts.
        evictions: Cache files this stack deleted to keep the cache under its size bound.
        evicted_bytes: Bytes of those files.
        corrupt: Cached parts that failed verification; each was deleted and refetched.
        errors: Local I/O failures (disk full, permissions); the read went to the store.
    """

    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0
    fetched_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    corrupt: int = 0
    errors: int = 0

    @property
    def hit_rate(self) -> float | None:
        """``hits / (hits + misses)``, or None when the cache was not consulted."""
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else None

    def copy(self) -> CacheStats:
        return CacheStats(
            self.hits,
            self.misses,
            self.hit_bytes,
            self.fetched_bytes,
            self.evictions,
            self.evicted_bytes,
            self.corrupt,
            self.errors,
        )

    def describe(self) -> str:
        """One line for CLI output: hit rate, hits, misses and bytes."""
        rate = self.hit_rate
        shown = "n/a" if rate is None else f"{rate:.1%}"
        return (
            f"hit rate {shown}: {self.hits} hits ({self.hit_bytes} bytes), "
            f"{self.misses} misses ({self.fetched_bytes} bytes fetched), "
            f"{self.evictions} evictions, {self.corrupt} corrupt, {self.errors} errors"
        )


@dataclass(slots=True)
class StoreMetrics:
    """Per-kind request counters and disk-cache counters, safe to update from several threads.

    ``ops`` counts requests that reached the object store (a read the disk cache answered is
    not one); ``cache`` counts what the disk cache did, when the stack has one.
    """

    ops: dict[str, OpStats] = field(default_factory=dict)
    cache: CacheStats = field(default_factory=CacheStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, kind: str, *, sent: int = 0, received: int = 0, error: bool = False) -> None:
        with self._lock:
            stats = self.ops.setdefault(kind, OpStats())
            stats.requests += 1
            stats.errors += int(error)
            stats.bytes_out += sent
            stats.bytes_in += received

    def snapshot(self) -> dict[str, OpStats]:
        """A copy of the counters at this moment."""
        with self._lock:
            return {
                k: OpStats(v.requests, v.errors, v.bytes_in, v.bytes_out)
                for k, v in self.ops.items()
            }

    def record_cache(
        self,
        *,
        hits: int = 0,
        misses: int = 0,
        hit_bytes: int = 0,
        fetched_bytes: int = 0,
        evictions: int = 0,
        evicted_bytes: int = 0,
        corrupt: int = 0,
        errors: int = 0,
    ) -> None:
        """Add to the disk-cache counters."""
        with self._lock:
            c = self.cache
            c.hits += hits
            c.misses += misses
            c.hit_bytes += hit_bytes
            c.fetched_bytes += fetched_bytes
            c.evictions += evictions
            c.evicted_bytes += evicted_bytes
            c.corrupt += corrupt
            c.errors += errors

    def cache_snapshot(self) -> CacheStats:
        """A copy of the disk-cache counters at this moment."""
        with self._lock:
            return self.cache.copy()

    def reset(self) -> None:
        with self._lock:
            self.ops.clear()
            self.cache = CacheStats()

    def requests(self, kind: str) -> int:
        with self._lock:
            stats = self.ops.get(kind)
            return stats.requests if stats else 0

    def format_table(self) -> str:
        """A small fixed-width table of the counters, for CLI output."""
        rows = [f"{'operation':<12}{'requests':>10}{'errors':>8}{'bytes out':>14}{'bytes in':>14}"]
        for kind, s in sorted(self.snapshot().items()):
            rows.append(f"{kind:<12}{s.requests:>10}{s.errors:>8}{s.bytes_out:>14}{s.bytes_in:>14}")
        cache = self.cache_snapshot()
        if cache != CacheStats():
            rows.append(f"disk cache: {cache.describe()}")
        return "\n".join(rows)


class MetricsStore(WrappingStore):
    """Counts every request made through it; ``get_ranges`` counts as one ``get_range`` per
    non-empty range (what it costs at most: obstore may merge close ranges into one GET)."""

    def __init__(self, inner: ObjectStore, metrics: StoreMetrics | None = None) -> None:
        super().__init__(inner)
        self.metrics = metrics or StoreMetrics()

    def _count(self, kind: str, fn: Callable[[], T], *, sent: int = 0) -> T:
        try:
            result = fn()
        except Exception:
            self.metrics.record(kind, sent=sent, error=True)
            raise
        self.metrics.record(kind, sent=sent, received=_received(result))
        return result

    def get(self, path: str) -> bytes:
        return self._count("get", lambda: self.inner.get(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self._count("get_range", lambda: self.inner.get_range(path, start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            datas = self.inner.get_ranges(path, ranges)
        except Exception:
            self.metrics.record("get_range", error=True)
            raise
        for data in datas:
            if data:
                self.metrics.record("get_range", received=len(data))
        return datas

    def get_suffix(self, path: str, length: int) -> bytes:
        if not self.inner.supports_suffix:
            # The backend sends a HEAD for the size first (Azure): count what is billed.
            self.metrics.record("head")
        return self._count("get_range", lambda: self.inner.get_suffix(path, length))

    def head(self, path: str) -> ObjectMeta:
        return self._count("head", lambda: self.inner.head(path))

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        return self._count("put", lambda: self.inner.put(path, data, mode=mode), sent=len(data))

    def open_writer(self, path: str) -> ObjectWriter:
        return _CountedWriter(self.inner.open_writer(path), self.metrics)

    def delete(self, path: str) -> None:
        self._count("delete", lambda: self.inner.delete(path))

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return self._count("list", lambda: self.inner.list(prefix, offset=offset))

    def copy(self, source: str, destination: str) -> None:
        self._count("copy", lambda: self.inner.copy(source, destination))


class _CountedWriter(ObjectWriter):
    """A streamed write counted as ``put`` requests: as many as the upload took (create,
    parts, complete), with its bytes on the first; a failure counts one failed ``put``."""

    def __init__(self, inner: ObjectWriter, metrics: StoreMetrics) -> None:
        self._inner = inner
        self._metrics = metrics
        self._sent = 0

    def write(self, data: PutData) -> None:
        try:
            self._inner.write(data)
        except Exception:
            self._metrics.record("put", error=True)
            raise
        self._sent += len(data)

    def commit(self) -> None:
        try:
            self._inner.commit()
        except Exception:
            self._metrics.record("put", error=True)
            raise
        self._metrics.record("put", sent=self._sent)
        for _ in range(self._inner.requests - 1):
            self._metrics.record("put")

    def abort(self) -> None:
        self._inner.abort()

    @property
    def requests(self) -> int:
        return self._inner.requests


def _received(result: object) -> int:
    if isinstance(result, bytes):
        return len(result)
    if isinstance(result, list) and result and isinstance(result[0], bytes):
        return sum(len(p) for p in result)
    return 0
