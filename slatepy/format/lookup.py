"""The lookup index of a columnar block (SST format version 6, RFC 0022's addendum): where
each key and value of the block's msgpack body starts, and a hash table of its keys, so that
a point get finds one key in the block's bytes without decoding the block.

A version 6 block is a version 5 block (:mod:`slatepy.format.columnar`) whose body array has
a fifth element, the index, a bin::

    body      msgpack [flags, keys, values, seqs, index]
    index     key_at    (count + 1) x W  body offset of each key's bin header; the last is
                                         where the keys array ends
              value_at  (count + 1) x W  the same for the values (the last: the seqs column)
              slots     S x H            a hash table: each slot an entry's index, or EMPTY
                                         (H bytes of 0xff)
              trailer   count u32 | S u32 | W u8 | H u8
    (little-endian; W is 2 when the body's offsets fit in 16 bits, else 4; H is 1 below 255
    entries, 2 below 65,535, else 4)

Key ``k``'s home slot is ``XXH3-64(k) mod (2 * count)``. Each entry sits at its home slot or
after it, with every slot in between taken (linear probing; slots past ``2 * count`` are
appended rather than wrapped around). A lookup probes from the key's home slot until it
finds the key or an empty slot (or the table's end): about 1.5 key comparisons at this load,
against seven for a bisect, and no block decode at all (which costs about 13 µs in C for a
16 KiB block, and twice the block's size in memory).

Why not search the keys in order: a bisect in Python over the bytes costs about 1.5 µs, the
table's probe about 0.5. The index costs 6 bytes an entry (4% of a 16-byte key and a
100-byte value) and is written only for SSTs that have filters (not WAL SSTs nor persist
parts, which are only ever read whole) and live on (not the L0 SSTs a WAL compaction
writes, which the next L0 merge replaces).
"""

from __future__ import annotations

import struct
from array import array

import xxhash

from slatepy.errors import CorruptionError
from slatepy.format.block import Block
from slatepy.format.checksum import CHECKSUM_SIZE, verify_checksummed
from slatepy.format.columnar import decode_columnar, flagged_value
from slatepy.format.lookup_index import BIG_ENDIAN, BIN_HEADER, FORMATS, LOOKUP_ARRAY, TRAILER

_unpack_u64 = struct.Struct("<Q").unpack_from
_unpack_trailer = TRAILER.unpack_from
# A bin's header size by its first byte; 0 for a byte that starts no bin.
_BIN_HEADERS = tuple(BIN_HEADER.get(byte, 0) for byte in range(256))
_h64 = xxhash.xxh3_64_intdigest


def _column(view: memoryview, start: int, end: int, width: int) -> memoryview | array[int]:
    """The unsigned ints of ``width`` bytes from ``start`` to ``end``: a view, no copy (a
    copy on a big-endian machine, byte-swapped)."""
    raw = view[start:end]
    if BIG_ENDIAN:
        column = array(FORMATS[width])
        column.frombytes(raw)  # array(code, raw) would take each byte of a view as an item
        column.byteswap()
        return column
    return raw.cast("B" if width == 1 else "H" if width == 2 else "I")


