"""Columnar data blocks: the blocks of SST format version 5 (RFC 0022).

A block is one msgpack array of four columns, then its checksum::

    body      msgpack [flags, keys, values, seqs]
                flags   bin: one byte per entry (the flags of slatepy.format.block: bit 0
                        tombstone, bit 1 expiring value, bit 2 merge operands), or empty
                        when every entry is a plain value (the common case: no per-entry
                        work at all to decode it)
                keys    array of bin, strictly increasing
                values  array of bin (a tombstone's is empty; a kind's is its encoding,
                        slatepy.format.kinds)
                seqs    bin: count x u64 little-endian
    checksum  u64     XXH3-64 of body

Why columns: msgspec decodes (and encodes) the keys and values lists in C, at a fraction of
the cost of walking packed entries with ``struct`` in Python, and the decoded lists are
exactly what a scan hands on (a :class:`~slatepy.format.block.Block`). The seqs are one
packed column that decodes to an ``array('Q')`` (a copy, no int object per entry until one
is read: a scan of one source never reads them), which also makes a decoded block's seqs
cost 8 bytes each in memory instead of an int object and a list slot. Point lookups on a
version 5 block bisect the decoded keys, so a block read for a get is decoded whole; a
version 6 block (SSTs with filters) carries a lookup index after the seqs, and a get
searches its bytes without decoding it (:mod:`slatepy.format.lookup`).
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Iterable
from itertools import islice
from operator import lt as _lt

import msgspec
import xxhash

from slatepy.errors import CorruptionError
from slatepy.format.block import Block
from slatepy.format.checksum import CHECKSUM, CHECKSUM_SIZE, append_checksum, verify_checksummed
from slatepy.format.kinds import FLAG_TOMBSTONE, KNOWN_FLAGS, decode_value, flags_of
from slatepy.format.lookup_index import LOOKUP_ARRAY, build_index

ENTRY_OVERHEAD = 13
"""Estimated encoded bytes of an entry beyond its key and value (two bin headers, its seq's
8 bytes, its flag byte when the block has flags): block cuts are by estimate."""
BLOCK_OVERHEAD = 16 + CHECKSUM_SIZE
"""Estimated bytes of a block beyond its entries (array and column headers, checksum)."""
_EMPTY = b""
_BIG_ENDIAN = sys.byteorder == "big"
_xxh3 = xxhash.xxh3_64_intdigest
_unpack_checksum = CHECKSUM.unpack_from
_NONZERO = re.compile(b"[^\x00]")


def _as_bytes(obj: object) -> bytes:
    """msgspec's hook for values it does not encode itself: an entry kind (a ``bytes``
    subclass) is written as its bytes; anything else is a caller's bug."""
    if isinstance(obj, bytes):
        return bytes(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as an SST value")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_as_bytes)
_DECODER = msgspec.msgpack.Decoder(tuple[bytes, list[bytes], list[bytes], bytes])
_LOOKUP_DECODER = msgspec.msgpack.Decoder(tuple[bytes, list[bytes], tuple[bytes, ...], bytes])
# Version 6 bodies, their lookup index (slatepy.format.lookup) left undecoded.
_INDEXED_DECODER = msgspec.msgpack.Decoder(
    tuple[bytes, list[bytes], list[bytes], bytes, msgspec.Raw]
)
_INDEXED_LOOKUP_DECODER = msgspec.msgpack.Decoder(
    tuple[bytes, list[bytes], tuple[bytes, ...], bytes, msgspec.Raw]
)


def pack_seqs(seqs: Iterable[int]) -> bytes:
    """The seqs column: u64 little-endian each."""
    packed = array("Q", seqs)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_seqs(raw: bytes) -> array[int]:
    """The seqs of a seqs column (``len(raw)`` a multiple of 8)."""
    seqs = array("Q", raw)  # bytes: copied as machine values, as frombytes does
    if _BIG_ENDIAN:
        seqs.byteswap()
    return seqs


class ColumnBlockBuilder:
    """Accumulates sorted entries as columns and encodes them as one block: with a lookup
    index (version 6, :mod:`slatepy.format.lookup`) when ``lookup``, else as version 5."""

    __slots__ = ("_flags", "_keys", "_lookup", "_seqs", "_size", "_values")

    def __init__(self, *, lookup: bool = False) -> None:
        self._lookup = lookup
        self._keys: list[bytes] = []
        self._seqs: list[int] = []
        self._values: list[bytes] = []
        self._flags: bytearray | None = None  # made at the first entry that is not plain
        self._size = BLOCK_OVERHEAD

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def encoded_size(self) -> int:
        """Estimated size of the block if it were finished now."""
        return self._size

    @property
    def filled(self) -> int:
        """Estimated bytes of the entries so far (the fixed overhead aside)."""
        return self._size - BLOCK_OVERHEAD

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Append an entry; the caller guarantees keys arrive in increasing order."""
        flags = self._flags
        if value is None:
            flag, value = FLAG_TOMBSTONE, _EMPTY
        elif value.__class__ is bytes:
            flag = 0
        else:
            flag = flags_of(value)
        if flag and flags is None:
            flags = self._flags = bytearray(len(self._keys))
        if flags is not None:
            flags.append(flag)
        self._keys.append(key)
        self._seqs.append(seq)
        self._values.append(value)
        self._size += len(key) + len(value) + ENTRY_OVERHEAD

    def extend(self, keys: list[bytes], seqs: list[int], values: list[bytes], size: int) -> None:
        """Append plain values (no tombstones, no kinds) whose keys and values take ``size``
        bytes, in increasing key order after the entries already here."""
        self._keys += keys
        self._seqs += seqs
        self._values += values
        if self._flags is not None:
            self._flags += bytes(len(keys))
        self._size += size + ENTRY_OVERHEAD * len(keys)

    def finish(self, widths: tuple[int, int] | None = None) -> bytes:
        """Encode the block and reset the builder (``widths``: the one length of its keys
        and the one of its values, if known: :func:`~slatepy.format.lookup_index.build_index`)."""
        flags = _EMPTY if self._flags is None else bytes(self._flags)
        keys, values, seqs = self._keys, self._values, pack_seqs(self._seqs)
        if self._lookup:
            index, size = build_index(flags, keys, values, len(seqs), widths)
            body = _ENCODER.encode((flags, keys, values, seqs, index))
            if len(body) != size:
                raise AssertionError("the block encoder wrote other sizes than its index says")
        else:
            body = _ENCODER.encode((flags, keys, values, seqs))
        self.__init__(lookup=self._lookup)  # type: ignore[misc]
        return append_checksum(body)


class RawColumnarBlock(msgspec.Struct, gc=False):
    """A verified version 5 block kept as its body's bytes: what the block cache holds for a
    block read by point lookups when the cache has no room for it decoded, until it is hot
    (as :class:`~slatepy.format.block.IndexedBlock` for version 3), so a cold block costs its
    encoded size, not its decoded one (about twice as much). A lookup decodes it (in C,
    about what a search of a raw version 3 block cost).

    (A ``msgspec.Struct`` untracked by the cyclic GC: made in C on a cold read's path, and
    holding only bytes and an int.)
    """

    data: bytes
    """The block's body (checksum verified and stripped)."""
    hits: int = 0
    """Lookups served from a cache so far (the reader keeps hot blocks decoded)."""

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` for ``key`` if the block holds it (``value`` None = tombstone)."""
        return _decode_searchable(self.data).get(key)

    def decode(self) -> Block:
        """Every entry, as a :class:`~slatepy.format.block.Block`."""
        return _decode_searchable(self.data)

    @property
    def size_in_memory(self) -> int:
        """Rough memory footprint, for cache accounting: the bytes plus object overhead."""
        return len(self.data) + 120


def decode_columnar(data: bytes | memoryview) -> Block:
    """Verify and decode a version 5 block.

    Raises:
        CorruptionError: checksum mismatch, or columns that are not a block's.
    """
    # verify_checksummed, inline: this runs once per block of every scan.
    view = data if data.__class__ is memoryview else memoryview(data)
    end = len(view) - CHECKSUM_SIZE
    body = view[:end]
    if end < 0 or _xxh3(body) != _unpack_checksum(view, end)[0]:
        verify_checksummed(view, "data block")  # raises, with the reason
    return _decode_body(body)


def open_columnar(data: bytes | memoryview) -> tuple[Block, RawColumnarBlock]:
    """Verify and decode a version 5 block: decoded, and as raw bytes to cache.

    Raises:
        CorruptionError: checksum mismatch, or columns that are not a block's.
    """
    body = bytes(verify_checksummed(data, "data block"))
    return _decode_searchable(body), RawColumnarBlock(body)


def open_searchable(data: bytes) -> Block:
    """Verify and decode a version 5 block read for point lookups, its keys checked to be
    strictly increasing (see :func:`_decode_searchable`): :func:`open_columnar` without the
    copy of its body to cache raw (the reader makes that only when it caches it so).

    Raises:
        CorruptionError: checksum mismatch, or columns that are not a block's.
    """
    view = memoryview(data)
    end = len(view) - CHECKSUM_SIZE
    body = view[:end]
    if end < 0 or _xxh3(body) != _unpack_checksum(view, end)[0]:
        verify_checksummed(view, "data block")  # raises, with the reason
    try:
        if body[0] == LOOKUP_ARRAY:
            flags, keys, values, packed, _ = _INDEXED_LOOKUP_DECODER.decode(body)
        else:
            flags, keys, values, packed = _LOOKUP_DECODER.decode(body)
    except (msgspec.DecodeError, IndexError) as exc:
        raise CorruptionError(f"data block: bad columns: {exc}") from exc
    count = len(keys)
    if not count or len(values) != count or len(packed) != 8 * count:
        raise CorruptionError("data block: columns of different lengths, or no entries")
    if not all(map(_lt, keys, islice(keys, 1, None))):  # in C
        raise CorruptionError("data block: keys not strictly increasing")
    column: tuple[bytes | None, ...] = values
    if flags:  # tombstones or entry kinds
        out: list[bytes | None] = list(values)
        _apply_flags(flags, out)
        column = tuple(out)
    # The values a tuple, not a list: the cyclic GC stops tracking a tuple of bytes at its
    # first collection, where a cached block's list was traversed by every collection of its
    # generation (a full one walks every cached block). Not the keys: a C bisect of a tuple
    # costs four times a list's (0.4 against 0.1 us), on every warm get. A scan that finds
    # such a block in the cache gets its values as a list (as_lists).
    return Block(keys, unpack_seqs(packed), column, end, not flags)  # type: ignore[arg-type]


def as_lists(block: Block) -> Block:
    """``block`` with its values as a list (those of :func:`open_searchable` are a tuple),
    as scans hand them on."""
    if block.values.__class__ is list:
        return block
    return Block(block.keys, block.seqs, list(block.values), block.payload, block.plain)


def _decode_searchable(body: bytes) -> Block:
    """:func:`_decode_body`, with its keys checked to be strictly increasing: a block read
    for point lookups is bisected, and unordered keys would make a lookup miss silently.
    Scans (:func:`decode_columnar`) skip the check: it costs about 25 ns a row, some 15% of
    a full scan's throughput, and a scan only hands keys on in the order they are stored."""
    block = _decode_body(body)
    keys = block.keys
    if not all(map(_lt, keys, islice(keys, 1, None))):  # in C
        raise CorruptionError("data block: keys not strictly increasing")
    return block


def _apply_flags(flags: bytes, values: list[bytes | None]) -> None:
    """Turn the flagged entries of ``values`` into what their flags say (None for a
    tombstone, an entry kind)."""
    if len(flags) != len(values):
        raise CorruptionError("data block: the flags column has the wrong length")
    for found in _NONZERO.finditer(flags):  # C finds the flagged entries; only they cost
        i = found.start()
        values[i] = flagged_value(i, flags[i], values[i])  # type: ignore[arg-type]  # bytes


def flagged_value(i: int, flag: int, raw: bytes) -> bytes | None:
    """What entry ``i``'s value bytes ``raw`` hold under its ``flag`` (not 0): None for a
    tombstone, else an entry kind.

    Raises:
        CorruptionError: a flag no version writes.
    """
    if flag & ~KNOWN_FLAGS:
        raise CorruptionError(f"data block: entry {i} has unknown flags {flag:#x}")
    return decode_value(flag, raw)


def _decode_body(body: bytes | memoryview) -> Block:
    try:
        if body[0] == LOOKUP_ARRAY:
            flags, keys, values, packed, _ = _INDEXED_DECODER.decode(body)
        else:
            flags, keys, values, packed = _DECODER.decode(body)
    except (msgspec.DecodeError, IndexError) as exc:
        raise CorruptionError(f"data block: bad columns: {exc}") from exc
    count = len(keys)
    if not count or len(values) != count or len(packed) != 8 * count:
        raise CorruptionError("data block: columns of different lengths, or no entries")
    out: list[bytes | None] = values  # type: ignore[assignment]  # kinds set below
    if flags:
        _apply_flags(flags, out)
    # The body's size stands in for the bytes of the keys and values (a few bytes per entry
    # more: an honest upper bound for the cache, without summing every length).
    return Block(keys, unpack_seqs(packed), out, len(body), not flags)
