"""The parts of an SST a reader needs to find a block: footer, properties, the top-level index
and index partitions (with their filters), as types and as pure decoders.

The layout is described in :mod:`slatepy.format.sst` (which writes it) and in
docs/rfcs/0009-sst-format-v2.md. Decoders verify every checksum they cover and the structure
behind it, and raise ``CorruptionError`` (without a path; readers add the object's).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass

import msgspec

from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.bloom import BloomFilter
from slatepy.format.checksum import CHECKSUM_SIZE, checksum, verify_checksummed
from slatepy.format.compression import CODEC_IDS
from slatepy.format.kinds import RangeTombstone, check_range_tombstones

SST_MAGIC = b"SLATESST"
COLUMNAR_BLOCKS_VERSION = 5
"""Version 4 with columnar data blocks (:mod:`slatepy.format.columnar`, RFC 0022), framed
(:mod:`slatepy.format.compression`) only when the properties name a codec."""
LOOKUP_BLOCKS_VERSION = 6
"""Version 5 whose columnar blocks may carry a lookup index (:mod:`slatepy.format.lookup`):
those of SSTs with filters do."""
SST_FORMAT_VERSION = LOOKUP_BLOCKS_VERSION
"""The version writers write, with or without compression."""
COMPRESSED_BLOCKS_VERSION = 4
"""Version 3 with every data block in a frame that says whether (and how) it is compressed
(:mod:`slatepy.format.compression`); what writers wrote with compression before version 5."""
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6)
"""The versions readers accept (1: RFC 0002, databases written before RFC 0009; 2: RFC 0009
before indexed blocks; 3: indexed blocks; 4: RFC 0018, compressed blocks; 5: RFC 0022,
columnar blocks; 6: RFC 0022's addendum, lookup indexes)."""
INDEXED_BLOCKS_VERSION = 3
"""The first version whose data blocks end with an offsets array (3 and 4 only)."""
FOOTER = struct.Struct("<8sHHQIIIQ")
FOOTER_CHECKSUM = struct.Struct("<Q")
FOOTER_SIZE = FOOTER.size + FOOTER_CHECKSUM.size
HANDLE = struct.Struct("<QIH")  # a block handle: offset | length | key_len (then the key)
TOP_ENTRY = struct.Struct("<QIQIH")  # offset | length | data_offset | first_block | key_len
COUNT = struct.Struct("<I")
_MIN_PARTITION = COUNT.size + HANDLE.size + 1 + COUNT.size + CHECKSUM_SIZE
# Rough per-object overheads of CPython, for byte-bounded caches (not exact, but the same
# order as sys.getsizeof: a bytes object ~33 bytes + list slot, an int ~28 + list slot).
_KEY_OVERHEAD = 41
_INT_OVERHEAD = 36
_OBJECT_OVERHEAD = 256


class SstProperties(msgspec.Struct, frozen=True, array_like=True):
    """Facts about an SST, stored inside it.

    ``writer_epoch`` is the epoch of the writer that produced the SST; it is how a writer
    that loses a WAL slot learns whether it was fenced (the seed keeps it in object
    metadata; we keep it in the object so every store can carry it). Encoded as a msgpack
    array in field order; new fields are only ever appended, with defaults, and
    :func:`encode_props` leaves trailing fields at their defaults out (so the SSTs of
    versions 1-3 keep their exact bytes).

    ``compression`` is the codec the writer used (version 4; each block's frame says whether
    that block is compressed or stored raw) and ``uncompressed_size`` the bytes of its data
    blocks before compression (0 when not recorded: versions 1-3, where it is ``data_size``).
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
    compression: str = "none"
    uncompressed_size: int = 0
    range_tombstones: tuple[RangeTombstone, ...] = ()
    """Range tombstones written with this SST, by start key (RFC 0019); absent (so empty)
    in SSTs written before they existed."""


_V3_PROPS_FIELDS = 9
"""The properties' fields before RFC 0018 (``compression``, ``uncompressed_size``) and RFC 0019
(``range_tombstones``) added theirs."""
_TRAILING_DEFAULTS = ("none", 0, ())


def encode_props(props: SstProperties) -> bytes:
    """``props`` as msgpack, without trailing fields at their defaults (msgspec's
    ``omit_defaults`` does not apply to array-like structs): an SST that uses neither
    compression nor range tombstones has the same bytes as before those fields existed."""
    fields = msgspec.structs.astuple(props)
    end = len(fields)
    while end > _V3_PROPS_FIELDS:
        if fields[end - 1] != _TRAILING_DEFAULTS[end - 1 - _V3_PROPS_FIELDS]:
            break
        end -= 1
    return msgspec.msgpack.encode(fields[:end])


@dataclass(frozen=True, slots=True)
class BlockHandle:
    """Where a block lives in its SST."""

    offset: int
    length: int
    first_key: bytes


@dataclass(frozen=True, slots=True)
class Footer:
    """The decoded fixed-size tail of an SST.

    The 48 bytes have one layout in every version; two fields mean different sections:
    in version 1 ``index_len`` is the flat index and ``filter_len`` the SST's filter, in
    versions 2 and 3 ``index_len`` is all index partitions and ``filter_len`` the top-level
    index.
    """

    version: int
    meta_offset: int
    index_len: int
    filter_len: int
    props_len: int
    meta_checksum: int

    @property
    def meta_len(self) -> int:
        """Bytes between the data blocks and the footer."""
        return self.index_len + self.filter_len + self.props_len

    @property
    def object_size(self) -> int:
        return self.meta_offset + self.meta_len + FOOTER_SIZE

    @property
    def top_offset(self) -> int:
        """Where the section a reader needs at open starts: the top-level index and the
        properties in version 2, the whole meta section (index, filter, props) in version 1.
        """
        return self.meta_offset + (self.index_len if self.version >= 2 else 0)

    @property
    def open_len(self) -> int:
        """Bytes from :attr:`top_offset` to the end of the object (footer included)."""
        return self.object_size - self.top_offset


class SstTop(msgspec.Struct, frozen=True):
    """What a reader keeps in memory for every SST it reads: properties and the top-level
    index (one entry per partition), enough to route any key to one partition.

    (A frozen ``msgspec.Struct`` rather than a dataclass, like :class:`Partition`: it is
    built on every SST write, WAL SSTs included, where a frozen dataclass's ``__init__`` cost
    microseconds; it is never encoded.)

    Partition ``p`` occupies bytes ``[offsets[p], offsets[p+1])`` and indexes the data
    blocks ``first_blocks[p] .. first_blocks[p+1]-1``, which occupy
    ``[data_offsets[p], data_offsets[p+1])``; its first block starts with ``first_keys[p]``.
    A version 1 SST has one pseudo-partition: its whole meta section (flat index, filter and
    properties, checked by ``meta_checksum`` whenever it is read again).
    """

    version: int
    object_size: int
    props: SstProperties
    first_keys: list[bytes]
    offsets: list[int]
    data_offsets: list[int]
    first_blocks: list[int]
    meta_checksum: int = 0
    v1_index_len: int = 0
    v1_filter_len: int = 0

    @property
    def partition_count(self) -> int:
        return len(self.first_keys)

    @property
    def indexed_blocks(self) -> bool:
        """True when the data blocks have offsets arrays (versions 3 and 4)."""
        return INDEXED_BLOCKS_VERSION <= self.version < COLUMNAR_BLOCKS_VERSION

    @property
    def columnar_blocks(self) -> bool:
        """True when the data blocks are columnar (version 5 on)."""
        return self.version >= COLUMNAR_BLOCKS_VERSION

    @property
    def lookup_blocks(self) -> bool:
        """True when columnar blocks may carry a lookup index (version 6 on)."""
        return self.version >= LOOKUP_BLOCKS_VERSION

    @property
    def compressed_blocks(self) -> bool:
        """True when every data block is in a compression frame (version 4; version 5 when
        the properties name a codec)."""
        return self.version == COMPRESSED_BLOCKS_VERSION or (
            self.version >= COLUMNAR_BLOCKS_VERSION and self.props.compression != "none"
        )

    @property
    def data_end(self) -> int:
        """Where the data blocks end (the ``meta_offset`` of the footer)."""
        return self.data_offsets[-1] if self.data_offsets else 0

    def may_hold(self, key: bytes) -> bool:
        """False when ``key`` is outside the SST's key range (or the SST is empty)."""
        props = self.props
        return (
            props.first_key is not None
            and props.last_key is not None
            and props.first_key <= key <= props.last_key
        )

    def partition_for(self, key: bytes) -> int:
        """The only partition that can hold ``key`` (call only when :meth:`may_hold`)."""
        return max(0, bisect_right(self.first_keys, key) - 1)

    def partition_of_block(self, block: int) -> int:
        """The partition holding the block with SST-wide index ``block``."""
        return bisect_right(self.first_blocks, block) - 1

    @property
    def size_in_memory(self) -> int:
        """Approximate bytes held, for the pinned-index accounting."""
        return (
            _OBJECT_OVERHEAD
            + sum(len(k) + _KEY_OVERHEAD for k in self.first_keys)
            + 3 * _INT_OVERHEAD * (len(self.first_keys) + 1)
        )


class Partition(msgspec.Struct, frozen=True):
    """A decoded index partition: the handles of a run of blocks and their bloom filter.

    Block ``j`` of the partition (SST-wide index ``first_block + j``) occupies
    ``[offsets[j], offsets[j+1])`` and starts with ``first_keys[j]``.
    """

    index: int
    first_block: int
    offsets: list[int]
    first_keys: list[bytes]
    bloom: BloomFilter | None
    filter_bytes: int

    def block_for(self, key: bytes) -> int | None:
        """Partition-local index of the only block that can hold ``key``, or None."""
        j = bisect_right(self.first_keys, key) - 1
        return j if j >= 0 else None

    def may_contain(self, key: bytes) -> bool:
        """False when the filter says ``key`` is certainly in none of these blocks."""
        return self.bloom is None or self.bloom.may_contain(key)

    def handle(self, j: int) -> BlockHandle:
        return BlockHandle(
            self.offsets[j], self.offsets[j + 1] - self.offsets[j], self.first_keys[j]
        )

    @property
    def size_in_memory(self) -> int:
        """Approximate bytes held, for the byte-bounded meta cache."""
        return (
            _OBJECT_OVERHEAD
            + self.filter_bytes
            + sum(len(k) + _KEY_OVERHEAD for k in self.first_keys)
            + _INT_OVERHEAD * len(self.offsets)
        )


def decode_footer(tail: bytes | memoryview) -> Footer:
    """Decode the footer from the last ``FOOTER_SIZE`` bytes of ``tail``.

    Raises:
        CorruptionError: checksum, magic or an unknown older version.
        UnsupportedFormatVersion: a newer slatepy wrote the SST (nothing is damaged).
    """
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
    if version > max(SUPPORTED_VERSIONS):  # after the checksum: the version written
        raise UnsupportedFormatVersion("SST", found=version, newest=max(SUPPORTED_VERSIONS))
    if version not in SUPPORTED_VERSIONS:
        raise CorruptionError(
            f"SST: unsupported format version {version} (this slatepy reads "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade slatepy"
        )
    return Footer(version, meta_offset, index_len, filter_len, props_len, meta_sum)


def decode_top(footer: Footer, section: bytes | memoryview) -> SstTop:
    """Decode the section a reader needs at open: ``[footer.top_offset, object_size - 48)``.

    Version 2: the top-level index and the properties. Version 1: the whole meta section
    (flat index, filter, properties); it becomes the SST's single pseudo-partition.

    Raises:
        CorruptionError: a checksum or a structural check failed.
    """
    if len(section) != footer.open_len - FOOTER_SIZE or checksum(section) != footer.meta_checksum:
        raise CorruptionError("SST: meta section checksum mismatch")
    raw = bytes(section)
    top_len = footer.filter_len if footer.version >= 2 else footer.index_len + footer.filter_len
    try:
        props = msgspec.msgpack.decode(raw[top_len:], type=SstProperties)
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"SST: bad properties: {exc}") from exc
    if props.data_size != footer.meta_offset:
        raise CorruptionError("SST: properties and footer disagree on the data size")
    if props.compression not in CODEC_IDS or (
        footer.version < COLUMNAR_BLOCKS_VERSION
        and (footer.version == COMPRESSED_BLOCKS_VERSION) != (props.compression != "none")
    ):
        raise CorruptionError(
            f"SST: version {footer.version} with compression {props.compression!r} in its "
            "properties"
        )
    if not check_range_tombstones(props.range_tombstones):
        raise CorruptionError("SST: a range tombstone's start is not below its end")
    if footer.version == 1:
        return _v1_top(footer, raw, props)
    return _v2_top(footer, raw[:top_len], props)