class LookupBlock:
    """A version 6 block kept as its bytes, verified, searched through its index: what the
    block cache holds for a block read by point gets. It costs its encoded size (a decoded
    block about twice that), and a get on it costs a hash and one or two key comparisons.

    Opening one is on the cold path of every get that reads a block, so the constructor
    does all of it in one frame: the checksum, the index's bounds, the first key. Besides
    the bytes a block holds one ``memoryview`` (the key and value offsets, cast to their
    width; a one-byte hash table is read from the bytes themselves, a wider one through a
    second view), made once and searched in C.
    """

    __slots__ = (
        "_at",
        "_buckets",
        "_empty",
        "_flags_at",
        "_seqs_at",
        "_slot0",
        "_slots",
        "_slots_end",
        "_values",
        "data",
        "size_in_memory",
    )

    def __init__(self, data: bytes, first_key: bytes | None = None) -> None:
        """Verify ``data``, a stored block with a lookup index (its first byte says so; see
        :func:`open_lookup` for any block), and open it.

        Args:
            first_key: What the SST's index says the block's first key is, checked if given.

        Raises:
            CorruptionError: checksum mismatch, an index that cannot be the block's, or a
                first key other than ``first_key``.
        """
        self.data = data
        view = verify_checksummed(data, "data block")  # the body: kept for the index's views
        end = len(view) - TRAILER.size
        if end < 2:
            raise CorruptionError("data block: too short for a lookup index")
        count, slots, width, slot_width = _unpack_trailer(data, end)
        if width not in (2, 4) or slot_width not in (1, 2, 4) or not 0 < 2 * count <= slots:
            raise CorruptionError("data block: a lookup index with an impossible trailer")
        slots_at = end - slots * slot_width
        index_at = slots_at - 2 * (count + 1) * width
        if index_at < 2:
            raise CorruptionError("data block: a lookup index larger than the block")
        # key_at then value_at: one view, value_at[i] at count + 1 + i.
        if BIG_ENDIAN:
            self._at = at = _column(view, index_at, slots_at, width)
        else:
            self._at = at = view[index_at:slots_at].cast("H" if width == 2 else "I")
        self._slots: bytes | memoryview | array[int]
        if slot_width == 1:  # the table's slots are the block's bytes
            self._slots, self._slot0, self._slots_end = data, slots_at, end
        else:
            self._slots = _column(view, slots_at, end, slot_width)
            self._slot0, self._slots_end = 0, slots
        self._values = values = count + 1
        self._buckets = 2 * count
        self._empty = (1 << (8 * slot_width)) - 1
        first = at[0]
        seqs = at[values + count]
        if not 0 < first <= at[count] <= at[values] <= seqs < index_at:
            raise CorruptionError("data block: a lookup index out of the block's bounds")
        self._seqs_at = seqs + _header(data, seqs)
        if self._seqs_at + 8 * count > index_at:
            raise CorruptionError("data block: the seqs column is too short")
        header = _header(data, 1)
        flags_length = data[2] if header == 2 else int.from_bytes(data[2 : 1 + header], "big")
        if flags_length not in (0, count):
            raise CorruptionError("data block: the flags column has the wrong length")
        self._flags_at = 1 + header if flags_length else -1
        if first_key is not None:
            header = _BIN_HEADERS[data[first]]
            if not header or data[first + header : at[1]] != first_key:
                raise CorruptionError("disagrees with the index")
        # The bytes, the view(s) and this object (measured: tests/format/test_lookup.py).
        self.size_in_memory = len(data) + (600 if slot_width == 1 else 850)

    def first_key(self) -> bytes:
        """The block's first key (what the SST's index says it is)."""
        at = self._at[0]
        return self.data[at + _header(self.data, at) : self._at[1]]

    def decode(self) -> Block:
        """Every entry, as a :class:`~slatepy.format.block.Block` (for a scan)."""
        return decode_columnar(self.data)

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` for ``key`` if the block holds it (``value`` None = tombstone)."""
        # (Separate assignments: four names at once would build and unpack a tuple.)
        data = self.data
        at = self._at
        slots = self._slots
        empty = self._empty
        length = len(key)  # its bin header's size, if a stored key has its length:
        skip = 2 if length < 256 else 3 if length < 65536 else 5
        s = _h64(key) % self._buckets + self._slot0
        i = slots[s]
        while i != empty:
            if data[at[i] + skip : at[i + 1]] == key:
                # The entry: its value, seq and flags.
                v = self._values + i
                start = at[v]
                header = _BIN_HEADERS[data[start]]
                if not header:
                    raise CorruptionError(
                        f"data block: entry {i}'s value is not where its index says"
                    )
                value: bytes | None = data[start + header : at[v + 1]]
                seq: int = _unpack_u64(data, self._seqs_at + 8 * i)[0]
                if self._flags_at >= 0 and (flag := data[self._flags_at + i]):
                    value = flagged_value(i, flag, value)  # type: ignore[arg-type]
                return seq, value
            s += 1
            if s == self._slots_end:
                break
            i = slots[s]
        return None


def _header(data: bytes, at: int) -> int:
    """The size of the bin header at ``at``."""
    size = _BIN_HEADERS[data[at]]
    if not size:
        raise CorruptionError(f"data block: no bin at byte {at} where its index points")
    return size


def open_lookup(data: bytes, first_key: bytes | None = None) -> LookupBlock | None:
    """Verify a stored block (its checksum last) and open it for lookups: None when it has
    no index (a version 5 block, verified all the same).

    Args:
        first_key: What the SST's index says the block's first key is, checked if given.

    Raises:
        CorruptionError: checksum mismatch, an index that cannot be the block's, or a first
            key other than ``first_key``.
    """
    if len(data) > CHECKSUM_SIZE and data[0] == LOOKUP_ARRAY:
        return LookupBlock(data, first_key)
    verify_checksummed(data, "data block")
    return None
