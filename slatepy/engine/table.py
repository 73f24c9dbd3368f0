"""Reading SSTs from the store: metas and blocks, cached.

An SST's meta (index, filter, properties) costs one suffix GET (a second ranged GET only
when the meta exceeds ``META_PREFETCH``); after that a point lookup costs at most one ranged
GET of one block, and none when the key range or the bloom filter rules the SST out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from slatepy.engine.cache import LruCache
from slatepy.errors import CorruptionError
from slatepy.format.block import Block, Entry, decode_block
from slatepy.format.sst import FOOTER_SIZE, SstMeta, decode_footer, decode_meta
from slatepy.store.base import ObjectStore

META_PREFETCH = 64 * 1024
SCAN_READ_AHEAD_MIN = 64 * 1024
SCAN_READ_AHEAD_MAX = 4 * 1024 * 1024
COMPACTED_DIR = "compacted"


def compacted_path(sst_id: str) -> str:
    """Where the compacted SST ``sst_id`` lives."""
    return f"{COMPACTED_DIR}/{sst_id}.sst"


class TableReader:
    """Cached access to SSTs of one store (safe to share between threads)."""

    def __init__(self, store: ObjectStore, *, cache_bytes: int = 64 * 1024 * 1024) -> None:
        self.store = store
        self._metas: LruCache[SstMeta] = LruCache(max(cache_bytes // 8, 1 << 20))
        self._blocks: LruCache[Block] = LruCache(cache_bytes)

    def meta(self, path: str) -> SstMeta:
        cached = self._metas.get(path)
        if cached is not None:
            return cached
        tail = self.store.get_suffix(path, META_PREFETCH)
        footer = decode_footer(tail)
        start = len(tail) - FOOTER_SIZE - footer.meta_len
        if start >= 0:
            meta_bytes = tail[start : len(tail) - FOOTER_SIZE]
        else:
            meta_bytes = self.store.get_range(
                path, footer.meta_offset, footer.meta_offset + footer.meta_len
            )
        meta = decode_meta(footer, meta_bytes)
        self._metas.put(path, meta, meta.size_in_memory)
        return meta

    def block(self, path: str, meta: SstMeta, index: int) -> Block:
        key = (path, index)
        cached = self._blocks.get(key)
        if cached is not None:
            return cached
        handle = meta.blocks[index]
        data = self.store.get_range(path, handle.offset, handle.offset + handle.length)
        block = _decode_checked(path, meta, index, data)
        self._blocks.put(key, block, block.size_in_memory)
        return block

    def get(self, path: str, key: bytes) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` of ``key`` in the SST at ``path`` (value None = tombstone)."""
        meta = self.meta(path)
        if not meta.may_contain(key):
            return None
        index = meta.block_for(key)
        if index is None:
            return None
        return self.block(path, meta, index).get(key)

    def scan(self, path: str, start: bytes, end: bytes | None) -> Iterator[Entry]:
        """Entries with ``start <= key < end`` in key order.

        Blocks not in the cache are fetched with read-ahead: one ranged GET covers the next
        consecutive blocks of the range, starting at ``SCAN_READ_AHEAD_MIN`` bytes and doubling
        up to ``SCAN_READ_AHEAD_MAX`` as the scan goes on, so a long scan costs a few large
        GETs instead of one round trip per 4 KiB block, and a short one reads little extra.
        """
        meta = self.meta(path)
        props = meta.props
        if props.first_key is None or props.last_key is None:
            return
        if props.last_key < start or (end is not None and props.first_key >= end):
            return
        first = meta.block_for(start) or 0
        stop = len(meta.blocks)
        if end is not None:
            stop = bisect_left(meta.first_keys, end, first)
        read_ahead = SCAN_READ_AHEAD_MIN
        for index in range(first, stop):
            block = self._blocks.get((path, index))
            if block is None:
                self._fetch(path, meta, index, _chunk_end(meta, index, stop, read_ahead))
                read_ahead = min(read_ahead * 2, SCAN_READ_AHEAD_MAX)
                block = self.block(path, meta, index)
            for entry in block.entries():
                if entry[0] < start:
                    continue
                if end is not None and entry[0] >= end:
                    return
                yield entry

    def _fetch(self, path: str, meta: SstMeta, first: int, last: int) -> None:
        """Read blocks ``first..last`` with one ranged GET into the cache."""
        blocks = meta.blocks
        base = blocks[first].offset
        data = self.store.get_range(path, base, blocks[last].offset + blocks[last].length)
        for index in range(first, last + 1):
            handle = blocks[index]
            piece = data[handle.offset - base : handle.offset - base + handle.length]
            block = _decode_checked(path, meta, index, piece)
            self._blocks.put((path, index), block, block.size_in_memory)

    def scan_all(self, path: str, *, chunk_bytes: int) -> Iterator[Entry]:
        """Every entry in key order, for compaction: blocks are fetched ``chunk_bytes`` at a
        time (one ranged GET per chunk instead of one per block) and bypass the cache, so a
        compaction neither floods the store with requests nor evicts the read path's blocks.
        """
        meta = self.meta(path)
        blocks = meta.blocks
        first = 0
        while first < len(blocks):
            last = _chunk_end(meta, first, len(blocks), chunk_bytes)
            base = blocks[first].offset
            data = self.store.get_range(path, base, blocks[last].offset + blocks[last].length)
            for index in range(first, last + 1):
                handle = blocks[index]
                piece = data[handle.offset - base : handle.offset - base + handle.length]
                yield from _decode_checked(path, meta, index, piece).entries()
            first = last + 1


def _chunk_end(meta: SstMeta, first: int, stop: int, chunk_bytes: int) -> int:
    """The last block of the run of blocks from ``first`` (before ``stop``) within
    ``chunk_bytes`` (always at least ``first`` itself)."""
    blocks = meta.blocks
    last = first
    while (
        last + 1 < stop
        and blocks[last + 1].offset + blocks[last + 1].length - blocks[first].offset <= chunk_bytes
    ):
        last += 1
    return last


def _decode_checked(path: str, meta: SstMeta, index: int, data: bytes) -> Block:
    block = decode_block(data)
    if block.keys[0] != meta.blocks[index].first_key:
        raise CorruptionError(f"{path}: block {index} disagrees with the index")
    return block
