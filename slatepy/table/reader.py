"""Reading SSTs from the store: top-level indexes pinned, partitions and blocks cached.

Costs, whatever the size of the SST (RFC 0009):

* Open (once per SST): one ranged GET of the object's last ``META_PREFETCH`` bytes, which
  holds the footer, the top-level index and the properties (a second GET only when they are
  larger). With the object's size known (a manifest's ``SstHandle.object_size``) that is a
  plain range GET ``[size - prefetch, size)``; only without it a suffix GET, which Azure does
  not have. The decoded top level stays in memory ("pinned") and is counted.
* Point get: at most one GET of one index partition (cached in a byte-bounded LRU, and often
  already read with the tail) and one GET of one block; none once cached. The partition's
  bloom filter rules out most absent keys before any block is read.
* Batched get (:meth:`TableReader.get_many`): each partition and block the keys need is
  read once, the missing ones coalesced into ranged GETs (neighbours less than
  ``COALESCE_GAP`` apart, up to ``scan_read_ahead_bytes`` each), issued together.
* Scan: consecutive blocks in chunks of one ranged GET each, 64 KiB growing to
  ``scan_read_ahead_bytes``; while the caller consumes one chunk, a background thread loads
  the next (at most two chunks in memory per scan). The thread exists only while the scan
  reads from the store and is joined when the iterator is exhausted, closed or collected.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from slatepy.errors import CorruptionError
from slatepy.format.block import Block, Entry, IndexedBlock, open_block
from slatepy.format.columnar import RawColumnarBlock, open_columnar
from slatepy.format.compression import unframe_block
from slatepy.format.sst import (
    Partition,
    SstTop,
    decode_stored_block,
)
from slatepy.table.chunks import _Chunk, _ChunkLoader
from slatepy.table.grouping import Columns, Piece, _piece, grouped
from slatepy.table.sst_tops import (
    _RAW,
    SCAN_READ_AHEAD_MIN,
    Cached,
    SstTops,
    TableStats,
    _block_error,
    _named_decode,
)

__all__ = ["Piece", "TableReader", "TableStats"]  # Piece: where compactor.executor imports it

PROMOTE_AFTER_HITS = 8
"""Cache hits (gets) after which a raw cached version 3/4 block is decoded whole (see
``_block``)."""
PROMOTE_COLUMNAR_AFTER_HITS = 1
"""The same for a version 5 block: every lookup of its raw bytes decodes it whole anyway
(about 5 us for 4 KiB), so the first repeat keeps that decode. Its cost is memory: a decoded
block takes about twice its encoded size in the cache."""
COALESCE_GAP = 32 * 1024
"""A batched get reads two missing blocks (or partitions) in one GET when fewer bytes than
this lie between them: a wasted 32 KiB costs less than a request's latency and fee."""

Found = tuple[int, bytes | None]
"""``(seq, value)`` of a key in an SST (``value`` None = tombstone)."""