def _v1_top(footer: Footer, raw: bytes, props: SstProperties) -> SstTop:
    if len(raw) < COUNT.size or COUNT.unpack_from(raw)[0] != props.block_count:
        raise CorruptionError("SST: index and properties disagree on the block count")
    if props.block_count == 0:
        return SstTop(1, footer.object_size, props, [], [], [], [])
    if props.first_key is None:
        raise CorruptionError("SST: blocks but no first key")
    return SstTop(
        version=1,
        object_size=footer.object_size,
        props=props,
        first_keys=[props.first_key],
        offsets=[footer.meta_offset, footer.meta_offset + footer.meta_len],
        data_offsets=[0, footer.meta_offset],
        first_blocks=[0, props.block_count],
        meta_checksum=footer.meta_checksum,
        v1_index_len=footer.index_len,
        v1_filter_len=footer.filter_len,
    )


def _v2_top(footer: Footer, raw: bytes, props: SstProperties) -> SstTop:
    if len(raw) < COUNT.size:
        raise CorruptionError("SST: top-level index too short")
    (count,) = COUNT.unpack_from(raw)
    pos = COUNT.size
    first_keys: list[bytes] = []
    offsets: list[int] = []
    data_offsets: list[int] = []
    first_blocks: list[int] = []
    expected = footer.meta_offset
    for _ in range(count):
        if pos + TOP_ENTRY.size > len(raw):
            raise CorruptionError("SST: top-level entry runs past the top-level index")
        offset, length, data_offset, first_block, key_len = TOP_ENTRY.unpack_from(raw, pos)
        pos += TOP_ENTRY.size
        key = raw[pos : pos + key_len]
        pos += key_len
        if (
            offset != expected
            or length < _MIN_PARTITION
            or key_len == 0
            or pos > len(raw)
            or data_offset >= footer.meta_offset
            or first_block >= props.block_count
            or (offsets and (data_offset <= data_offsets[-1] or first_block <= first_blocks[-1]))
            or (first_keys and key <= first_keys[-1])
            or (not offsets and (data_offset != 0 or first_block != 0))
        ):
            raise CorruptionError("SST: top-level index entries are not consecutive partitions")
        first_keys.append(key)
        offsets.append(offset)
        data_offsets.append(data_offset)
        first_blocks.append(first_block)
        expected = offset + length
    if pos != len(raw) or expected != footer.meta_offset + footer.index_len:
        raise CorruptionError("SST: top-level index does not cover the partitions exactly")
    if (props.block_count == 0) != (count == 0) or (count and props.first_key != first_keys[0]):
        raise CorruptionError("SST: top-level index and properties disagree")
    return SstTop(
        version=footer.version,
        object_size=footer.object_size,
        props=props,
        first_keys=first_keys,
        offsets=[*offsets, expected],
        data_offsets=[*data_offsets, footer.meta_offset],
        first_blocks=[*first_blocks, props.block_count],
    )


