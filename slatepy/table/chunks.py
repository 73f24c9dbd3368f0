"""A scan's reads of one SST: consecutive blocks planned into chunks of one ranged GET
each, fetched (by read-ahead threads too), and decoded block by block; the index
partitions the plan needs read in runs."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from slatepy.errors import CorruptionError
from slatepy.format.block import Block
from slatepy.format.columnar import as_lists
from slatepy.format.sst import Partition, SstTop, block_decoder
from slatepy.table.sst_tops import (
    _RAW,
    SCAN_READ_AHEAD_MIN,
    Cached,
    SstTops,
    _block_error,
    _named_decode,
)


@dataclass(slots=True)
class _Chunk:
    """A run of consecutive blocks of one scan: the cached ones held (so they cannot be
    evicted before use) and one read covering the others.

    Block ``k`` (SST-wide ``first + k``) occupies ``[offsets[k], offsets[k+1])``; when
    ``blocks[k]`` is None its bytes are ``data[offsets[k] - base : offsets[k+1] - base]``.
    """

    first: int
    offsets: list[int]
    first_keys: list[bytes]
    blocks: list[Cached | None]
    base: int
    end: int  # base == end: every block was cached, nothing to read
    done: bool
    fill: bool
    data: bytes = b""
    fetched: bool = False


class _ChunkLoader:
    """Plans and reads the chunks of one scan. Planning (and the partition reads it needs)
    happens in the consumer's thread only; :meth:`fetch` of planned chunks may run in
    read-ahead threads, and touches nothing but its chunk.

    ``cached`` scans look blocks and partitions up in the reader's caches and fill them
    (blocks from their first chunk only); uncached ones (compaction) do neither and read
    partitions in runs held only here.
    """

    def __init__(
        self,
        reader: SstTops,
        path: str,
        top: SstTop,
        end: bytes | None,
        *,
        cached: bool,
        tail: bytes,
        tail_start: int,
    ) -> None:
        self._reader = reader
        self._path = path
        self._top = top
        self._end = end
        self._cached = cached
        self._tail = tail
        self._tail_start = tail_start
        self._part: Partition | None = None
        self._raw: dict[int, bytes] = {}  # partitions read in a run, not yet decoded
        self._last_partition = top.partition_count - 1 if end is None else top.partition_for(end)
        self._fetched = False
        self._decode = block_decoder(top)

    def first_block(self, start: bytes) -> int:
        """SST-wide index of the block where a scan from ``start`` begins."""
        part = self._partition(self._top.partition_for(start))
        j = part.block_for(start)
        return part.first_block + (j or 0)

    def last_block(self, end: bytes | None) -> int:
        """SST-wide index of the last block holding a key below ``end`` (-1: none)."""
        if end is None:
            return self._top.props.block_count - 1
        part = self._partition(self._top.partition_for(end))
        j = part.block_for(end)
        if j is None:
            return part.first_block - 1
        return part.first_block + j - (1 if part.first_keys[j] >= end else 0)

    def _span(self, index: int) -> tuple[int, int, bytes]:
        """Block ``index``'s ``(start offset, end offset, first key)``."""
        part = self._part
        if part is None or not 0 <= index - part.first_block < len(part.first_keys):
            part = self._partition(self._top.partition_of_block(index))
        j = index - part.first_block
        return part.offsets[j], part.offsets[j + 1], part.first_keys[j]

    def back_from(self, last: int, budget: int, start: bytes) -> int:
        """The first block of a reverse chunk ending with block ``last``: going back while
        the chunk stays within ``budget`` bytes and the blocks can hold keys >= ``start``."""
        chunk_end = self._span(last)[1]
        first = last
        while first > 0:
            key = self._span(first)[2]
            if key <= start:
                break
            if chunk_end - self._span(first - 1)[0] > budget:
                break
            first -= 1
        return first

    def load_span(self, first: int, last: int) -> _Chunk:
        """Blocks ``first .. last`` (inclusive) as one chunk, read."""
        begin = self._span(first)[0]
        chunk = self.plan(first, self._span(last)[1] - begin)
        if chunk is None:  # the index changed under us: impossible for a write-once SST
            raise CorruptionError(f"{self._path}: block {first} vanished from the index")
        return self.fetch(chunk)

    def load(self, first: int, budget: int) -> _Chunk | None:
        """:meth:`plan` and :meth:`fetch` the chunk from ``first``."""
        chunk = self.plan(first, budget)
        return None if chunk is None else self.fetch(chunk)

    def plan(self, first: int, budget: int) -> _Chunk | None:
        """The chunk of blocks from ``first`` spanning at most ``budget`` bytes (at least one
        block), its bytes not read yet; None when the scan has no block at ``first``."""
        self._fetched = False
        top, cache, path, end = self._top, self._reader._blocks, self._path, self._end
        offsets: list[int] = []
        keys: list[bytes] = []
        blocks: list[Cached | None] = []
        count = top.props.block_count
        index = first
        done = True
        limit = last_end = 0
        # A partition's blocks at a time (bisects and slices, not a step per block): the
        # blocks from ``first`` whose first key is below ``end`` and whose bytes end within
        # ``budget`` of the chunk's start (the first block whatever its size).
        while index < count:
            part = self._part
            if part is None or not 0 <= index - part.first_block < len(part.first_keys):
                part = self._partition(top.partition_of_block(index))
            j = index - part.first_block
            part_keys, part_offsets = part.first_keys, part.offsets
            by_end = len(part_keys) if end is None else bisect_left(part_keys, end, j)
            if not offsets:
                limit = part_offsets[j] + budget
                by_budget = max(bisect_right(part_offsets, limit, j + 1) - 1, j + 1)
            else:
                by_budget = bisect_right(part_offsets, limit, j) - 1
            stop = min(by_end, by_budget)
            if stop > j:
                offsets += part_offsets[j:stop]
                keys += part_keys[j:stop]
                if self._cached:
                    blocks += [cache.get((path, i)) for i in range(index, index + stop - j)]
                else:
                    blocks += [None] * (stop - j)
                last_end = part_offsets[stop]
                index += stop - j
            if stop < len(part_keys):
                done = by_end <= by_budget  # else the budget, not the scan's end, cut it
                break
        if not keys:
            return None
        offsets.append(last_end)
        missing = [k for k, b in enumerate(blocks) if b is None]
        base = read_end = 0
        if missing:
            base, read_end = offsets[missing[0]], offsets[missing[-1] + 1]
        # Only a scan's first, smallest chunk fills the block cache: a short scan leaves its
        # blocks cached for the next one, while a long scan (one that grew its read-ahead)
        # streams past without evicting the blocks point gets keep hot (SlateDB's scans do
        # not cache blocks at all by default; RocksDB has fill_cache=false for the same reason).
        fill = self._cached and budget <= SCAN_READ_AHEAD_MIN
        chunk = _Chunk(first, offsets, keys, blocks, base, read_end, done, fill)
        chunk.fetched = self._fetched  # partitions read for it count as needing the store
        return chunk

    def fetch(self, chunk: _Chunk) -> _Chunk:
        """Read the bytes of ``chunk``'s uncached blocks (in one ranged GET); return it."""
        if chunk.end > chunk.base:
            chunk.data, fetched = self._bytes(chunk.base, chunk.end, "block_reads")
            chunk.fetched = chunk.fetched or fetched
        return chunk

    def block(self, chunk: _Chunk, k: int) -> Block:
        """Block ``k`` of ``chunk``, decoded (and cached, if ``chunk.fill``) if it was read."""
        block = chunk.blocks[k]
        if block.__class__ is Block:
            return as_lists(block)  # cached by a get: its values may be a tuple
        if isinstance(block, _RAW):  # cached by a get: verified, decode its entries
            decoded = _named_decode(self._path, chunk.first + k, block, offset=chunk.offsets[k])
            if chunk.fill:
                self._reader._blocks.put(
                    (self._path, chunk.first + k), decoded, decoded.size_in_memory
                )
            return decoded
        if block is None:
            # Inline, as _new_block does it: this runs once per block of every scan.
            index = chunk.first + k
            start, end = chunk.offsets[k] - chunk.base, chunk.offsets[k + 1] - chunk.base
            try:
                block = self._decode(memoryview(chunk.data)[start:end])
            except CorruptionError as exc:
                raise _block_error(self._path, index, chunk.offsets[k], exc) from exc
            if block.keys[0] != chunk.first_keys[k]:
                raise _block_error(self._path, index, chunk.offsets[k], "disagrees with the index")
            if chunk.fill:
                self._reader._blocks.put((self._path, index), block, block.size_in_memory)
        return block

    def _partition(self, p: int) -> Partition:
        reader, top = self._reader, self._top
        part: Partition | None = None
        if self._cached:
            found = reader._metas.get((self._path, p))
            if isinstance(found, Partition):
                part = found
            elif found is not None:
                self._raw[p] = found
        if part is None:
            raw = self._raw.pop(p, None)
            if raw is None:
                raw = self._read_partitions(p)
            part = reader._decode_partition(self._path, top, p, raw)
            if self._cached:
                reader._metas.put((self._path, p), part, part.size_in_memory)
        self._part = part
        return part

    def _read_partitions(self, p: int) -> bytes:
        """Read partition ``p`` and, in the same GET, the following ones the scan will need
        (up to the scan's largest chunk); keep those for later; return ``p``'s bytes."""
        offsets = self._top.offsets
        last = p
        budget = self._reader.scan_read_ahead_bytes
        while last < self._last_partition and offsets[last + 2] - offsets[p] <= budget:
            last += 1
        data, fetched = self._bytes(offsets[p], offsets[last + 1], "partition_reads")
        self._fetched = self._fetched or fetched
        for q in range(p + 1, last + 1):
            self._raw[q] = data[offsets[q] - offsets[p] : offsets[q + 1] - offsets[p]]
        return data[: offsets[p + 1] - offsets[p]]

    def _bytes(self, start: int, end: int, counter: str) -> tuple[bytes, bool]:
        """Bytes ``[start, end)``, and whether the store was asked: from the tail read at
        open if it has them, else one GET."""
        if start >= self._tail_start and self._tail:
            return self._tail[start - self._tail_start : end - self._tail_start], False
        data = self._reader._read(self._path, start, end, counter)
        if len(data) != end - start:
            raise CorruptionError(
                f"{self._path}: the object ended before byte {end}", path=self._path
            )
        return data, True