class TableReader(SstTops):
    """Cached access to the SSTs of one store (safe to share between threads).

    Memory: the pinned top levels (a few KB per SST, see :meth:`retain`), the meta cache of
    index partitions (``meta_cache_bytes``), the block cache (``block_cache_bytes``), and up
    to ``scan_requests_in_flight`` + 1 read-ahead chunks per running scan.

    Args:
        store: Where the SSTs are.
        cache_bytes: The old single knob: block cache size, and an eighth of it (at least
            1 MiB) for the meta cache, where the explicit sizes below are not given.
        block_cache_bytes: Bytes of decoded data blocks (``Settings.block_cache_bytes``).
        meta_cache_bytes: Bytes of decoded index partitions (``Settings.meta_cache_bytes``).
        scan_read_ahead_bytes: Largest GET a scan issues (``Settings.scan_read_ahead_bytes``).
        scan_requests_in_flight: Chunks a scan fetches ahead, each one GET in flight at a
            time (``Settings.scan_requests_in_flight``).
        meta_prefetch: Bytes read at the end of an SST to open it.
    """

    # -- point reads --------------------------------------------------------------------

    def get(
        self, path: str, key: bytes, *, size: int | None = None
    ) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` of ``key`` in the SST at ``path`` (value None = tombstone).

        Args:
            size: The object's size if known (see :meth:`top`); used only to open the SST.
        """
        # Flattened (the warm path of every get): the range check, the partition and block
        # bisects and the cached block's search inline, as SstTop.may_hold/partition_for,
        # Partition.block_for and Block.get do them.
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        first, last = props.first_key, props.last_key
        if first is None or last is None or not first <= key <= last:
            return None
        p = bisect_right(top.first_keys, key) - 1
        p = max(p, 0)
        part = self._metas.get((path, p))
        if part.__class__ is not Partition:
            part = self._load_partition(path, top, p, part)  # type: ignore[arg-type]
        j = bisect_right(part.first_keys, key) - 1
        if j < 0:
            return None
        block = self._blocks.get((path, part.first_block + j))
        if block.__class__ is Block:  # the warm path: searching the block beats the filter
            keys = block.keys
            i = bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return block.seqs[i], block.values[i]
            return None
        # The filter is asked only before a block would be read (or is not decoded yet): in
        # Python its hashing and probing cost more than a bisect of a cached block.
        if block is None and not part.may_contain(key):
            return None
        return self._block(path, top, part, j, block).get(key)

    def get_many(
        self, path: str, keys: Sequence[bytes], *, size: int | None = None
    ) -> list[Found | None]:
        """:meth:`get` of each of ``keys`` (sorted, distinct), in order.

        Every partition and block the keys need is looked up once; those not cached are read
        in coalesced ranged GETs sent together (:meth:`_read_coalesced`), so a batch costs a
        few requests where one get per key would cost one or two each.
        """
        top = self._tops.get(path) or self.top(path, size=size)
        found: list[Found | None] = [None] * len(keys)
        props = top.props
        first, last = props.first_key, props.last_key
        if first is None or last is None:
            return found
        by_partition: dict[int, list[int]] = {}
        for i in range(bisect_left(keys, first), bisect_right(keys, last)):  # keys sorted
            by_partition.setdefault(top.partition_for(keys[i]), []).append(i)
        parts = self._partitions(path, top, list(by_partition))
        by_block: dict[int, list[int]] = {}
        where: dict[int, tuple[Partition, int]] = {}
        for p, indexes in by_partition.items():
            part = parts[p]
            for i in indexes:
                j = part.block_for(keys[i])
                if j is not None:
                    by_block.setdefault(part.first_block + j, []).append(i)
                    where[part.first_block + j] = (part, j)

        def worth_reading(b: int) -> bool:
            # As in get: the filter is asked only before a block would be read.
            may_contain = where[b][0].may_contain
            return any(may_contain(keys[i]) for i in by_block[b])

        blocks = self._blocks_for(path, top, where, worth_reading)
        for b, indexes in by_block.items():
            block = blocks.get(b)  # None: the filter ruled out every key of it
            if block is not None:
                for i in indexes:
                    found[i] = block.get(keys[i])
        return found

    def _partitions(self, path: str, top: SstTop, indexes: list[int]) -> dict[int, Partition]:
        """Partitions ``indexes`` (ascending): cached, decoded from cached raw bytes, or read
        together in coalesced GETs."""
        parts: dict[int, Partition] = {}
        raws: dict[int, bytes | memoryview] = {}
        for p in indexes:
            found = self._metas.get((path, p))
            if isinstance(found, Partition):
                parts[p] = found
            elif found is not None:
                raws[p] = found
        missing = [p for p in indexes if p not in parts and p not in raws]
        spans = [(top.offsets[p], top.offsets[p + 1]) for p in missing]
        read = self._read_coalesced(path, spans, "partition_reads")
        # Copied out, so a decoded partition never keeps a whole coalesced read alive.
        raws.update(zip(missing, map(bytes, read), strict=True))
        for p, raw in raws.items():
            part = self._decode_partition(path, top, p, raw)
            self._metas.put((path, p), part, part.size_in_memory)
            parts[p] = part
        return parts

    def _blocks_for(
        self,
        path: str,
        top: SstTop,
        where: dict[int, tuple[Partition, int]],
        worth_reading: Callable[[int], bool],
    ) -> dict[int, Cached]:
        """The blocks ``where`` names (SST-wide index → its partition and place there):
        cached ones as they are (a raw version 5 one decoded, once, and cached so: each of its
        lookups would decode it whole), the others that are ``worth_reading`` read together
        in coalesced GETs and cached (the rest left out)."""
        blocks: dict[int, Cached] = {}
        missing: list[int] = []
        for b in sorted(where):
            block = self._blocks.get((path, b))
            if block is None:
                if worth_reading(b):
                    missing.append(b)
                continue
            if block.__class__ is RawColumnarBlock:
                part, j = where[b]
                block = _named_decode(path, b, block, offset=part.offsets[j])
                self._blocks.put((path, b), block, block.size_in_memory)
            blocks[b] = block
        spans = []
        for b in missing:
            part, j = where[b]
            spans.append((part.offsets[j], part.offsets[j + 1]))
        for b, data in zip(missing, self._read_coalesced(path, spans, "block_reads"), strict=True):
            part, j = where[b]
            block, cached = self._new_block(path, top, part, j, data)
            self._blocks.put((path, b), cached, cached.size_in_memory)
            blocks[b] = block
        return blocks

    def _read_coalesced(
        self, path: str, spans: list[tuple[int, int]], counter: str
    ) -> list[memoryview]:
        """The bytes of ``spans`` (ascending, disjoint), read as few ranged GETs sent together:
        neighbours closer than ``COALESCE_GAP`` share a GET of at most
        ``scan_read_ahead_bytes`` (a single span larger than that is one GET of its own)."""
        if not spans:
            return []
        merged: list[list[int]] = []
        for start, end in spans:
            last = merged[-1] if merged else None
            if (
                last is not None
                and start - last[1] < COALESCE_GAP
                and end - last[0] <= self.scan_read_ahead_bytes
            ):
                last[1] = end
            else:
                merged.append([start, end])
        datas = self.store.get_ranges(path, [(s, e) for s, e in merged])
        views: list[memoryview] = []
        spans_left = iter(spans)
        for (start, end), data in zip(merged, datas, strict=True):
            if len(data) != end - start:
                raise CorruptionError(f"{path}: the object ended before byte {end}", path=path)
            self._count(counter, len(data))
            view = memoryview(data)
            for s, e in spans_left:
                views.append(view[s - start : e - start])
                if e == end:
                    break
        return views

    def _new_block(
        self, path: str, top: SstTop, part: Partition, j: int, data: bytes | memoryview
    ) -> tuple[Block | IndexedBlock, Cached]:
        """Block ``j`` of ``part``, read for point lookups: the form to search and the one to
        cache. Raw and verified (versions 3 and 4), both; decoded, and decoded too or raw
        (version 5: it is decoded to be searched anyway, in C; cached raw only when the
        decoded form would evict something); decoded (legacy blocks), both."""
        index, offset = part.first_block + j, part.offsets[j]
        found: Block | IndexedBlock
        cached: Cached
        try:
            stored = unframe_block(data) if top.compressed_blocks else data
            if top.indexed_blocks:
                found = cached = open_block(stored)
                first = found.first_key
            elif top.columnar_blocks:
                found, raw = open_columnar(stored)
                # Decoded to be searched anyway: kept so while the cache has room for it (it
                # evicts nothing, give or take a concurrent miss), else as its bytes (half the
                # memory) until it is hit again.
                blocks = self._blocks
                fits = blocks.size + found.size_in_memory <= blocks.capacity
                cached = found if fits else raw
                first = found.keys[0]
            else:
                found = cached = decode_stored_block(stored, top)
                first = found.keys[0]
        except CorruptionError as exc:
            raise _block_error(path, index, offset, exc) from exc
        if first != part.first_keys[j]:
            raise _block_error(path, index, offset, "disagrees with the index")
        return found, cached

    def _block(
        self,
        path: str,
        top: SstTop,
        part: Partition,
        j: int,
        block: Cached | None,
    ) -> Cached:
        """Block ``j`` of ``part`` for a point lookup, given what the block cache held for it
        (``block``): that, or read and verified.

        A version 3 or 4 block read for a get is cached as its raw bytes (:class:`IndexedBlock`:
        only the keys the lookup compares are parsed, and it costs its encoded size); when a
        scan, or its ``PROMOTE_AFTER_HITS``-th cache hit by a get, finds it in the cache it is
        decoded whole and replaces itself there, so hot blocks are searched with a list
        bisect and cold ones never parsed. A version 5 block is decoded (in C) to answer
        each lookup, so it is cached decoded while the cache has room, and once full as its
        raw bytes (:class:`RawColumnarBlock`), kept decoded from its
        ``PROMOTE_COLUMNAR_AFTER_HITS``-th hit. A legacy (version 1/2) block is decoded
        whole.
        """
        index = part.first_block + j
        key = (path, index)
        if isinstance(block, _RAW):
            block.hits += 1  # racy under threads, but only a heuristic
            promote = (
                PROMOTE_COLUMNAR_AFTER_HITS
                if block.__class__ is RawColumnarBlock
                else PROMOTE_AFTER_HITS
            )
            if block.hits >= promote:
                # Hot: worth decoding once, as a list bisect beats a search of the bytes.
                block = _named_decode(path, index, block, offset=part.offsets[j])
                self._blocks.put(key, block, block.size_in_memory)
        elif block is None:
            data = self._read(path, part.offsets[j], part.offsets[j + 1], "block_reads")
            found, cached = self._new_block(path, top, part, j, data)
            self._blocks.put(key, cached, cached.size_in_memory)
            return found
        return block

    # -- scans --------------------------------------------------------------------------

    def scan(
        self,
        path: str,
        start: bytes,
        end: bytes | None,
        *,
        size: int | None = None,
        continued: bool = False,
    ) -> Iterator[Entry]:
        """Entries with ``start <= key < end`` in key order.

        Blocks not in the cache are read in chunks of consecutive blocks, one ranged GET
        each, starting at ``SCAN_READ_AHEAD_MIN`` bytes and growing fourfold up to
        ``scan_read_ahead_bytes``, so a long scan costs a few large GETs and a short one reads
        little extra. Once a chunk needed the store, the next one is loaded by a background
        thread while this one is consumed. Cached blocks are used; blocks read go to the block
        cache only from the first chunk (see :meth:`_ChunkLoader.load`).

        Args:
            continued: The scan has already read a whole SST before this one (the next SST
                of a sorted run): it is long, so its chunks start at the largest size.
        """
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        if props.first_key is None or props.last_key is None:
            return
        if props.last_key < start or (end is not None and props.first_key >= end):
            return
        loader = _ChunkLoader(self, path, top, end, cached=True, tail=b"", tail_start=0)
        first = self.scan_read_ahead_bytes if continued else SCAN_READ_AHEAD_MIN
        yield from self._stream(loader, start, end, background=True, first_bytes=first)

    def scan_columns(
        self,
        path: str,
        start: bytes,
        end: bytes | None,
        *,
        size: int | None = None,
        continued: bool = False,
        reverse: bool = False,
    ) -> Iterator[Columns]:
        """The entries of :meth:`scan` a block or more at a time (:func:`grouped`), as
        parallel lists (:data:`Columns`), so a bulk reader pays per group, not per entry.

        With ``reverse`` the blocks come last to first and each block's lists are in
        descending key order. A reverse scan reads consecutive blocks backwards in chunks of
        one ranged GET each, growing like a forward scan's, without background read-ahead.
        """
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        if props.first_key is None or props.last_key is None:
            return
        if props.last_key < start or (end is not None and props.first_key >= end):
            return
        loader = _ChunkLoader(self, path, top, end, cached=True, tail=b"", tail_start=0)
        if reverse:
            yield from grouped(self._stream_reverse(loader, start, end))
            return
        first = self.scan_read_ahead_bytes if continued else SCAN_READ_AHEAD_MIN
        yield from grouped(
            self._stream_columns(loader, start, end, background=True, first_bytes=first)
        )

    def _stream_reverse(
        self, loader: _ChunkLoader, start: bytes, end: bytes | None
    ) -> Iterator[Piece]:
        """Blocks from the last one holding a key below ``end`` back to the one holding
        ``start``; each chunk of blocks is one ranged GET, the chunks growing fourfold."""
        last = loader.last_block(end)
        budget = SCAN_READ_AHEAD_MIN
        while last >= 0:
            first = loader.back_from(last, budget, start)
            chunk = loader.load_span(first, last)
            for k in range(last - first, -1, -1):
                block = loader.block(chunk, k)
                keys = block.keys
                hi = len(keys) if end is None or keys[-1] < end else bisect_left(keys, end)
                lo = bisect_left(keys, start) if keys[0] < start else 0
                if hi > lo:
                    ks, ss, vs, plain = _piece(block, lo, hi)
                    ks.reverse()
                    ss.reverse()
                    vs.reverse()
                    yield ks, ss, vs, plain
                if keys[0] <= start:
                    return
            last = first - 1
            budget = min(budget * 4, self.scan_read_ahead_bytes)

    def scan_all(self, path: str, *, chunk_bytes: int, size: int | None = None) -> Iterator[Entry]:
        """Every entry in key order, for compaction: ``chunk_bytes`` per ranged GET, and
        nothing goes through or into the caches (nor is the SST pinned), so a compaction
        neither floods the store with requests nor evicts the read path's blocks. An SST
        that fits in the bytes read to open it (most WAL SSTs) costs that one GET.
        """
        loader = self._uncached_loader(path, size)
        if loader is not None:
            yield from self._stream(
                loader, b"", None, background=False, first_bytes=chunk_bytes, limit=chunk_bytes
            )

    def scan_all_columns(
        self, path: str, *, chunk_bytes: int, size: int | None = None
    ) -> Iterator[Piece]:
        """The entries of :meth:`scan_all` (read the same way: ``chunk_bytes`` per ranged
        GET, no caches) a block at a time, as :data:`Piece` columns: compaction's columnar
        path merges and writes whole runs of plain entries without a step per entry."""
        loader = self._uncached_loader(path, size)
        if loader is not None:
            yield from self._stream_columns(
                loader, b"", None, background=False, first_bytes=chunk_bytes, limit=chunk_bytes
            )

    def _uncached_loader(self, path: str, size: int | None) -> _ChunkLoader | None:
        """The loader of a whole-SST read that bypasses the caches (the bytes read to open
        it are its first chunk), or None for an SST without blocks."""
        top = self._tops.get(path)
        tail, tail_start = b"", 0
        if top is None:
            top, tail, tail_start = self._open(path, size)
        if top.props.block_count == 0:
            return None
        return _ChunkLoader(self, path, top, None, cached=False, tail=tail, tail_start=tail_start)

    def _stream(
        self,
        loader: _ChunkLoader,
        start: bytes,
        end: bytes | None,
        *,
        background: bool,
        first_bytes: int,
        limit: int | None = None,
    ) -> Iterator[Entry]:
        """The entries of :meth:`_stream_columns`, one by one."""
        for keys, seqs, values, _ in self._stream_columns(
            loader, start, end, background=background, first_bytes=first_bytes, limit=limit
        ):
            yield from zip(keys, seqs, values, strict=True)

    def _stream_columns(
        self,
        loader: _ChunkLoader,
        start: bytes,
        end: bytes | None,
        *,
        background: bool,
        first_bytes: int,
        limit: int | None = None,
    ) -> Iterator[Piece]:
        """Decode chunk after chunk, yielding each block's entries in ``[start, end)`` as a
        :data:`Piece` (the cached block's own lists when it is whole: read only).

        With ``background``, once a chunk needed the store (so
        warm and short scans never start a thread), the next ``scan_requests_in_flight``
        chunks are planned here and fetched by as many threads while this one is consumed:
        at most ``scan_requests_in_flight + 1`` chunks in memory, and that many GETs in
        flight, so a scan is not bound by one request's latency plus its transfer."""
        depth = self.scan_requests_in_flight
        budget = first_bytes
        limit = limit or self.scan_read_ahead_bytes
        chunk: _Chunk | None = loader.load(loader.first_block(start), budget)
        following = 0 if chunk is None else chunk.first + len(chunk.first_keys)
        planned_all = chunk is None or chunk.done
        ahead: deque[Future[_Chunk]] = deque()
        pool: ThreadPoolExecutor | None = None
        try:
            while chunk is not None:
                if background and chunk.fetched:
                    while not planned_all and len(ahead) < depth:
                        budget = min(budget * 4, limit)
                        planned = loader.plan(following, budget)
                        if planned is None:
                            planned_all = True
                            break
                        following = planned.first + len(planned.first_keys)
                        planned_all = planned.done
                        if pool is None:
                            pool = ThreadPoolExecutor(
                                depth, thread_name_prefix="slatepy-read-ahead"
                            )
                            self._count("read_ahead_threads")
                        ahead.append(pool.submit(loader.fetch, planned))
                for k in range(len(chunk.first_keys)):
                    block = loader.block(chunk, k)
                    keys = block.keys
                    lo = bisect_left(keys, start) if keys[0] < start else 0
                    if end is not None and keys[-1] >= end:
                        hi = bisect_left(keys, end)
                        if hi > lo:
                            yield _piece(block, lo, hi)
                        return
                    if lo:
                        yield _piece(block, lo, len(keys))
                    else:
                        yield keys, block.seqs, block.values, block.plain
                if ahead:
                    chunk = ahead.popleft().result()
                elif planned_all:
                    return
                else:
                    budget = min(budget * 4, limit)
                    chunk = loader.load(following, budget)
                    if chunk is not None:
                        following = chunk.first + len(chunk.first_keys)
                        planned_all = chunk.done
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
