"""Sorted string tables: the format of WAL objects and compacted tables alike.

Layout (integers little-endian)::

    data block*                          see slatepy.format.block
    index     count u32, then per block: offset u64 | length u32 | key_len u16 | first_key
    filter    bloom filter bytes (slatepy.format.bloom); empty when the SST has no keys
    props     msgpack SstProperties
    footer    magic "SLATESST" | version u16 | reserved u16 | meta_offset u64 |
              index_len u32 | filter_len u32 | props_len u32 |
              meta_checksum u64 (XXH3-64 of index|filter|props) |
              footer_checksum u64 (XXH3-64 of the footer bytes before it)

The footer is fixed-size, so a reader fetches a suffix of the object, finds the meta
section (index, filter, properties) in it, and afterwards needs one ranged read per block.
Everything here is a pure function of bytes; I/O lives in the engine.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from slatepy.errors import CorruptionError, InvalidArgument
from slatepy.format.block import BlockBuilder, Entry, decode_block
from slatepy.format.bloom import BloomFilter, build_filter
from slatepy.format.checksum import checksum

SST_MAGIC = b"SLATESST"
SST_FORMAT_VERSION = 1
FOOTER = struct.Struct("<8sHHQIIIQ")
FOOTER_CHECKSUM = struct.Struct("<Q")
FOOTER_SIZE = FOOTER.size + FOOTER_CHECKSUM.size
_INDEX_ENTRY = struct.Struct("<QIH")
_COUNT = struct.Struct("<I")


class SstProperties(msgspec.Struct, frozen=True, array_like=True):
    """Facts about an SST, stored inside it.

    ``writer_epoch`` is the epoch of the writer that produced the SST; it is how a writer
    that loses a WAL slot learns whether it was fenced (the seed keeps it in object
    metadata; we keep it in the object so every store can carry it). Encoded as a msgpack
    array in field order; new fields are only ever appended, with defaults.
    """

    entry_count: int
    tombstone_count: int
    first_key: bytes | None
    last_key: bytes | None
    min_seq: int
    max_seq: int
    writer_epoch: int
    block_count: int
    data_size: int


@dataclass(frozen=True, slots=True)
class BlockHandle:
    """Where a block lives in its SST."""

    offset: int
    length: int
    first_key: bytes


@dataclass(frozen=True, slots=True)
class Footer:
    """The decoded fixed-size tail of an SST."""

    meta_offset: int
    index_len: int
    filter_len: int
    props_len: int
    meta_checksum: int

    @property
    def meta_len(self) -> int:
        return self.index_len + self.filter_len + self.props_len

    @property
    def object_size(self) -> int:
        return self.meta_offset + self.meta_len + FOOTER_SIZE


@dataclass(frozen=True, slots=True)
class SstMeta:
    """Everything but the data blocks: enough to route any lookup to one block."""

    blocks: tuple[BlockHandle, ...]
    first_keys: list[bytes]
    bloom: BloomFilter | None
    props: SstProperties
    object_size: int

    def block_for(self, key: bytes) -> int | None:
        """Index of the only block that can hold ``key``, or None."""
        i = bisect_right(self.first_keys, key) - 1
        return i if i >= 0 else None

    def may_contain(self, key: bytes) -> bool:
        """False when the key is certainly not in this SST (range or filter says so)."""
        props = self.props
        if props.first_key is None or props.last_key is None:
            return False
        if key < props.first_key or key > props.last_key:
            return False
        return self.bloom is None or self.bloom.may_contain(key)

    @property
    def size_in_memory(self) -> int:
        return sum(len(k) + 80 for k in self.first_keys) + self.object_size // 64 + 256


@dataclass(frozen=True, slots=True)
class EncodedSst:
    """An SST's bytes together with its decoded meta (so writers need not re-read it)."""

    data: bytes
    meta: SstMeta