def decode_partition(top: SstTop, index: int, raw: bytes | memoryview) -> Partition:
    """Verify and decode partition ``index`` of ``top`` from exactly its bytes.

    Raises:
        CorruptionError: checksum, or the partition disagrees with the top-level index.
    """
    if len(raw) != top.offsets[index + 1] - top.offsets[index]:
        raise CorruptionError(f"SST: partition {index} has the wrong length")
    if top.version == 1:
        return _v1_partition(top, raw)
    body = bytes(verify_checksummed(raw, f"SST index partition {index}"))
    (count,) = COUNT.unpack_from(body)
    if count != top.first_blocks[index + 1] - top.first_blocks[index]:
        raise CorruptionError(f"SST: partition {index} disagrees with the top-level index")
    offsets, keys, pos = _decode_handles(
        body,
        COUNT.size,
        count,
        top.data_offsets[index],
        top.data_offsets[index + 1],
        what=f"SST: partition {index}",
    )
    if keys[0] != top.first_keys[index] or pos + COUNT.size > len(body):
        raise CorruptionError(f"SST: partition {index} disagrees with the top-level index")
    (filter_len,) = COUNT.unpack_from(body, pos)
    pos += COUNT.size
    if pos + filter_len != len(body):
        raise CorruptionError(f"SST: partition {index}'s filter does not fill it")
    bloom = BloomFilter(body[pos:]) if filter_len else None
    return Partition(index, top.first_blocks[index], offsets, keys, bloom, filter_len)


