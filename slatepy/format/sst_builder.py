"""Building SSTs (``slatepy.format.sst`` describes the layout and decodes them):
:class:`SstBuilder`, and the :class:`SstMeta` and :class:`EncodedSst` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from slatepy.errors import InvalidArgument
from slatepy.format.block import (
    BlockBuilder,
    Entry,
)
from slatepy.format.bloom import BloomFilter, build_filter
from slatepy.format.checksum import append_checksum, checksum
from slatepy.format.columnar import ColumnBlockBuilder
from slatepy.format.compression import BlockCompressor, Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.format.sst_bulk import BulkAdds
from slatepy.format.sst_index import (
    COLUMNAR_BLOCKS_VERSION,
    COMPRESSED_BLOCKS_VERSION,
    COUNT,
    FOOTER,
    FOOTER_CHECKSUM,
    HANDLE,
    INDEXED_BLOCKS_VERSION,
    LOOKUP_BLOCKS_VERSION,
    SST_FORMAT_VERSION,
    SST_MAGIC,
    TOP_ENTRY,
    BlockHandle,
    Partition,
    SstProperties,
    SstTop,
    encode_props,
)

_WRITABLE = (2, INDEXED_BLOCKS_VERSION, COLUMNAR_BLOCKS_VERSION, LOOKUP_BLOCKS_VERSION)
PARTITION_DATA_BYTES = 512 * 1024
"""An index partition is closed once its block handles take ``block_size`` bytes or the
blocks it indexes take this many: a cold get reads one partition (its handles and the filter
of its keys) before its block, so its size must not grow with the block size (16 KiB
blocks would make partitions of 60,000 keys, 89 KB, against 4,300 and 9.5 KB at 4 KiB)."""
"""Versions a builder writes (2 and 3 only for tests and benchmarks of older databases)."""


class SstMeta(msgspec.Struct, frozen=True):
    """An SST's top-level index with every partition decoded (what a whole-object decode or
    the builder knows); readers over a store hold only the top and a few partitions."""

    top: SstTop
    partitions: tuple[Partition, ...]

    @property
    def props(self) -> SstProperties:
        return self.top.props

    @property
    def object_size(self) -> int:
        return self.top.object_size

    @property
    def blocks(self) -> tuple[BlockHandle, ...]:
        """Every block's handle, in order (built on each call)."""
        return tuple(p.handle(j) for p in self.partitions for j in range(len(p.first_keys)))

    def block_for(self, key: bytes) -> int | None:
        """SST-wide index of the only block that can hold ``key``, or None."""
        if not self.partitions or key < self.top.first_keys[0]:
            return None
        part = self.partitions[self.top.partition_for(key)]
        j = part.block_for(key)
        return None if j is None else part.first_block + j

    def may_contain(self, key: bytes) -> bool:
        """False when the key is certainly not in this SST (range or filter says so)."""
        if not self.top.may_hold(key):
            return False
        return self.partitions[self.top.partition_for(key)].may_contain(key)


@dataclass(frozen=True, slots=True)
class EncodedSst:
    """An SST's bytes together with its decoded meta (so writers need not re-read it).

    ``data`` is the whole object, or its tail after the builder's ``take_data`` handed out
    the beginning (``meta.top.object_size`` is the whole object's size either way).
    """

    data: bytearray
    meta: SstMeta


