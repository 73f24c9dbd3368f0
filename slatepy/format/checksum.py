"""Checksums used by every on-disk structure: XXH3-64, stored little-endian."""

from __future__ import annotations

import struct

import xxhash

from slatepy.errors import CorruptionError

CHECKSUM = struct.Struct("<Q")
CHECKSUM_SIZE = CHECKSUM.size


def checksum(data: bytes | bytearray | memoryview) -> int:
    """XXH3-64 of ``data``."""
    return xxhash.xxh3_64_intdigest(data)


def append_checksum(data: bytes) -> bytes:
    """``data`` followed by its 8-byte checksum."""
    return data + CHECKSUM.pack(checksum(data))


def verify_checksummed(data: bytes | memoryview, what: str) -> memoryview:
    """Check and strip a trailing checksum; return the body.

    Raises:
        CorruptionError: the buffer is too short or the checksum does not match.
    """
    view = memoryview(data)
    if len(view) < CHECKSUM_SIZE:
        raise CorruptionError(f"{what}: {len(view)} bytes is too short to hold a checksum")
    body = view[:-CHECKSUM_SIZE]
    (expected,) = CHECKSUM.unpack_from(view, len(view) - CHECKSUM_SIZE)
    if checksum(body) != expected:
        raise CorruptionError(f"{what}: checksum mismatch")
    return body
