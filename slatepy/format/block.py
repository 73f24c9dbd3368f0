"""Data blocks: the unit an SST is read in.

Two layouts (all integers little-endian); the SST's format version says which one its
blocks have (docs/rfcs/0009-sst-format-v2.md, "Indexed blocks")::

    entry*   flags u8 | key_len u16 | value_len u32 | seq u64 | key | value
    offsets  count x u32          where each entry starts         (SST version 3 only)
    count    u32
    checksum u64                  XXH3-64 of everything before it

``flags`` bit 0 marks a tombstone (its value is empty), bit 1 an expiring value and bit 2
merge operands (their value bytes are the kind's encoding: ``slatepy.format.kinds``, RFC 0019;
blocks written before those kinds existed never set them). Keys are strictly increasing
within a block. SSTs of versions 1 and 2 have no offsets array ("legacy" blocks).

Two decoded forms:

* :class:`Block` (:func:`decode_block`): every entry parsed into parallel lists, for scans
  and compaction, and for gets on legacy blocks.
* :class:`IndexedBlock` (:func:`open_block`, version 3 only): the verified raw bytes; a
  point lookup binary-searches the offsets array, reading only the keys it compares, and
  parses one entry. It costs O(log n) instead of O(n) Python work, and as little memory as
  the encoded block.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Iterator, MutableSequence
from itertools import accumulate, islice, repeat

import msgspec

from slatepy.errors import CorruptionError
from slatepy.format.checksum import CHECKSUM_SIZE, append_checksum, verify_checksummed
from slatepy.format.kinds import FLAG_TOMBSTONE, KNOWN_FLAGS, decode_value, flags_of

ENTRY_HEADER = struct.Struct("<BHIQ")
COUNT = struct.Struct("<I")
OFFSET = struct.Struct("<I")
KEY_LEN = struct.Struct("<H")
BLOCK_OVERHEAD = COUNT.size + CHECKSUM_SIZE
_pack_header = ENTRY_HEADER.pack
ENTRY_OVERHEAD = ENTRY_HEADER.size + OFFSET.size
_HEADER_SIZE = ENTRY_HEADER.size

Entry = tuple[bytes, int, bytes | None]
"""``(key, seq, value)``; ``value`` is ``None`` for a tombstone."""


class PlainValues(list):  # type: ignore[type-arg]
    """A values list known to hold plain values only (``bytes``: no tombstone, no entry
    kind), as a decoder that saw no entry flags makes it. Readers test the class (a pointer
    compare) instead of every value: in C, ``None not in values`` alone costs about as much
    per row as decoding a columnar block. Slicing one gives a plain ``list`` (unknown again).
    """

    __slots__ = ()


class BlockBuilder:
    """Accumulates sorted entries and encodes them as one block.

    Args:
        indexed: Write the offsets array (SST version 3); False writes the legacy layout
            (only tests that build old SSTs need it).
    """

    __slots__ = ("_count", "_indexed", "_parts", "_size")

    def __init__(self, *, indexed: bool = True) -> None:
        self._indexed = indexed
        self._parts: list[bytes] = []
        self._size = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def encoded_size(self) -> int:
        """Size of the block if it were finished now."""
        return self._size + BLOCK_OVERHEAD + (OFFSET.size * self._count if self._indexed else 0)

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Append an entry; the caller guarantees keys arrive in increasing order."""
        if value is None:
            entry = _pack_header(FLAG_TOMBSTONE, len(key), 0, seq) + key
        elif value.__class__ is bytes:
            entry = _pack_header(0, len(key), len(value), seq) + key + value
        else:  # an entry kind (slatepy.format.kinds): its bytes are its encoding
            entry = _pack_header(flags_of(value), len(key), len(value), seq) + key + value
        self._parts.append(entry)
        self._size += len(entry)
        self._count += 1

    def extend(self, entries: list[bytes], size: int) -> None:
        """Append encoded entries (header, key and value joined) of ``size`` bytes in all,
        in increasing key order after the entries already here."""
        self._parts += entries
        self._size += size
        self._count += len(entries)

    @property
    def filled(self) -> int:
        """Bytes of the entries so far, their offsets included (the fixed overhead aside)."""
        return self._size + (OFFSET.size * self._count if self._indexed else 0)

    def take(self) -> list[bytes]:
        """The encoded entries so far (to be finished with more by :func:`finish_block`);
        the builder is reset."""
        parts = self._parts
        self.__init__(indexed=self._indexed)  # type: ignore[misc]
        return parts

    def finish(self) -> bytes:
        """Encode the block and reset the builder."""
        count = self._count
        return finish_block(self.take(), None, count, self._indexed)


