"""What every read of a :class:`~slatepy.table.reader.TableReader` shares: the store, the
pinned SST top levels, the meta (partition) and block caches and the counters; opening an
SST (its top level, pinned) and loading its index partitions (cached)."""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field, fields

from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.block import Block, IndexedBlock
from slatepy.format.columnar import RawColumnarBlock
from slatepy.format.lookup import LookupBlock
from slatepy.format.sst import (
    FOOTER_SIZE,
    Partition,
    SstTop,
    decode_footer,
    decode_partition,
    decode_top,
)
from slatepy.store.base import ObjectStore
from slatepy.store.local_read import KeptReads
from slatepy.table.cache import LruCache

META_PREFETCH = 64 * 1024
"""Bytes read at the end of an SST when it is opened; covers the footer, top-level index and
properties of SSTs up to several GB, and the partitions too of SSTs of a few MB."""
TOP_FRACTION = 4096
"""With the size known, the open reads at least ``size // TOP_FRACTION`` bytes."""
SCAN_READ_AHEAD_MIN = 64 * 1024
SCAN_READ_AHEAD_MAX = 4 * 1024 * 1024
READ_AHEAD_DEPTH = 2
"""Chunks a long scan has in flight while it consumes one, unless ``scan_requests_in_flight``
says otherwise (``Settings.scan_requests_in_flight`` does, 4 by default; see
``TableReader._stream_columns``)."""

Cached = Block | IndexedBlock | RawColumnarBlock | LookupBlock
"""What the block cache holds for a block: decoded, or verified raw bytes (versions 3-6)."""
_RAW = (IndexedBlock, RawColumnarBlock, LookupBlock)


@dataclass(frozen=True, slots=True)
class TableStats:
    """Counters of one :class:`~slatepy.table.reader.TableReader` since it was created.

    Attributes:
        ssts_opened: Top-level indexes read and decoded (one per SST, unless released).
        pinned_ssts: SSTs whose top level is held in memory now.
        pinned_bytes: Approximate bytes of those top levels.
        partitions_decoded: Index partitions (filter included) verified and decoded.
        partition_reads: Ranged GETs issued for partitions (a scan reads runs of them).
        block_reads: Ranged GETs issued for data blocks (one block, or a scan's chunk).
        tail_reads: GETs issued to open SSTs (the footer and top level).
        bytes_read: Bytes those GETs returned.
        meta_hits: Partition lookups answered by the meta cache.
        meta_misses: Partition lookups that had to read the store.
        meta_cache_bytes: Bytes held by the meta cache now.
        block_hits: Block lookups answered by the block cache.
        block_misses: Block lookups that were not cached.
        block_cache_bytes: Bytes held by the block cache now.
        read_ahead_threads: Background read-ahead threads started by scans.
    """

    ssts_opened: int = 0
    pinned_ssts: int = 0
    pinned_bytes: int = 0
    partitions_decoded: int = 0
    partition_reads: int = 0
    block_reads: int = 0
    tail_reads: int = 0
    bytes_read: int = 0
    meta_hits: int = 0
    meta_misses: int = 0
    meta_cache_bytes: int = 0
    block_hits: int = 0
    block_misses: int = 0
    block_cache_bytes: int = 0
    read_ahead_threads: int = 0

    @property
    def store_reads(self) -> int:
        """Every GET this reader issued."""
        return self.partition_reads + self.block_reads + self.tail_reads


