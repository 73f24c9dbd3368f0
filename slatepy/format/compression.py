"""Per-block compression of SST data blocks (SST format version 4; RFC 0018).

A version 4 SST stores each data block framed as::

    data      the block (a version 3 block, see slatepy.format.block), raw or compressed
    codec     u8    0 = raw, 1 = zstd, 2 = lz4 (block format with its u32 size prefix)
    checksum  u64   XXH3-64 of data | codec

The checksum covers the *stored* bytes, so a damaged block is caught before any
decompressor sees it (and a damaged codec byte cannot send raw bytes to a decompressor).
The block inside keeps its own checksum, verified once it is decompressed: an end-to-end
check that also catches a decompressor bug. A block that does not shrink to
:data:`KEEP_RATIO` of its size or less is stored raw (codec 0), so incompressible data costs
only the 9 bytes of the frame per block, and no read decompresses a block for a small saving
(blocks under :data:`MIN_COMPRESS_BYTES` are not even tried).

Everything here is a pure function of bytes. Compressors and decompressors are kept per
thread (the C objects are not safe for concurrent use and cost microseconds to create).
"""

from __future__ import annotations

import struct
import threading
from typing import Literal, get_args

import lz4.block
import zstandard

from slatepy.errors import CorruptionError, InvalidArgument
from slatepy.format.checksum import CHECKSUM, CHECKSUM_SIZE, checksum

Compression = Literal["none", "zstd", "lz4"]
"""The codecs a writer can choose (``Settings.compression``)."""
COMPRESSIONS: tuple[str, ...] = get_args(Compression)

RAW, ZSTD, LZ4 = 0, 1, 2
CODEC_IDS = {"none": RAW, "zstd": ZSTD, "lz4": LZ4}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}
_CODEC_BYTES = {codec: bytes([codec]) for codec in CODEC_NAMES}
FRAME_OVERHEAD = 1 + CHECKSUM_SIZE
"""Bytes a version 4 block frame adds to the block it holds."""
MIN_COMPRESS_BYTES = 256
"""Blocks smaller than this are stored raw without trying (a WAL SST of one durable put):
they seldom shrink by an eighth, and a few bytes saved do not pay for the attempt."""
KEEP_RATIO = 7 / 8
"""A compressed block is kept only when it is at most this fraction of the raw one: a saving
under 12.5% does not pay for decompressing the block on every read of it."""
MAX_BLOCK_BYTES = 64 * 1024 * 1024
"""Largest decompressed block accepted (a block holds at most one 16 MiB value beyond
``block_size``, itself at most 16 MiB); a larger claimed size is corruption, refused before
anything is allocated."""
ZSTD_LEVELS = (-7, 22)
"""zstd levels accepted (negative: its fast levels; 0: its default, 3)."""
LZ4_LEVELS = (0, 12)
"""lz4 levels accepted (0: its fast mode; 1-12: its high-compression mode at that level)."""
_LZ4_SIZE = struct.Struct("<I")


def check_level(compression: str, level: int) -> None:
    """Raise ``InvalidArgument`` unless ``level`` suits ``compression``."""
    if compression not in CODEC_IDS:
        raise InvalidArgument(
            f"compression={compression!r} is not one of {', '.join(map(repr, COMPRESSIONS))}"
        )
    low, high = {"none": (0, 0), "zstd": ZSTD_LEVELS, "lz4": LZ4_LEVELS}[compression]
    if not low <= level <= high:
        raise InvalidArgument(
            f"compression_level={level} is out of range for {compression!r}: use {low}..{high}"
            + (" (0 is the codec's default)" if compression != "none" else "")
        )


class BlockCompressor:
    """Frames finished blocks for a version 4 SST, compressed where that saves space.

    Args:
        compression: ``"zstd"`` or ``"lz4"`` (``"none"`` writes version 3 SSTs, unframed).
        level: See :func:`check_level`; 0 is the codec's default.
    """

    def __init__(self, compression: Compression, level: int = 0) -> None:
        check_level(compression, level)
        if compression == "none":
            raise InvalidArgument("an uncompressed SST has no block frames to write")
        self.codec = CODEC_IDS[compression]
        self.level = level

    def _compress(self, block: bytes) -> bytes:
        if self.codec == LZ4:
            if self.level:
                packed = lz4.block.compress(block, mode="high_compression", compression=self.level)
            else:
                packed = lz4.block.compress(block)
            return bytes(packed)
        return _zstd_compressor(self.level or 3).compress(block)

    def frame(self, block: bytes) -> list[bytes]:
        """The stored form of ``block``, as parts to append in order."""
        packed = self._compress(block) if len(block) >= MIN_COMPRESS_BYTES else block
        if len(packed) <= len(block) * KEEP_RATIO:
            data, codec = packed, _CODEC_BYTES[self.codec]
        else:
            data, codec = block, _CODEC_BYTES[RAW]
        # Hashing the two parts in one call would need a copy of ``data``; a streaming hash
        # costs an object instead. Both are cheap next to the compression itself.
        return [data, codec, CHECKSUM.pack(checksum(data + codec))]


_local = threading.local()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's zstd compressor for ``level`` (a new context costs ~10 µs, several times
    the compression of a small WAL SST's block)."""
    compressors: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "zstd", None)
    if compressors is None:
        compressors = _local.zstd = {}
    found = compressors.get(level)
    if found is None:
        found = compressors[level] = zstandard.ZstdCompressor(level=level)
    return found


def unframe_block(stored: bytes | memoryview) -> bytes | memoryview:
    """The block a version 4 frame holds: checksum verified, then decompressed if it was
    compressed (a raw block is returned as a view of ``stored``, not copied).

    Raises:
        CorruptionError: checksum mismatch, an unknown codec, or data the codec rejects
            (without the object's path; readers add it).
    """
    view = memoryview(stored)
    if len(view) < FRAME_OVERHEAD:
        raise CorruptionError(f"data block: {len(view)} bytes is too short for a block frame")
    body = view[:-CHECKSUM_SIZE]
    (expected,) = CHECKSUM.unpack_from(view, len(body))
    if checksum(body) != expected:
        raise CorruptionError("data block: checksum mismatch (stored, compressed form)")
    codec = body[-1]
    data = body[:-1]
    if codec == RAW:
        return data
    try:
        if codec == LZ4:
            size = _LZ4_SIZE.unpack_from(data)[0] if len(data) >= _LZ4_SIZE.size else 0
            if size > MAX_BLOCK_BYTES:
                raise CorruptionError(f"data block: claims {size} bytes decompressed")
            return bytes(lz4.block.decompress(data))
        if codec == ZSTD:
            size = zstandard.frame_content_size(data)
            if not 0 <= size <= MAX_BLOCK_BYTES:
                raise CorruptionError(f"data block: zstd frame of unusable size {size}")
            decompressor = getattr(_local, "unzstd", None)
            if decompressor is None:
                decompressor = _local.unzstd = zstandard.ZstdDecompressor()
            return decompressor.decompress(data)
    except (zstandard.ZstdError, lz4.block.LZ4BlockError, ValueError) as exc:
        raise CorruptionError(
            f"data block: {CODEC_NAMES[codec]} cannot decompress it: {exc}"
        ) from exc
    raise CorruptionError(f"data block: unknown compression codec {codec}")
