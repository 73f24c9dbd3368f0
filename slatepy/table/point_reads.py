"""Point reads of SSTs: one key (:meth:`PointReads.get`: at most one partition and one
block read, the filter asked before a block would be read) and sorted batches of keys
(:meth:`PointReads.get_many`: the partitions and blocks they need read once, in coalesced
ranged GETs sent together)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

from slatepy.errors import CorruptionError
from slatepy.format.block import Block, IndexedBlock, open_block
from slatepy.format.checksum import CHECKSUM_SIZE
from slatepy.format.columnar import RawColumnarBlock, open_columnar, open_searchable
from slatepy.format.compression import unframe_block
from slatepy.format.lookup import LookupBlock, open_lookup
from slatepy.format.lookup_index import LOOKUP_ARRAY
from slatepy.format.sst import Partition, SstTop, decode_stored_block
from slatepy.table.sst_tops import Cached, SstTops, _block_error, _named_decode

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

_INDEXED = bytes((LOOKUP_ARRAY,))  # a block with a lookup index starts so (version 6)
Found = tuple[int, bytes | None]
"""``(seq, value)`` of a key in an SST (``value`` None = tombstone)."""
BlockKey = tuple[str, int]
"""A block's key in the block cache: its SST's path and its index in the SST."""


class PointReads(SstTops):
    """The point reads of :class:`~slatepy.table.reader.TableReader`."""

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
        if p < 0:  # noqa: PLR1730 (max() is a call, on every get)
            p = 0
        part = self._metas.get((path, p))
        if part.__class__ is not Partition:
            part = self._load_partition(path, top, p, part)  # type: ignore[arg-type]
        j = bisect_right(part.first_keys, key) - 1
        if j < 0:
            return None
        where = (path, part.first_block + j)
        block = self._blocks.get(where)
        if block.__class__ is LookupBlock:  # the warm path: searching the block beats the filter
            try:  # free unless it raises
                return block.get(key)
            except (CorruptionError, IndexError) as exc:
                raise _named_search(path, part, j, exc) from exc
        if block.__class__ is Block:
            keys = block.keys
            i = bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return block.seqs[i], block.values[i]
            return None
        if block is None:
            # The filter is asked only before a block would be read: in Python its hashing
            # and probing cost more than a bisect of a cached block.
            bloom = part.bloom  # Partition.may_contain, inline
            if bloom is not None and not bloom.may_contain(key):
                return None
            return self._cold_get(top, part, j, key, where)
        return self._block(path, top, part, j, block).get(key)

    def get_filtered(
        self, path: str, key: bytes, hashed: int, *, size: int | None = None
    ) -> tuple[int, bytes | None] | None:
        """:meth:`get`, with the partition's filter asked first, given the key's
        :func:`~slatepy.format.bloom.key_hash` ``hashed``: for a caller that probes many
        SSTs for one key (a get over several overlapping L0 SSTs), where most SSTs do not
        hold it and the filter, hashed once, rules them out before any block is looked up."""
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        first, last = props.first_key, props.last_key
        if first is None or last is None or not first <= key <= last:
            return None
        p = bisect_right(top.first_keys, key) - 1
        if p < 0:  # noqa: PLR1730 (max() is a call, on every get)
            p = 0
        part = self._metas.get((path, p))
        if part.__class__ is not Partition:
            part = self._load_partition(path, top, p, part)  # type: ignore[arg-type]
        bloom = part.bloom
        if bloom is not None and not bloom.may_contain_hash(hashed):
            return None
        j = bisect_right(part.first_keys, key) - 1
        if j < 0:
            return None
        where = (path, part.first_block + j)
        block = self._blocks.get(where)
        if block.__class__ is LookupBlock:
            try:  # free unless it raises
                return block.get(key)
            except (CorruptionError, IndexError) as exc:
                raise _named_search(path, part, j, exc) from exc
        if block.__class__ is Block:
            keys = block.keys
            i = bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return block.seqs[i], block.values[i]
            return None
        if block is None:
            return self._cold_get(top, part, j, key, where)
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
                try:
                    for i in indexes:
                        found[i] = block.get(keys[i])
                except (CorruptionError, IndexError) as exc:
                    raise _named_search(path, *where[b], exc) from exc
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

    def _cold_get(
        self, top: SstTop, part: Partition, j: int, key: bytes, where: BlockKey
    ) -> Found | None:
        """``key`` looked up in block ``j`` of ``part``, which the block cache does not hold:
        the block read, verified, decoded, cached (see :meth:`_new_block`) and searched.

        The cold path of every get, flattened as its warm path is (issue 33): on ``file://``
        the read is one ``pread`` of a kept descriptor (``KeptReads``; anything but a plain
        success is read again through the store stack, which maps, retries and counts), and
        a block with a lookup index (version 6) is cached as those bytes and searched; a
        version 5 block is decoded straight from them, copied to be cached raw only when
        the cache has no room for it decoded. ``where`` is the block's key in the cache (its
        SST's path and index).
        """
        path, index = where
        offsets = part.offsets
        start, end = offsets[j], offsets[j + 1]
        kept = self._kept.get(path)
        data = None if kept is None else kept.read(path, start, end)
        if data is None:
            data = self.store.get_range(path, start, end)
        c = self._counts
        c.lock.acquire()
        c.block_reads += 1
        c.bytes_read += len(data)
        c.lock.release()
        if data[:1] == _INDEXED and top.lookup_blocks and not top.compressed_blocks:
            try:  # verified (checksum, index bounds, first key) as it is opened
                lookup = LookupBlock(
                    data if data.__class__ is bytes else bytes(data), part.first_keys[j]
                )
            except CorruptionError as exc:
                raise _block_error(path, index, start, exc) from exc
            self._blocks.put(where, lookup, lookup.size_in_memory)
            try:
                return lookup.get(key)
            except (CorruptionError, IndexError) as exc:
                raise _named_search(path, part, j, exc) from exc
        if not top.columnar_blocks or top.compressed_blocks:
            found, cached = self._new_block(path, top, part, j, data)
            self._blocks.put(where, cached, cached.size_in_memory)
            return found.get(key)
        try:
            block = open_searchable(data)
        except CorruptionError as exc:
            raise _block_error(path, index, start, exc) from exc
        keys = block.keys
        if keys[0] != part.first_keys[j]:
            raise _block_error(path, index, start, "disagrees with the index")
        # Kept decoded while the cache has room for it (it evicts nothing), else as its
        # bytes (half the memory) until it is hit again.
        if not self._blocks.put_if_room(where, block, block.size_in_memory):
            raw = RawColumnarBlock(data[:-CHECKSUM_SIZE])
            self._blocks.put(where, raw, raw.size_in_memory)
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            return block.seqs[i], block.values[i]
        return None

    def _new_block(
        self, path: str, top: SstTop, part: Partition, j: int, data: bytes | memoryview
    ) -> tuple[Block | IndexedBlock | LookupBlock, Cached]:
        """Block ``j`` of ``part``, read for point lookups: the form to search and the one to
        cache. Raw and verified, both, for a block with a lookup index (version 6) or an
        offsets array (versions 3 and 4); decoded, and decoded too or raw (version 5: it is
        decoded to be searched anyway, in C; cached raw only when the decoded form would
        evict something); decoded (legacy blocks), both."""
        index, offset = part.first_block + j, part.offsets[j]
        found: Block | IndexedBlock | LookupBlock
        cached: Cached
        try:
            stored = unframe_block(data) if top.compressed_blocks else data
            indexed = top.lookup_blocks and stored[:1] == _INDEXED
            lookup = open_lookup(bytes(stored)) if indexed else None
            if lookup is not None:
                found = cached = lookup
                first = lookup.first_key()
            elif top.indexed_blocks:
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
        block: Cached,
    ) -> Cached:
        """Block ``j`` of ``part`` for a point lookup, given what the block cache held for it
        (``block``; a block it does not hold is :meth:`_cold_get`'s).

        A version 3 or 4 block read for a get is cached as its raw bytes (:class:`IndexedBlock`:
        only the keys the lookup compares are parsed, and it costs its encoded size); when a
        scan, or its ``PROMOTE_AFTER_HITS``-th cache hit by a get, finds it in the cache it is
        decoded whole and replaces itself there, so hot blocks are searched with a list
        bisect and cold ones never parsed. A version 5 block is decoded (in C) to answer
        each lookup, so it is cached decoded while the cache has room, and once full as its
        raw bytes (:class:`RawColumnarBlock`), kept decoded from its
        ``PROMOTE_COLUMNAR_AFTER_HITS``-th hit. A legacy (version 1/2) block is decoded
        whole. (A version 6 block, a :class:`LookupBlock`, is searched as it is cached:
        never promoted, never here.)
        """
        index = part.first_block + j
        key = (path, index)
        if isinstance(block, IndexedBlock | RawColumnarBlock):
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
        return block


def _named_search(path: str, part: Partition, j: int, exc: Exception) -> CorruptionError:
    """A search's damage named: a block that passed its checksum but whose lookup index
    points at the wrong bytes (a writer's bug: a slot past the entries raises
    ``IndexError``) is reported with the object and the block."""
    what = exc if isinstance(exc, CorruptionError) else f"a lookup index entry out of range ({exc})"
    return _block_error(path, part.first_block + j, part.offsets[j], what)
