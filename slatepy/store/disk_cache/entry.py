"""The bytes of one disk-cache file: a checksummed header, then the cached data.

Layout (integers little-endian)::

    magic "SPDC" | version u8 | reserved u8 | key_len u16 | data_len u32 | chunk_size u32
    key (key_len bytes, UTF-8)
    one XXH3-64 per chunk_size-byte chunk of the data (ceil(data_len / chunk_size) of them)
    XXH3-64 of everything above
    data (data_len bytes)

The key names what the file holds (store namespace, object path, part), so a file found
under the wrong name (a hash collision, a stray copy) is never taken for another part. Data
is checksummed per chunk so a hit that needs one 4 KiB block reads and verifies one or two
16 KiB chunks, not the whole 1 MiB part. Nothing here does I/O beyond ``os.pread`` on a descriptor
the caller opened.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import xxhash

from slatepy.errors import CorruptionError

MAGIC = b"SPDC"
VERSION = 1
CHUNK_SIZE = 16 * 1024
_FIXED = struct.Struct("<4sBBHII")
_SUM = struct.Struct("<Q")
_FIRST_READ = 4096  # enough for the header of any part this cache writes


class CorruptCacheEntry(CorruptionError):
    """A disk-cache file failed its magic, version, key, length or checksum check.

    Never reaches a caller of the store: the cache deletes the file and refetches the part.
    """


@dataclass(frozen=True, slots=True)
class Header:
    """What a cache file's header says."""

    key: bytes
    data_len: int
    chunk_size: int
    chunk_sums: tuple[int, ...]
    size: int
    """Bytes of the header itself; the data starts here."""


def encode(key: bytes, data: bytes, *, chunk_size: int = CHUNK_SIZE) -> list[bytes]:
    """The file for ``data`` cached under ``key``, as pieces to write in order."""
    view = memoryview(data)
    sums = [
        xxhash.xxh3_64_intdigest(view[i : i + chunk_size]) for i in range(0, len(data), chunk_size)
    ]
    head = b"".join(
        [
            _FIXED.pack(MAGIC, VERSION, 0, len(key), len(data), chunk_size),
            key,
            struct.pack(f"<{len(sums)}Q", *sums),
        ]
    )
    return [head, _SUM.pack(xxhash.xxh3_64_intdigest(head)), data]


def read_header(fd: int, key: bytes, file_size: int) -> Header:
    """Read and verify the header of the open cache file ``fd``.

    Raises:
        CorruptCacheEntry: wrong magic or version, another key, a bad header checksum, or a
            file whose length disagrees with the header (truncated or padded).
    """
    raw = os.pread(fd, _FIRST_READ, 0)
    if len(raw) < _FIXED.size:
        raise CorruptCacheEntry(f"cache file of {len(raw)} bytes is too short for a header")
    magic, version, _, key_len, data_len, chunk_size = _FIXED.unpack_from(raw)
    if magic != MAGIC or version != VERSION or chunk_size <= 0:
        raise CorruptCacheEntry(f"not a version {VERSION} cache file (magic {magic!r})")
    chunks = -(-data_len // chunk_size)
    body_len = _FIXED.size + key_len + chunks * _SUM.size
    size = body_len + _SUM.size
    if len(raw) < size:
        raw += os.pread(fd, size - len(raw), len(raw))
    if len(raw) < size:
        raise CorruptCacheEntry("cache file ends inside its header")
    (expected,) = _SUM.unpack_from(raw, body_len)
    if xxhash.xxh3_64_intdigest(memoryview(raw)[:body_len]) != expected:
        raise CorruptCacheEntry("cache file header checksum mismatch")
    found_key = raw[_FIXED.size : _FIXED.size + key_len]
    if found_key != key:
        raise CorruptCacheEntry("cache file holds another part than its name says")
    if file_size != size + data_len:
        raise CorruptCacheEntry(
            f"cache file is {file_size} bytes, its header says {size + data_len}"
        )
    sums = struct.unpack_from(f"<{chunks}Q", raw, _FIXED.size + key_len)
    return Header(found_key, data_len, chunk_size, sums, size)


def read_data(fd: int, header: Header, lo: int, hi: int) -> bytes:
    """Bytes ``[lo, hi)`` of the data (clipped to its length), every chunk they touch verified.

    Raises:
        CorruptCacheEntry: a chunk's checksum does not match (or the file was cut short).
    """
    hi = min(hi, header.data_len)
    if hi <= lo:
        return b""
    size = header.chunk_size
    first, last = lo // size, (hi - 1) // size
    start = first * size
    length = min((last + 1) * size, header.data_len) - start
    raw = os.pread(fd, length, header.size + start)
    if len(raw) != length:
        raise CorruptCacheEntry("cache file ends inside its data")
    view = memoryview(raw)
    for index in range(first, last + 1):
        offset = (index - first) * size
        if xxhash.xxh3_64_intdigest(view[offset : offset + size]) != header.chunk_sums[index]:
            raise CorruptCacheEntry(f"cache file chunk {index} checksum mismatch")
    return raw[lo - start : hi - start]
