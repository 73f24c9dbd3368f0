"""Data blocks: the unit an SST is read in.

Layout (all integers little-endian)::

    entry*   flags u8 | key_len u16 | value_len u32 | seq u64 | key | value
    count    u32
    checksum u64                  XXH3-64 of everything before it

``flags`` bit 0 marks a tombstone (its value is empty). Keys are strictly increasing
within a block. A decoded block keeps keys, sequence numbers and values in parallel lists so
a lookup is one ``bisect`` and no per-entry objects are built.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from dataclasses import dataclass

from slatepy.errors import CorruptionError
from slatepy.format.checksum import CHECKSUM_SIZE, append_checksum, verify_checksummed

ENTRY_HEADER = struct.Struct("<BHIQ")
COUNT = struct.Struct("<I")
FLAG_TOMBSTONE = 0x01
BLOCK_OVERHEAD = COUNT.size + CHECKSUM_SIZE
_pack_header = ENTRY_HEADER.pack
ENTRY_OVERHEAD = ENTRY_HEADER.size

Entry = tuple[bytes, int, bytes | None]
"""``(key, seq, value)``; ``value`` is ``None`` for a tombstone."""


class BlockBuilder:
    """Accumulates sorted entries and encodes them as one block."""

    __slots__ = ("_count", "_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def encoded_size(self) -> int:
        """Size of the block if it were finished now."""
        return self._size + BLOCK_OVERHEAD

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        """Append an entry; the caller guarantees keys arrive in increasing order."""
        if value is None:
            entry = _pack_header(FLAG_TOMBSTONE, len(key), 0, seq) + key
        else:
            entry = _pack_header(0, len(key), len(value), seq) + key + value
        self._parts.append(entry)
        self._size += len(entry)
        self._count += 1

    def finish(self) -> bytes:
        """Encode the block and reset the builder."""
        self._parts.append(COUNT.pack(self._count))
        data = append_checksum(b"".join(self._parts))
        self.__init__()  # type: ignore[misc]
        return data


@dataclass(frozen=True, slots=True)
class Block:
    """A decoded block: parallel, key-sorted lists."""

    keys: list[bytes]
    seqs: list[int]
    values: list[bytes | None]

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
    def size_in_memory(self) -> int:
        """Rough memory footprint, for cache accounting."""
        return (
            sum(len(k) for k in self.keys)
            + sum(len(v or b"") for v in self.values)
            + 120 * len(self.keys)
        )


def decode_block(data: bytes | memoryview) -> Block:
    """Verify and decode a block.

    Raises:
        CorruptionError: checksum mismatch or a structurally impossible layout.
    """
    body = verify_checksummed(data, "data block")
    size = len(body)
    if size < COUNT.size:
        raise CorruptionError("data block: too short for an entry count")
    (count,) = COUNT.unpack_from(body, size - COUNT.size)
    entries_end = size - COUNT.size
    if count == 0 or count * ENTRY_HEADER.size > entries_end:
        raise CorruptionError(f"data block: impossible entry count {count}")
    raw = bytes(body[:entries_end])
    keys: list[bytes] = []
    seqs: list[int] = []
    values: list[bytes | None] = []
    pos = 0
    unpack = ENTRY_HEADER.unpack_from
    header_size = ENTRY_HEADER.size
    for _ in range(count):
        if pos + header_size > entries_end:
            raise CorruptionError("data block: entry header runs past the entries")
        flags, key_len, value_len, seq = unpack(raw, pos)
        key_start = pos + header_size
        value_start = key_start + key_len
        pos = value_start + value_len
        if pos > entries_end or flags & ~FLAG_TOMBSTONE:
            raise CorruptionError("data block: entry runs past the entries or has unknown flags")
        keys.append(raw[key_start:value_start])
        seqs.append(seq)
        values.append(None if flags & FLAG_TOMBSTONE else raw[value_start:pos])
    if pos != entries_end:
        raise CorruptionError("data block: entries do not fill the entry area")
    return Block(keys, seqs, values)
