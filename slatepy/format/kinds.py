"""Entry kinds beyond plain values and tombstones: expiring values, merge operands, and
range tombstones (RFC 0019).

A version's value stays ``bytes | None`` everywhere (``None`` is a point tombstone). Point
kinds (:class:`Expiring`, :class:`Operands`) are *subclasses of bytes* whose content is
exactly their encoded form on disk, so

* every path that only moves values around (memtable, WAL buffer, merges, block caches)
  carries them without knowing about them, and a plain value costs nothing new: readers
  test ``value.__class__ is bytes`` (a pointer compare) before looking further;
* encoding one is writing its bytes after the entry header with its flag, and decoding one
  is wrapping the slice in its class (no parsing until a read resolves it).

Entry header flags (``slatepy.format.block``): bit 0 tombstone, bit 1 :class:`Expiring`,
bit 2 :class:`Operands`. Range tombstones are not entries: an SST keeps them in its
properties (:class:`RangeTombstone` records), and the manifest's handle of a compacted SST
repeats them, so a reader holds every range tombstone of its view in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import msgspec

from slatepy.errors import CorruptionError

FLAG_TOMBSTONE = 0x01
FLAG_EXPIRING = 0x02
FLAG_OPERANDS = 0x04
KNOWN_FLAGS = FLAG_TOMBSTONE | FLAG_EXPIRING | FLAG_OPERANDS

_EXPIRE = struct.Struct("<Q")
_LEN = struct.Struct("<I")


class Expiring(bytes):
    """A value that reads as absent from ``expire_at_ms`` (wall clock, ms since the epoch).

    Content: ``expire_at_ms u64 | value``.
    """

    __slots__ = ()

    @classmethod
    def make(cls, value: bytes, expire_at_ms: int) -> Expiring:
        return cls(_EXPIRE.pack(expire_at_ms) + value)

    @property
    def expire_at_ms(self) -> int:
        return int(_EXPIRE.unpack_from(self)[0])

    @property
    def value(self) -> bytes:
        return bytes(self[_EXPIRE.size :])

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expire_at_ms


class Operands(bytes):
    """Merge operands with no base value beneath them (yet), oldest first.

    Content: ``(len u32 | operand)*``; stacking newer operands on older ones is
    concatenating their bytes (:meth:`under`).
    """

    __slots__ = ()

    @classmethod
    def of(cls, operands: Iterable[bytes]) -> Operands:
        return cls(b"".join(_LEN.pack(len(op)) + op for op in operands))

    def operands(self) -> list[bytes]:
        """The operands, oldest first.

        Raises:
            CorruptionError: the lengths do not add up to the content.
        """
        out: list[bytes] = []
        pos, end = 0, len(self)
        while pos < end:
            if pos + _LEN.size > end:
                raise CorruptionError("merge operands: a length runs past the value")
            (n,) = _LEN.unpack_from(self, pos)
            pos += _LEN.size
            if pos + n > end:
                raise CorruptionError("merge operands: an operand runs past the value")
            out.append(bytes(self[pos : pos + n]))
            pos += n
        return out

    def under(self, newer: bytes) -> Operands:
        """These operands followed by the ``newer`` ones."""
        return Operands(bytes(self) + bytes(newer))


def flags_of(value: bytes | None) -> int:
    """The entry header flags of ``value``."""
    if value is None:
        return FLAG_TOMBSTONE
    cls = value.__class__
    if cls is bytes:
        return 0
    if cls is Expiring:
        return FLAG_EXPIRING
    if cls is Operands:
        return FLAG_OPERANDS
    return 0  # another bytes subclass (bytearray is not one): a plain value


def decode_value(flags: int, raw: bytes) -> bytes | None:
    """The value an entry with ``flags`` (not 0, known) and value bytes ``raw`` holds.

    Raises:
        CorruptionError: an expiring value too short to hold its expiry.
    """
    if flags & FLAG_TOMBSTONE:
        return None
    if flags & FLAG_EXPIRING:
        if len(raw) < _EXPIRE.size:  # else reading its expiry would raise struct.error
            raise CorruptionError("data block: an expiring value has no expiry")
        return Expiring(raw)
    return Operands(raw)


class RangeTombstone(msgspec.Struct, frozen=True, array_like=True):
    """Deletes every version of the keys ``start <= key < end`` whose seq is below ``seq``
    (a put in the same write batch after the ``delete_range`` shares its seq and survives)."""

    start: bytes
    end: bytes
    seq: int


def check_range_tombstones(tombstones: Iterable[RangeTombstone]) -> bool:
    """True if every tombstone is a non-empty range (what a decoder accepts)."""
    return all(t.start < t.end for t in tombstones)