@dataclass(slots=True)
class _Counters:
    """The mutable counters behind :class:`TableStats` (updated from scan threads too)."""

    ssts_opened: int = 0
    partitions_decoded: int = 0
    partition_reads: int = 0
    block_reads: int = 0
    tail_reads: int = 0
    bytes_read: int = 0
    read_ahead_threads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class SstTops:
    """The state and the SST-opening half of :class:`~slatepy.table.reader.TableReader` (its
    constructor's arguments are documented there): point reads and scans build on it."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        cache_bytes: int = 64 * 1024 * 1024,
        block_cache_bytes: int | None = None,
        meta_cache_bytes: int | None = None,
        scan_read_ahead_bytes: int = SCAN_READ_AHEAD_MAX,
        scan_requests_in_flight: int = READ_AHEAD_DEPTH,
        meta_prefetch: int = META_PREFETCH,
    ) -> None:
        self.store = store
        blocks = cache_bytes if block_cache_bytes is None else block_cache_bytes
        metas = max(cache_bytes // 8, 1 << 20) if meta_cache_bytes is None else meta_cache_bytes
        self._blocks: LruCache[Cached] = LruCache(blocks)
        # Decoded partitions, or their raw bytes when they came with an SST's tail and are
        # not decoded yet (decoding verifies them).
        self._metas: LruCache[Partition | bytes] = LruCache(metas)
        self._tops: dict[str, SstTop] = {}
        # Per pinned SST: the store's one-pread shortcut for its blocks (file://), or None.
        self._kept: dict[str, KeptReads | None] = {}
        self._pinned_bytes = 0
        self._lock = threading.Lock()
        self._followed: object = None
        self._live: frozenset[str] = frozenset()
        self.scan_read_ahead_bytes = max(SCAN_READ_AHEAD_MIN, scan_read_ahead_bytes)
        self.scan_requests_in_flight = max(1, scan_requests_in_flight)
        self._prefetch = max(FOOTER_SIZE, meta_prefetch)
        self._counts = _Counters()

    # -- opening ------------------------------------------------------------------------

    def top(self, path: str, *, size: int | None = None) -> SstTop:
        """The SST's properties and top-level index, read once and then kept in memory.

        Args:
            size: The object's size when the caller knows it: the tail is then read with a
                plain range GET (stores without suffix ranges need that), and a mismatch with
                the footer is reported as corruption.

        Raises:
            NotFound: no object at ``path``.
            CorruptionError: naming ``path``.
        """
        top = self._tops.get(path)
        if top is not None:
            return top
        top, tail, tail_start = self._open(path, size)
        with self._lock:
            pinned = self._tops.get(path)
            if pinned is not None:
                return pinned
            self._tops[path] = top
            self._kept[path] = self.store.kept_reads(path)
            self._pinned_bytes += top.size_in_memory
        # Partitions that came with the tail are kept undecoded until a lookup needs one.
        for p in range(top.partition_count - 1, -1, -1):
            start, end = top.offsets[p], top.offsets[p + 1]
            if start < tail_start:
                break
            self._metas.add((path, p), tail[start - tail_start : end - tail_start], end - start)
        return top

    def meta(self, path: str, *, size: int | None = None) -> SstTop:
        """Same as :meth:`top` (the name callers used before RFC 0009)."""
        return self.top(path, size=size)

    def _open(self, path: str, size: int | None) -> tuple[SstTop, bytes, int]:
        """Read and decode the SST's top level; also return the bytes read and where they
        start in the object (for callers that can use more of them)."""
        try:
            if size is not None:
                if size < FOOTER_SIZE:
                    raise CorruptionError(f"{size} bytes is too small for an SST")
                # The top level grows with the SST (~0.01% of it with 4 KiB blocks), so a
                # known size lets one GET cover it for SSTs of any size.
                start = max(0, size - max(self._prefetch, size // TOP_FRACTION))
                tail = self._read(path, start, size, "tail_reads")
                if len(tail) != size - start:
                    raise CorruptionError("the object is shorter than its recorded size")
            else:
                tail = self.store.get_suffix(path, self._prefetch)
                self._count("tail_reads", len(tail))
            footer = decode_footer(tail)
            if size is not None and footer.object_size != size:
                raise CorruptionError(
                    f"the footer says {footer.object_size} bytes, but {size} were expected"
                )
            start = footer.object_size - len(tail)
            if start < 0 or (start > 0 and len(tail) < self._prefetch):
                raise CorruptionError("footer offsets do not match the object size")
            if footer.top_offset < start:
                head = self._read(path, footer.top_offset, start, "tail_reads")
                if len(head) != start - footer.top_offset:
                    raise CorruptionError("the object is shorter than its footer says")
                tail, start = head + tail, footer.top_offset
            section = memoryview(tail)[footer.top_offset - start : len(tail) - FOOTER_SIZE]
            top = decode_top(footer, section)
        except UnsupportedFormatVersion as exc:
            raise exc.at(path) from None
        except CorruptionError as exc:
            raise _named(path, exc) from exc
        self._count("ssts_opened")
        return top, tail, start

    def partition(self, path: str, top: SstTop, index: int) -> Partition:
        """Partition ``index`` of the SST, from the meta cache or one ranged GET."""
        found = self._metas.get((path, index))
        if isinstance(found, Partition):
            return found
        return self._load_partition(path, top, index, found)

    def _load_partition(
        self, path: str, top: SstTop, index: int, found: bytes | memoryview | None
    ) -> Partition:
        """Partition ``index``, decoded from what the meta cache held for it (``found``: its
        raw bytes, or None: then read with one ranged GET) and cached."""
        if found is None:
            found = self._read(path, top.offsets[index], top.offsets[index + 1], "partition_reads")
        part = self._decode_partition(path, top, index, found)
        self._metas.put((path, index), part, part.size_in_memory)
        return part

    def clear_caches(self) -> None:
        """Drop the cached blocks and index partitions (a closed database's memory); reads
        still work, from the store."""
        self._blocks.clear()
        self._metas.clear()

    def is_open(self, path: str) -> bool:
        """Whether the SST's top level is in memory (opening it would need no request)."""
        return path in self._tops

    # -- view tracking, counters ----------------------------------------------------------

    @property
    def followed(self) -> object:
        """The token last passed to :meth:`retain` (``engine.view`` passes the manifest)."""
        return self._followed

    def retain(self, token: object, paths: Collection[str]) -> None:
        """Release the pinned top levels of SSTs in neither ``paths`` nor the previous call's.

        Callers pass the SSTs of the view they read from whenever the view changes (with
        the view as ``token``), so memory follows the live SSTs; the previous view's stay
        pinned, as scans and gets that started on it may still be running.
        """
        live = frozenset(paths)
        with self._lock:
            keep = live | self._live
            for path in [p for p in self._tops if p not in keep]:
                self._pinned_bytes -= self._tops.pop(path).size_in_memory
                self._kept.pop(path, None)
            self._followed, self._live = token, live

    def stats(self) -> TableStats:
        """A snapshot of the counters (see :class:`TableStats`)."""
        c = self._counts
        with c.lock:
            counted = {f.name: getattr(c, f.name) for f in fields(_Counters) if f.name != "lock"}
        return TableStats(
            pinned_ssts=len(self._tops),
            pinned_bytes=self._pinned_bytes,
            meta_hits=self._metas.hits,
            meta_misses=self._metas.misses,
            meta_cache_bytes=self._metas.size,
            block_hits=self._blocks.hits,
            block_misses=self._blocks.misses,
            block_cache_bytes=self._blocks.size,
            **counted,
        )

    def _count(self, name: str, received: int = 0) -> None:
        c = self._counts
        with c.lock:
            setattr(c, name, getattr(c, name) + 1)
            c.bytes_read += received

    def _read(self, path: str, start: int, end: int, counter: str) -> bytes:
        data = self.store.get_range(path, start, end)
        self._count(counter, len(data))
        return data

    def _decode_partition(
        self, path: str, top: SstTop, index: int, raw: bytes | memoryview
    ) -> Partition:
        try:
            part = decode_partition(top, index, raw)
        except CorruptionError as exc:
            raise _named(path, exc) from exc
        self._count("partitions_decoded")
        return part


def _block_error(path: str, index: int, offset: int, what: object) -> CorruptionError:
    """A block's corruption, naming the object and where in it the block starts."""
    return CorruptionError(
        f"{path}: block {index} at byte {offset}: {what}", path=path, offset=offset
    )


def _named_decode(
    path: str, index: int, block: IndexedBlock | RawColumnarBlock | LookupBlock, *, offset: int
) -> Block:
    try:
        return block.decode()
    except CorruptionError as exc:
        raise _block_error(path, index, offset, exc) from exc


def _named(path: str, exc: CorruptionError) -> CorruptionError:
    """``exc`` with the object's path in its message and ``path`` attribute."""
    if exc.path is not None:
        return CorruptionError(str(exc), path=exc.path, offset=exc.offset)
    return CorruptionError(f"{path}: {exc}", path=path, offset=exc.offset)
