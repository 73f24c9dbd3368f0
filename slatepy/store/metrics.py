"""A wrapping store that counts requests and bytes per operation kind.

Benchmarks, the demo and the closing notes quote these counts; they are what an object
store bills for. A store stack with a local disk cache (RFC 0010) also counts the cache's
hits, misses and bytes here, beside the requests it saved or made.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slatepy.store.base import (
    ObjectMeta,
    ObjectStore,
    ObjectWriter,
    PutData,
    PutMode,
    WrappingStore,
)

if TYPE_CHECKING:
    from slatepy.store.local_read import KeptReads


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
        # acquire/release around a try is cheaper than ``with`` on this path, which every
        # request takes (RFC 0006, issue 33 addendum).
        lock = self._lock
        lock.acquire()
        try:
            stats = self.ops.get(kind)
            if stats is None:
                stats = self.ops[kind] = OpStats()
            stats.requests += 1
            stats.errors += error
            stats.bytes_out += sent
            stats.bytes_in += received
        finally:
            lock.release()

    def record_reads(self, kind: str, requests: int, received: int) -> None:
        """Count ``requests`` successful reads of ``received`` bytes in all (one update)."""
        lock = self._lock
        lock.acquire()
        try:
            stats = self.ops.get(kind)
            if stats is None:
                stats = self.ops[kind] = OpStats()
            stats.requests += requests
            stats.bytes_in += received
        finally:
            lock.release()

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

    # Each request calls the inner store directly and counts in a try/except: no closure
    # per request, as every read of a file:// database goes through here.

    def get(self, path: str) -> bytes:
        try:
            data = self.inner.get(path)
        except Exception:
            self.metrics.record("get", error=True)
            raise
        self.metrics.record_reads("get", 1, len(data))
        return data

    def get_range(self, path: str, start: int, end: int) -> bytes:
        try:
            data = self.inner.get_range(path, start, end)
        except Exception:
            self.metrics.record("get_range", error=True)
            raise
        self.metrics.record_reads("get_range", 1, len(data))
        return data

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            datas = self.inner.get_ranges(path, ranges)
        except Exception:
            self.metrics.record("get_range", error=True)
            raise
        sizes = [len(data) for data in datas if data]
        if sizes:
            self.metrics.record_reads("get_range", len(sizes), sum(sizes))
        return datas

    def get_suffix(self, path: str, length: int) -> bytes:
        if not self.inner.supports_suffix:
            # The backend sends a HEAD for the size first (Azure): count what is billed.
            self.metrics.record("head")
        try:
            data = self.inner.get_suffix(path, length)
        except Exception:
            self.metrics.record("get_range", error=True)
            raise
        self.metrics.record_reads("get_range", 1, len(data))
        return data

    def head(self, path: str) -> ObjectMeta:
        try:
            meta = self.inner.head(path)
        except Exception:
            self.metrics.record("head", error=True)
            raise
        self.metrics.record("head")
        return meta

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        try:
            e_tag = self.inner.put(path, data, mode=mode)
        except Exception:
            self.metrics.record("put", sent=len(data), error=True)
            raise
        self.metrics.record("put", sent=len(data))
        return e_tag

    def open_writer(self, path: str) -> ObjectWriter:
        return _CountedWriter(self.inner.open_writer(path), self.metrics)

    def kept_reads(self, path: str) -> KeptReads | None:
        """The inner stack's shortcut, counting its reads here (see ``KeptReads``)."""
        kept = self.inner.kept_reads(path)
        return None if kept is None else kept.counted(self.metrics)

    def delete(self, path: str) -> None:
        try:
            self.inner.delete(path)
        except Exception:
            self.metrics.record("delete", error=True)
            raise
        self.metrics.record("delete")

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        try:
            listed = self.inner.list(prefix, offset=offset)
        except Exception:
            self.metrics.record("list", error=True)
            raise
        self.metrics.record("list")
        return listed

    def copy(self, source: str, destination: str) -> None:
        try:
            self.inner.copy(source, destination)
        except Exception:
            self.metrics.record("copy", error=True)
            raise
        self.metrics.record("copy")


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