def _v1_partition(top: SstTop, raw: bytes | memoryview) -> Partition:
    """The whole version 1 meta section as one partition (checked by the meta checksum)."""
    if checksum(raw) != top.meta_checksum:
        raise CorruptionError("SST: meta section checksum mismatch")
    data = bytes(raw)
    index_len, filter_len = top.v1_index_len, top.v1_filter_len
    (count,) = COUNT.unpack_from(data)
    if count != top.props.block_count:
        raise CorruptionError("SST: index and properties disagree on the block count")
    offsets, keys, pos = _decode_handles(
        data, COUNT.size, count, 0, top.data_end, what="SST: index"
    )
    if pos != index_len:
        raise CorruptionError("SST: index does not cover the data section exactly")
    bloom_bytes = data[index_len : index_len + filter_len]
    bloom = BloomFilter(bloom_bytes) if bloom_bytes else None
    return Partition(0, 0, offsets, keys, bloom, filter_len)


def _decode_handles(
    raw: bytes, pos: int, count: int, data_start: int, data_end: int, *, what: str
) -> tuple[list[int], list[bytes], int]:
    """Parse ``count`` block handles from ``pos``: they must tile ``[data_start, data_end)``
    with strictly increasing first keys. Returns (offsets with the end appended, keys, pos).
    """
    offsets: list[int] = []
    keys: list[bytes] = []
    expected = data_start
    size = len(raw)
    unpack = HANDLE.unpack_from
    for _ in range(count):
        if pos + HANDLE.size > size:
            raise CorruptionError(f"{what}: a block entry runs past the end")
        offset, length, key_len = unpack(raw, pos)
        pos += HANDLE.size
        key = raw[pos : pos + key_len]
        pos += key_len
        if offset != expected or pos > size or length == 0 or (keys and key <= keys[-1]):
            raise CorruptionError(f"{what}: block entries are not contiguous, sorted blocks")
        offsets.append(offset)
        keys.append(key)
        expected = offset + length
    if expected != data_end or not keys:
        raise CorruptionError(f"{what}: block entries do not cover its data exactly")
    offsets.append(expected)
    return offsets, keys, pos
