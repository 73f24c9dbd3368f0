"""A metrics store that answers reads of immutable objects from a local disk cache.

Ranged reads of objects under the cacheable prefixes (``compacted/``: SSTs named by a random
id and never rewritten) are served in aligned parts of ``part_size`` bytes: the parts a read
overlaps come from the disk cache where present, and the missing ones from the store in one
request (adjacent missing parts coalesced into one range, several runs of them into one
``get_ranges``), then are written to the cache. Suffix reads (an SST's footer when its size
is unknown) are cached whole under their length. Everything else (manifests, WAL SSTs, which
can be rewritten after a database is recreated at the same URL, and all writes) goes straight
to the store.

This class *is* a :class:`MetricsStore` so that a ``Db`` holds one object that both caches
and counts: ``metrics.ops`` counts only requests that reached the store, and
``metrics.cache`` the cache's hits, misses and bytes (RFC 0010).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from slatepy.store.base import ObjectStore
from slatepy.store.disk_cache.cache import DiskCache, EntryName, Evicted, Piece
from slatepy.store.disk_cache.entry import CorruptCacheEntry
from slatepy.store.metrics import MetricsStore, StoreMetrics

PART_SIZE = 1024 * 1024
FILL_LIMIT = 16 * 1024 * 1024
"""Reads spanning more bypass the cache: only bulk reads are this large (compaction reads its
inputs in chunks of up to 64 MiB), and writing a whole SST to disk that compaction is about
to replace would push the read path's parts out of the cache."""
CACHEABLE_PREFIXES = ("compacted/",)

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Tally:
    """Counters of one read, recorded into the metrics once at the end."""

    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    fetched_bytes: int = 0
    corrupt: int = 0
    errors: int = 0
    evicted: list[Evicted] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Want:
    """Bytes ``[lo, hi)`` of part ``index``, still to be fetched."""

    index: int
    lo: int
    hi: int


