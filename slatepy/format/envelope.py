"""A checksummed envelope for small records (manifests, and later persist state).

Layout::

    magic 4 bytes | version u16 | payload | checksum u64 (XXH3-64 of all bytes before it)
"""

from __future__ import annotations

import struct

from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.checksum import append_checksum, verify_checksummed

HEADER = struct.Struct("<4sH")


def seal(magic: bytes, version: int, payload: bytes) -> bytes:
    """Wrap ``payload`` with a magic, a version and a checksum."""
    return append_checksum(HEADER.pack(magic, version) + payload)


def unseal(data: bytes, magic: bytes, versions: tuple[int, ...], what: str) -> tuple[int, bytes]:
    """Check and strip the envelope; return ``(version, payload)``.

    Raises:
        CorruptionError: wrong magic, an unknown older version, or checksum mismatch.
        UnsupportedFormatVersion: a version newer than every one in ``versions`` (checked
            after the checksum, so it is the version written, not a damaged byte).
    """
    body = verify_checksummed(data, what)
    if len(body) < HEADER.size:
        raise CorruptionError(f"{what}: too short for a header")
    found_magic, version = HEADER.unpack_from(body)
    if found_magic != magic:
        raise CorruptionError(f"{what}: bad magic {bytes(found_magic)!r}")
    if version > max(versions):
        raise UnsupportedFormatVersion(what, found=version, newest=max(versions))
    if version not in versions:
        raise CorruptionError(f"{what}: unsupported format version {version}")
    return version, bytes(body[HEADER.size :])