class SstBuilder:
    """Builds an SST from entries added in strictly increasing key order.

    Args:
        writer_epoch: Epoch recorded in the properties (0 for compactor output).
        block_size: Target encoded block size; a block closes once it reaches it.
        bloom_bits_per_key: Filter bits per key; 0 writes no filter (WAL SSTs: they are
            only ever read whole, and the filter cost a third of the write path's CPU).
    """

    def __init__(self, *, writer_epoch: int, block_size: int = 4096, bloom_bits_per_key: int = 10):
        self._epoch = writer_epoch
        self._block_size = block_size
        self._bits_per_key = bloom_bits_per_key
        self._block = BlockBuilder()
        self._parts: list[bytes] = []
        self._offset = 0
        self._handles: list[BlockHandle] = []
        self._block_first: bytes | None = None
        self._keys: list[bytes] = []
        self._last_key: bytes | None = None
        self._tombstones = 0
        self._min_seq: int | None = None
        self._max_seq = 0

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Add one entry (``value`` None for a tombstone)."""
        # On every write's path (one call per WAL entry): kept to plain local operations.
        last = self._last_key
        if last is not None and key <= last:
            raise InvalidArgument("SST keys must be added in strictly increasing order")
        if self._block_first is None:
            self._block_first = key
        block = self._block
        block.add(key, seq, value)
        self._keys.append(key)
        self._last_key = key
        if value is None:
            self._tombstones += 1
        if self._min_seq is None or seq < self._min_seq:
            self._min_seq = seq
        self._max_seq = max(self._max_seq, seq)
        if block.encoded_size >= self._block_size:
            self._close_block()

    def add_all(self, entries: list[Entry]) -> SstBuilder:
        for key, seq, value in entries:
            self.add(key, seq, value)
        return self

    @property
    def estimated_size(self) -> int:
        return self._offset + self._block.encoded_size

    def _close_block(self) -> None:
        if not len(self._block) or self._block_first is None:
            return
        data = self._block.finish()
        self._handles.append(BlockHandle(self._offset, len(data), self._block_first))
        self._parts.append(data)
        self._offset += len(data)
        self._block_first = None

    def finish(self) -> EncodedSst:
        """Encode the SST (an SST with no entries is valid: fencing SSTs are empty)."""
        self._close_block()
        keys = self._keys
        props = SstProperties(
            entry_count=len(keys),
            tombstone_count=self._tombstones,
            first_key=keys[0] if keys else None,
            last_key=keys[-1] if keys else None,
            min_seq=self._min_seq or 0,
            max_seq=self._max_seq,
            writer_epoch=self._epoch,
            block_count=len(self._handles),
            data_size=self._offset,
        )
        index = _encode_index(self._handles)
        bloom = b""
        if keys and self._bits_per_key:
            bloom = build_filter(keys, len(keys), self._bits_per_key)
        props_bytes = msgspec.msgpack.encode(props)
        meta = index + bloom + props_bytes
        footer = FOOTER.pack(
            SST_MAGIC,
            SST_FORMAT_VERSION,
            0,
            self._offset,
            len(index),
            len(bloom),
            len(props_bytes),
            checksum(meta),
        )
        footer += FOOTER_CHECKSUM.pack(checksum(footer))
        data = b"".join([*self._parts, meta, footer])
        sst_meta = SstMeta(
            blocks=tuple(self._handles),
            first_keys=[h.first_key for h in self._handles],
            bloom=BloomFilter(bloom) if bloom else None,
            props=props,
            object_size=len(data),
        )
        return EncodedSst(data, sst_meta)


def _encode_index(handles: list[BlockHandle]) -> bytes:
    parts = [_COUNT.pack(len(handles))]
    for h in handles:
        parts.append(_INDEX_ENTRY.pack(h.offset, h.length, len(h.first_key)))
        parts.append(h.first_key)
    return b"".join(parts)


def decode_footer(tail: bytes | memoryview) -> Footer:
    """Decode the footer from the last ``FOOTER_SIZE`` bytes of ``tail``."""
    if len(tail) < FOOTER_SIZE:
        raise CorruptionError(f"SST: {len(tail)} bytes is too short for a footer")
    raw = bytes(tail[len(tail) - FOOTER_SIZE :])
    (expected,) = FOOTER_CHECKSUM.unpack_from(raw, FOOTER.size)
    if checksum(raw[: FOOTER.size]) != expected:
        raise CorruptionError("SST: footer checksum mismatch")
    magic, version, _, meta_offset, index_len, filter_len, props_len, meta_sum = FOOTER.unpack_from(
        raw
    )
    if magic != SST_MAGIC:
        raise CorruptionError("SST: bad magic; this is not a slatepy SST")
    if version != SST_FORMAT_VERSION:
        raise CorruptionError(f"SST: unsupported format version {version}")
    return Footer(meta_offset, index_len, filter_len, props_len, meta_sum)


def decode_meta(footer: Footer, meta: bytes | memoryview) -> SstMeta:
    """Decode index, filter and properties (``meta`` is exactly the meta section)."""
    if len(meta) != footer.meta_len or checksum(meta) != footer.meta_checksum:
        raise CorruptionError("SST: meta section checksum mismatch")
    raw = bytes(meta)
    index = raw[: footer.index_len]
    bloom = raw[footer.index_len : footer.index_len + footer.filter_len]
    try:
        props = msgspec.msgpack.decode(
            raw[footer.index_len + footer.filter_len :], type=SstProperties
        )
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"SST: bad properties: {exc}") from exc
    handles = _decode_index(index, footer.meta_offset)
    if len(handles) != props.block_count:
        raise CorruptionError("SST: index and properties disagree on the block count")
    return SstMeta(
        blocks=handles,
        first_keys=[h.first_key for h in handles],
        bloom=BloomFilter(bloom) if bloom else None,
        props=props,
        object_size=footer.object_size,
    )


def _decode_index(index: bytes, data_end: int) -> tuple[BlockHandle, ...]:
    if len(index) < _COUNT.size:
        raise CorruptionError("SST: index too short")
    (count,) = _COUNT.unpack_from(index)
    pos = _COUNT.size
    handles: list[BlockHandle] = []
    expected_offset = 0
    for _ in range(count):
        if pos + _INDEX_ENTRY.size > len(index):
            raise CorruptionError("SST: index entry runs past the index")
        offset, length, key_len = _INDEX_ENTRY.unpack_from(index, pos)
        pos += _INDEX_ENTRY.size
        if offset != expected_offset or pos + key_len > len(index):
            raise CorruptionError("SST: index entries are not contiguous")
        handles.append(BlockHandle(offset, length, index[pos : pos + key_len]))
        pos += key_len
        expected_offset = offset + length
    if pos != len(index) or expected_offset != data_end:
        raise CorruptionError("SST: index does not cover the data section exactly")
    return tuple(handles)


def decode_sst(data: bytes) -> tuple[SstMeta, Iterator[Entry]]:
    """Decode a whole SST held in memory: its meta and an iterator over all entries.

    Every block's checksum is verified as the iterator reaches it.
    """
    footer = decode_footer(data)
    if footer.object_size != len(data):
        raise CorruptionError("SST: footer offsets do not match the object size")
    meta = decode_meta(footer, memoryview(data)[footer.meta_offset : len(data) - FOOTER_SIZE])

    def entries() -> Iterator[Entry]:
        view = memoryview(data)
        for handle in meta.blocks:
            block = decode_block(view[handle.offset : handle.offset + handle.length])
            if block.keys[0] != handle.first_key:
                raise CorruptionError("SST: block's first key disagrees with the index")
            yield from block.entries()

    return meta, entries()