def finish_block(
    parts: list[bytes], sizes: Iterable[int] | None, count: int, indexed: bool
) -> bytes:
    """The block of ``count`` encoded entries whose bytes are ``parts`` (consumed), one entry
    per part unless ``sizes`` gives the entries' sizes: the offsets array (when ``indexed``;
    entry starts summed in C, not on every add), the count, the checksum."""
    if indexed:
        starts = accumulate(map(len, parts) if sizes is None else sizes, initial=0)
        parts.append(struct.pack(f"<{count}I", *islice(starts, count)))
    parts.append(COUNT.pack(count))
    return append_checksum(b"".join(parts))


def entry_headers(keys: list[bytes], seqs: list[int], values: list[bytes]) -> Iterator[bytes]:
    """The headers :meth:`BlockBuilder.add` writes before these entries (no tombstones), by
    C-level maps rather than a Python loop: the bulk path of ``SstBuilder.extend``."""
    return map(_pack_header, repeat(0), map(len, keys), map(len, values), seqs)


class Block(msgspec.Struct, frozen=True, gc=False):
    """A decoded block: parallel, key-sorted lists.

    (A frozen ``msgspec.Struct``, never encoded: one is made per block of every scan, and a
    frozen dataclass's ``__init__`` cost several times more. Untracked by the cyclic GC: it
    refers only to its lists, which are.)
    """

    keys: list[bytes]
    seqs: MutableSequence[int]
    """A list, or an ``array('Q')`` (columnar blocks: ints made only when read)."""
    values: list[bytes | None]
    """A list (scans reverse and join it), but a tuple in a block
    :func:`~slatepy.format.columnar.open_searchable` opened for point lookups, which only
    index it; a scan that finds such a block cached takes it through
    :func:`~slatepy.format.columnar.as_lists`."""
    payload: int = -1
    """Bytes of the keys and values, when the decoder knew it (saves summing them)."""
    plain: bool = False
    """Every value is plain bytes (no tombstone, no entry kind), as the decoder knew from the
    entry flags: scans then hand on the values as
    :class:`PlainValues` without testing each (False: unknown)."""

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` for ``key`` if the block holds it (``value`` None = tombstone)."""
        i = bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            return self.seqs[i], self.values[i]
        return None

    def entries(self, start: int = 0) -> list[Entry]:
        """Entries from index ``start`` on."""
        return list(zip(self.keys[start:], self.seqs[start:], self.values[start:], strict=True))

    @property
    def first_key(self) -> bytes:
        return self.keys[0]

    @property
    def size_in_memory(self) -> int:
        """Rough memory footprint, for cache accounting."""
        payload = self.payload
        if payload < 0:
            payload = sum(len(k) for k in self.keys) + sum(len(v or b"") for v in self.values)
        # Per entry: two bytes objects' headers and list slots, and a seq: an int and its
        # slot in a list, or 8 bytes in an array (columnar blocks).
        return payload + (120 if self.seqs.__class__ is list else 90) * len(self.keys)


class IndexedBlock:
    """A verified version 3 block kept as its raw bytes: point lookups binary-search the
    offsets array and parse only the entries they compare.

    Built by :func:`open_block` (which verifies the checksum and the framing); every read
    below is bounds-checked, so even bytes that pass the checksum but are inconsistent
    raise ``CorruptionError``, never return data from outside an entry.
    """

    __slots__ = ("count", "data", "entries_end", "hits")

    def __init__(self, data: bytes, count: int, entries_end: int) -> None:
        self.data = data
        """The block's bytes (entries, offsets, count; the checksum may follow)."""
        self.count = count
        self.entries_end = entries_end
        """Where the entries end and the offsets array starts."""
        self.hits = 0
        """Lookups served from a cache so far (the reader decodes hot blocks whole)."""

    def _key_at(self, i: int) -> bytes:
        data = self.data
        (pos,) = OFFSET.unpack_from(data, self.entries_end + 4 * i)
        (key_len,) = KEY_LEN.unpack_from(data, pos + 1)
        start = pos + _HEADER_SIZE
        end = start + key_len
        if end > self.entries_end:
            raise CorruptionError(f"data block: entry {i} runs past the entries")
        return data[start:end]

    @property
    def first_key(self) -> bytes:
        try:
            return self._key_at(0)
        except struct.error as exc:
            raise CorruptionError(f"data block: bad entry offset: {exc}") from exc

    def get(self, key: bytes) -> tuple[int, bytes | None] | None:
        """``(seq, value)`` for ``key`` if the block holds it (``value`` None = tombstone).

        Reads about log2(count) keys and parses one entry.
        """
        data = self.data
        entries_end = self.entries_end
        unpack_offset = OFFSET.unpack_from
        unpack_key_len = KEY_LEN.unpack_from
        lo, hi = 0, self.count
        try:
            while lo < hi:
                mid = (lo + hi) >> 1
                (pos,) = unpack_offset(data, entries_end + 4 * mid)
                (key_len,) = unpack_key_len(data, pos + 1)
                start = pos + _HEADER_SIZE
                if data[start : start + key_len] < key:
                    lo = mid + 1
                else:
                    hi = mid
            if lo == self.count:
                return None
            (pos,) = unpack_offset(data, entries_end + 4 * lo)
            flags, key_len, value_len, seq = ENTRY_HEADER.unpack_from(data, pos)
        except struct.error as exc:
            raise CorruptionError(f"data block: bad entry offset: {exc}") from exc
        start = pos + _HEADER_SIZE
        value_start = start + key_len
        end = value_start + value_len
        if end > entries_end or flags & ~KNOWN_FLAGS:
            raise CorruptionError("data block: entry runs past the entries or has unknown flags")
        if data[start:value_start] != key:
            return None
        if not flags:
            return seq, data[value_start:end]
        return seq, decode_value(flags, data[value_start:end])

    def decode(self) -> Block:
        """Every entry, as a :class:`Block` (for scans over a cached block)."""
        return _parse(self.data, self.count, self.entries_end, indexed=True)

    @property
    def size_in_memory(self) -> int:
        """Rough memory footprint, for cache accounting: the bytes plus object overhead."""
        return len(self.data) + 120


def _frame(data: bytes | memoryview, indexed: bool) -> tuple[bytes, int, int]:
    """Verify the checksum and the count: ``(raw, count, entries_end)``; ``raw`` is ``data``
    itself when that is ``bytes`` (its checksum trailing), else a copy of the body."""
    body = verify_checksummed(data, "data block")
    size = len(body)
    if size < COUNT.size:
        raise CorruptionError("data block: too short for an entry count")
    (count,) = COUNT.unpack_from(body, size - COUNT.size)
    per_entry = ENTRY_HEADER.size + (OFFSET.size if indexed else 0)
    if count == 0 or count * per_entry > size - COUNT.size:
        raise CorruptionError(f"data block: impossible entry count {count}")
    entries_end = size - COUNT.size - (OFFSET.size * count if indexed else 0)
    return data if isinstance(data, bytes) else bytes(body), count, entries_end


def open_block(data: bytes | memoryview) -> IndexedBlock:
    """Verify a version 3 block and wrap it for point lookups (no entry is parsed).

    Raises:
        CorruptionError: checksum mismatch or an impossible entry count.
    """
    raw, count, entries_end = _frame(data, True)
    return IndexedBlock(raw, count, entries_end)


def decode_block(data: bytes | memoryview, *, indexed: bool = True) -> Block:
    """Verify and decode every entry of a block (``indexed``: version 3 layout, with the
    offsets array; False for the blocks of version 1 and 2 SSTs).

    Raises:
        CorruptionError: checksum mismatch or a structurally impossible layout.
    """
    raw, count, entries_end = _frame(data, indexed)
    return _parse(raw, count, entries_end, indexed=indexed)


_UNIFORM: dict[tuple[int, int], struct.Struct] = {}
"""Whole-entry layouts (header, key, value) by ``(key_len, value_len)``, for
:func:`_parse_uniform`; bounded, as a store may mix many entry sizes."""
_UNIFORM_MAX = 256


def _parse(raw: bytes, count: int, entries_end: int, *, indexed: bool) -> Block:
    uniform = _parse_uniform(raw, count, entries_end, indexed)
    if uniform is not None:
        return uniform
    return _parse_entries(raw, count, entries_end, indexed=indexed)


def _parse_uniform(raw: bytes, count: int, entries_end: int, indexed: bool) -> Block | None:
    """The block decoded in one ``struct.iter_unpack`` (C) when every entry is a plain
    value with the first entry's key and value lengths (fixed-size keys and values: the
    common case), else None (then :func:`_parse_entries` decodes it, and reports any
    corruption).

    It decodes exactly what the entry walk would: entries of one size sit at multiples of
    it, so when the entry area is ``count`` of them and every parsed header repeats the
    lengths and has no flags, each entry was parsed where the walk would have parsed it.
    """
    if entries_end < _HEADER_SIZE:
        return None
    _, key_len, value_len, _ = ENTRY_HEADER.unpack_from(raw, 0)
    if (_HEADER_SIZE + key_len + value_len) * count != entries_end or not value_len:
        return None
    layout = _UNIFORM.get((key_len, value_len))
    if layout is None:
        if len(_UNIFORM) >= _UNIFORM_MAX:
            _UNIFORM.clear()
        layout = _UNIFORM[key_len, value_len] = struct.Struct(f"<BHIQ{key_len}s{value_len}s")
    flags, key_lens, value_lens, seqs, keys, values = zip(
        *layout.iter_unpack(memoryview(raw)[:entries_end]), strict=True
    )
    if (
        any(flags)
        or key_lens.count(key_len) != count
        or value_lens.count(value_len) != count
        or (
            indexed
            and OFFSET.unpack_from(raw, entries_end + OFFSET.size * (count - 1))[0]
            != entries_end - layout.size
        )
        or (indexed and OFFSET.unpack_from(raw, entries_end)[0] != 0)
    ):
        return None
    return Block(list(keys), list(seqs), list(values), (key_len + value_len) * count, True)


def _parse_entries(raw: bytes, count: int, entries_end: int, *, indexed: bool) -> Block:
    """Decode entry by entry (any mix of sizes and kinds), checking the framing."""
    keys: list[bytes] = []
    seqs: list[int] = []
    values: list[bytes | None] = []
    pos = last = flagged = 0
    unpack = ENTRY_HEADER.unpack_from
    header_size = ENTRY_HEADER.size
    for _ in range(count):
        if pos + header_size > entries_end:
            raise CorruptionError("data block: entry header runs past the entries")
        last = pos
        flags, key_len, value_len, seq = unpack(raw, pos)
        flagged |= flags
        key_start = pos + header_size
        value_start = key_start + key_len
        pos = value_start + value_len
        if pos > entries_end or flags & ~KNOWN_FLAGS:
            raise CorruptionError("data block: entry runs past the entries or has unknown flags")
        keys.append(raw[key_start:value_start])
        seqs.append(seq)
        values.append(
            raw[value_start:pos] if not flags else decode_value(flags, raw[value_start:pos])
        )
    if pos != entries_end:
        raise CorruptionError("data block: entries do not fill the entry area")
    # The offsets array is not used here; its ends are checked (the whole of it is covered
    # by the checksum, and lookups bounds-check every offset they follow).
    if indexed and (
        OFFSET.unpack_from(raw, entries_end)[0] != 0
        or OFFSET.unpack_from(raw, entries_end + OFFSET.size * (count - 1))[0] != last
    ):
        raise CorruptionError("data block: offsets array disagrees with the entries")
    return Block(keys, seqs, values, entries_end - count * header_size, not flagged)