class DiskCachedStore(MetricsStore):
    """``inner`` with reads of immutable objects cached on local disk, and counted.

    Args:
        inner: The store below (normally with retries); every request to it is counted.
        cache: The disk cache (shared with other stores and processes).
        namespace: Tells this store's objects apart from other stores' in the cache: its
            URL and endpoint. Paths are only unique within one store.
        metrics: Counters to share; a fresh set by default.
        prefixes: Paths whose objects are immutable once written and so safe to cache.
        part_size: Bytes per cached part; reads are widened to whole parts.
        fill_limit: Reads spanning more than this go straight to the store, uncached.
    """

    def __init__(
        self,
        inner: ObjectStore,
        cache: DiskCache,
        *,
        namespace: str,
        metrics: StoreMetrics | None = None,
        prefixes: tuple[str, ...] = CACHEABLE_PREFIXES,
        part_size: int = PART_SIZE,
        fill_limit: int = FILL_LIMIT,
    ) -> None:
        super().__init__(inner, metrics)
        self.cache = cache
        self.namespace = namespace
        self.prefixes = prefixes
        self.part_size = part_size
        self.fill_limit = fill_limit
        self._warned = False

    def cacheable(self, path: str) -> bool:
        """Whether reads of ``path`` go through the disk cache."""
        return path.startswith(self.prefixes)

    def uncached(self) -> MetricsStore:
        """This stack without the cache, counting into the same metrics (for compaction)."""
        return MetricsStore(self.inner, self.metrics)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if end <= start or end - start > self.fill_limit or not self.cacheable(path):
            return super().get_range(path, start, end)
        return self._read(path, [(start, end)])[0]

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if (
            not ranges
            or any(e <= s for s, e in ranges)
            or sum(e - s for s, e in ranges) > self.fill_limit
            or not self.cacheable(path)
        ):
            return super().get_ranges(path, ranges)
        return self._read(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        if length <= 0 or length > self.fill_limit or not self.cacheable(path):
            return super().get_suffix(path, length)
        tally = _Tally()
        name = EntryName(self.namespace, path, f"s{length}")
        piece = self._lookup(name, 0, length, tally)
        if piece is not None:
            self._record(tally)
            return piece.data
        data = super().get_suffix(path, length)
        tally.misses += 1
        tally.fetched_bytes += len(data)
        self._fill(name, data, tally)
        if len(data) < length:
            # Shorter than asked: this is the whole object, so its parts are known too.
            for index in range(-(-len(data) // self.part_size)):
                part = data[index * self.part_size : (index + 1) * self.part_size]
                self._fill(self._part(path, index), part, tally)
        self._record(tally)
        return data

    def delete(self, path: str) -> None:
        super().delete(path)
        if self.cacheable(path):
            # GC deleted the object: its cached parts can never be read again.
            try:
                self.cache.forget(self.namespace, path)
            except OSError as exc:
                self._io_error(exc)
                self.metrics.record_cache(errors=1)

    def _part(self, path: str, index: int) -> EntryName:
        return EntryName(self.namespace, path, f"p{self.part_size}-{index}")

    def _read(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Serve ``ranges`` from cached parts, fetching the missing parts in one request."""
        size = self.part_size
        tally = _Tally()
        missing: set[int] = set()
        plans: list[list[bytes | _Want]] = []
        for start, end in ranges:
            plan: list[bytes | _Want] = []
            for index in range(start // size, (end - 1) // size + 1):
                lo = max(start, index * size) - index * size
                hi = min(end, (index + 1) * size) - index * size
                if index not in missing:
                    piece = self._lookup(self._part(path, index), lo, hi, tally)
                    if piece is not None:
                        plan.append(piece.data)
                        if piece.entry_len < size:
                            break  # the object ends in this part
                        continue
                    missing.add(index)
                plan.append(_Want(index, lo, hi))
            plans.append(plan)
        fetched = self._fetch(path, sorted(missing), tally) if missing else {}
        self._record(tally)
        return [_assemble(plan, fetched, size) for plan in plans]

    def _fetch(self, path: str, indexes: list[int], tally: _Tally) -> dict[int, bytes]:
        """Fetch parts ``indexes`` (sorted) in one request and cache them."""
        size = self.part_size
        runs: list[tuple[int, int]] = []
        for index in indexes:
            if runs and runs[-1][1] == index - 1:
                runs[-1] = (runs[-1][0], index)
            else:
                runs.append((index, index))
        # Each run starts one byte early. That byte always exists: it lies before the caller's
        # start, or in a part found cached whole. So a run that starts exactly at the end of
        # an object (whose size is a multiple of the part size) gets an answer of one byte,
        # where a range GET starting at the end would be refused (416).
        spans = [(max(0, first * size - 1), (last + 1) * size) for first, last in runs]
        if len(spans) == 1:
            datas = [super().get_range(path, *spans[0])]
        else:
            datas = super().get_ranges(path, spans)
        fetched: dict[int, bytes] = {}
        for (first, last), (begin, _), data in zip(runs, spans, datas, strict=True):
            body = data[first * size - begin :]
            tally.fetched_bytes += len(body)
            for index in range(first, last + 1):
                part = body[(index - first) * size : (index - first + 1) * size]
                fetched[index] = part
                tally.misses += 1
                if part:
                    self._fill(self._part(path, index), part, tally)
        return fetched

    def _lookup(self, name: EntryName, lo: int, hi: int, tally: _Tally) -> Piece | None:
        """The cached bytes, or None on a miss; a corrupt file is deleted (and a miss)."""
        try:
            piece = self.cache.read(name, lo, hi)
        except CorruptCacheEntry:
            tally.corrupt += 1
            try:
                self.cache.discard(name)
            except OSError as exc:
                self._io_error(exc)
                tally.errors += 1
            return None
        except OSError as exc:
            self._io_error(exc)
            tally.errors += 1
            return None
        if piece is None:
            return None
        tally.hits += 1
        tally.hit_bytes += len(piece.data)
        return piece

    def _fill(self, name: EntryName, data: bytes, tally: _Tally) -> None:
        try:
            tally.evicted.append(self.cache.write(name, data))
        except OSError as exc:
            self._io_error(exc)
            tally.errors += 1

    def _record(self, tally: _Tally) -> None:
        self.metrics.record_cache(
            hits=tally.hits,
            misses=tally.misses,
            hit_bytes=tally.hit_bytes,
            fetched_bytes=tally.fetched_bytes,
            evictions=sum(e.files for e in tally.evicted),
            evicted_bytes=sum(e.bytes for e in tally.evicted),
            corrupt=tally.corrupt,
            errors=tally.errors,
        )

    def _io_error(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            _log.warning(
                "disk cache at %s failed (%s); reads fall back to the store", self.cache.root, exc
            )


def _assemble(plan: list[bytes | _Want], fetched: dict[int, bytes], size: int) -> bytes:
    out: list[bytes] = []
    for step in plan:
        if isinstance(step, bytes):
            out.append(step)
            continue
        part = fetched[step.index]
        out.append(part[step.lo : step.hi])
        if len(part) < size:
            break  # the object ends in this part
    return out[0] if len(out) == 1 else b"".join(out)