class SstBuilder(BulkAdds):
    """Builds a version 6 SST (columnar blocks with lookup indexes, framed when compressing)
    from entries added in strictly increasing key order.

    Memory: the encoded data blocks, the encoded partitions, and the keys of the open
    partition (for its filter) only; a partition's filter is built when it closes.

    Args:
        writer_epoch: Epoch recorded in the properties (0 for compactor output).
        block_size: Target encoded block size; a block closes once it reaches it, and an
            index partition once its block entries do.
        bloom_bits_per_key: Filter bits per key; 0 writes no filter (WAL SSTs: they are
            only ever read whole, and the filter cost a third of the write path's CPU).
        format_version: 6 (the default: columnar blocks with lookup indexes), or 5 (columnar
            blocks), 3 (indexed blocks) or 2 (legacy blocks) for tests and benchmarks of
            databases written by older versions.
        compression: ``"zstd"`` or ``"lz4"``: each block compressed where that saves space
            (``block_size`` is the size before compression), in version 5 or 6 (or version 4,
            when ``format_version`` is 3). ``"none"`` (the default): no block frames.
        compression_level: The codec's level (0: its default; see
            :func:`slatepy.format.compression.check_level`).
        lookup_index: Give each block a lookup index (version 6, an SST with filters only;
            :mod:`slatepy.format.lookup`). False for SSTs that live briefly (the L0 SSTs a
            WAL compaction writes), whose blocks are then version 5's.
    """

    def __init__(
        self,
        *,
        writer_epoch: int,
        block_size: int = 4096,
        bloom_bits_per_key: int = 10,
        format_version: int = SST_FORMAT_VERSION,
        compression: Compression = "none",
        compression_level: int = 0,
        lookup_index: bool = True,
    ):
        if format_version not in _WRITABLE:
            raise InvalidArgument(f"cannot write SST format version {format_version}")
        self._compressor: BlockCompressor | None = None
        if compression != "none":
            if format_version == 2:
                raise InvalidArgument("compressed SSTs need version 3, 5 or 6 blocks")
            self._compressor = BlockCompressor(compression, compression_level)
            if format_version == INDEXED_BLOCKS_VERSION:
                format_version = COMPRESSED_BLOCKS_VERSION
        self._compression = compression
        self._version = format_version
        self._epoch = writer_epoch
        self._block_size = block_size
        self._bits_per_key = bloom_bits_per_key
        self._columnar = format_version >= COLUMNAR_BLOCKS_VERSION
        self._block: BlockBuilder | ColumnBlockBuilder = (
            # An SST without a filter is only ever read whole (WAL SSTs, persist parts):
            # its blocks need no lookup index either.
            ColumnBlockBuilder(
                lookup=lookup_index
                and format_version >= LOOKUP_BLOCKS_VERSION
                and bloom_bits_per_key > 0
            )
            if self._columnar
            else BlockBuilder(indexed=format_version >= INDEXED_BLOCKS_VERSION)
        )
        self._raw_size = 0  # bytes of the data blocks before compression
        # The SST's bytes so far, in one buffer that finish() hands out without a copy: a
        # compaction output of target_sst_bytes then costs its size once, not twice.
        self._data = bytearray()
        self._taken = 0  # bytes handed out by take_data()
        self._offset = 0
        self._block_first: bytes | None = None
        self._first_key: bytes | None = None
        self._last_key: bytes | None = None
        self._count = 0
        self._tombstones = 0
        self._min_seq: int | None = None
        self._max_seq = 0
        # The open partition.
        self._p_entries: list[bytes] = []
        self._p_size = 0
        self._p_offsets: list[int] = []
        self._p_first_keys: list[bytes] = []
        self._p_keys: list[bytes] | None = [] if bloom_bits_per_key else None
        self._p_data_offset = 0
        self._blocks = 0
        # Closed partitions: their bytes, and (relative offset, length, data offset,
        # first block, first key) for the top-level index.
        self._partitions: list[bytes] = []
        self._partitions_len = 0
        # The top-level index, in parallel lists (partition offsets relative to the first
        # partition, as the data's end is not known yet).
        self._t_offsets: list[int] = []
        self._t_lengths: list[int] = []
        self._t_data_offsets: list[int] = []
        self._t_first_blocks: list[int] = []
        self._t_first_keys: list[bytes] = []
        self._decoded: list[Partition] = []
        self._ranges: list[RangeTombstone] = []

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Add one entry (``value`` None for a tombstone)."""
        # On every write's path (one call per WAL entry): kept to plain local operations.
        last = self._last_key
        if last is not None and key <= last:
            raise InvalidArgument("SST keys must be added in strictly increasing order")
        if self._block_first is None:
            self._block_first = key
            if self._first_key is None:
                self._first_key = key
        block = self._block
        block.add(key, seq, value)
        if self._p_keys is not None:
            self._p_keys.append(key)
        self._last_key = key
        self._count += 1
        if value is None:
            self._tombstones += 1
        if self._min_seq is None or seq < self._min_seq:
            self._min_seq = seq
        self._max_seq = max(self._max_seq, seq)
        if block.encoded_size >= self._block_size:
            self._close_block()

    def add_range_tombstone(self, tombstone: RangeTombstone) -> None:
        """Record a range tombstone in the properties (any order; kept sorted by start). It
        does not widen the SST's key range (readers find range tombstones in the properties
        or the manifest's handle, not by key; RFC 0019), but counts in ``max_seq``: a writer
        restarting continues seqs above it."""
        self._ranges.append(tombstone)
        self._max_seq = max(self._max_seq, tombstone.seq)

    def add_all(self, entries: list[Entry]) -> SstBuilder:
        for key, seq, value in entries:
            self.add(key, seq, value)
        return self

    @property
    def estimated_size(self) -> int:
        return self._offset + self._block.encoded_size

    @property
    def buffered_bytes(self) -> int:
        """Bytes of finished data blocks held here (not yet taken by :meth:`take_data`)."""
        return len(self._data)

    def take_data(self) -> bytearray:
        """Hand out the data blocks finished so far (they never change again), so a writer
        can stream a large SST out while building it; :meth:`finish` then returns only the
        rest, and its meta's ``object_size`` counts the whole object."""
        data, self._data = self._data, bytearray()
        self._taken += len(data)
        return data

    def _close_block(self) -> None:
        if len(self._block) and self._block_first is not None:
            self._add_block(self._block.finish())

    def _add_block(self, data: bytes) -> None:
        """Append a finished block whose first key is ``_block_first`` (framed, and
        compressed if that saves space, when the builder compresses)."""
        first = self._block_first
        assert first is not None
        self._raw_size += len(data)
        stored = len(data)
        if self._compressor is None:
            self._data += data
        else:
            parts = self._compressor.frame(data)
            stored = sum(map(len, parts))
            for part in parts:
                self._data += part
        entry = HANDLE.pack(self._offset, stored, len(first)) + first
        self._p_entries.append(entry)
        self._p_size += len(entry)
        self._p_offsets.append(self._offset)
        self._p_first_keys.append(first)
        self._offset += stored
        self._block_first = None
        if (
            self._p_size >= self._block_size
            or self._offset - self._p_data_offset >= PARTITION_DATA_BYTES
        ):
            self._close_partition()

    def _close_partition(self) -> None:
        count = len(self._p_entries)
        if not count:
            return
        keys = self._p_keys
        bloom = build_filter(keys, len(keys), self._bits_per_key) if keys else b""
        encoded = append_checksum(
            b"".join([COUNT.pack(count), *self._p_entries, COUNT.pack(len(bloom)), bloom])
        )
        self._t_offsets.append(self._partitions_len)
        self._t_lengths.append(len(encoded))
        self._t_data_offsets.append(self._p_data_offset)
        self._t_first_blocks.append(self._blocks)
        self._t_first_keys.append(self._p_first_keys[0])
        self._p_offsets.append(self._offset)
        self._decoded.append(
            Partition(
                len(self._decoded),
                self._blocks,
                self._p_offsets,
                self._p_first_keys,
                BloomFilter(bloom) if bloom else None,
                len(bloom),
            )
        )
        self._partitions.append(encoded)
        self._partitions_len += len(encoded)
        self._blocks += count
        self._p_entries, self._p_size, self._p_offsets, self._p_first_keys = [], 0, [], []
        if keys is not None:
            self._p_keys = []
        self._p_data_offset = self._offset

    def finish(self) -> EncodedSst:
        """Encode the SST (an SST with no entries is valid: fencing SSTs are empty)."""
        self._close_block()
        self._close_partition()
        data_end = self._offset
        props = SstProperties(
            entry_count=self._count,
            tombstone_count=self._tombstones,
            first_key=self._first_key,
            last_key=self._last_key,
            min_seq=self._min_seq or 0,
            max_seq=self._max_seq,
            writer_epoch=self._epoch,
            block_count=self._blocks,
            data_size=data_end,
            compression=self._compression,
            uncompressed_size=self._raw_size if self._compressor is not None else 0,
            range_tombstones=tuple(sorted(self._ranges, key=_range_order)),
        )
        offsets = [data_end + rel for rel in self._t_offsets]
        keys = self._t_first_keys
        top_parts = [COUNT.pack(len(keys))]
        for offset, length, data_offset, first_block, key in zip(
            offsets, self._t_lengths, self._t_data_offsets, self._t_first_blocks, keys, strict=True
        ):
            top_parts.append(TOP_ENTRY.pack(offset, length, data_offset, first_block, len(key)))
            top_parts.append(key)
        top = b"".join(top_parts)
        meta = top + encode_props(props)
        footer = FOOTER.pack(
            SST_MAGIC,
            self._version,
            0,
            data_end,
            self._partitions_len,
            len(top),
            len(meta) - len(top),
            checksum(meta),
        )
        footer += FOOTER_CHECKSUM.pack(checksum(footer))
        data = self._data
        for part in (*self._partitions, meta, footer):
            data += part
        self._data, self._partitions = bytearray(), []
        offsets.append(data_end + self._partitions_len)
        self._t_data_offsets.append(data_end)
        self._t_first_blocks.append(self._blocks)
        sst_top = SstTop(
            self._version,
            self._taken + len(data),
            props,
            keys,
            offsets,
            self._t_data_offsets,
            self._t_first_blocks,
        )
        return EncodedSst(data, SstMeta(sst_top, tuple(self._decoded)))


def _range_order(t: RangeTombstone) -> tuple[bytes, bytes, int]:
    return t.start, t.end, t.seq
