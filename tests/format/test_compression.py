"""Per-block compression (SST format version 4, RFC 0018): round trips for every codec,
raw fallback for blocks that do not shrink, the stored bytes checked before decompression,
and SSTs without compression unchanged (version 3, same bytes as before)."""

from __future__ import annotations

import os
import random
import struct

import lz4.block
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.config import Settings
from slatepy.errors import CorruptionError, InvalidArgument
from slatepy.format.block import Entry
from slatepy.format.checksum import CHECKSUM, checksum
from slatepy.format.compression import (
    COMPRESSIONS,
    LZ4,
    LZ4_LEVELS,
    MIN_COMPRESS_BYTES,
    RAW,
    ZSTD,
    ZSTD_LEVELS,
    Compression,
    check_level,
    unframe_block,
)
from slatepy.format.sst import (
    COMPRESSED_BLOCKS_VERSION,
    INDEXED_BLOCKS_VERSION,
    SST_FORMAT_VERSION,
    SstBuilder,
    decode_footer,
    decode_sst,
)

CODECS: list[Compression] = ["zstd", "lz4"]

keys = st.binary(min_size=1, max_size=24)
tables = st.dictionaries(
    keys, st.tuples(st.integers(0, 2**63), st.none() | st.binary(max_size=200)), max_size=200
)


def text_entries(n: int, *, seq: int = 1) -> list[Entry]:
    """Entries whose values compress (repeated words) but not to nothing (a counter)."""
    return [
        (b"key%08d" % i, seq + i, b"user %d visited page /items/%d ok" % (i, i % 97) * 3)
        for i in range(n)
    ]


def build(
    entries: list[Entry],
    compression: Compression,
    *,
    block_size: int = 512,
    level: int = 0,
    version: int = SST_FORMAT_VERSION,
) -> bytes:
    builder = SstBuilder(
        writer_epoch=3,
        block_size=block_size,
        compression=compression,
        compression_level=level,
        format_version=version,
    )
    return bytes(builder.add_all(entries).finish().data)


def block_codecs(data: bytes) -> list[int]:
    """The codec byte of every block frame of a compressed (version 4 or 5) SST."""
    meta, _ = decode_sst(data)
    return [data[h.offset + h.length - 9] for h in meta.blocks]


@pytest.mark.parametrize("compression", CODECS)
@pytest.mark.parametrize(
    ("version", "written"),
    [(SST_FORMAT_VERSION, SST_FORMAT_VERSION), (INDEXED_BLOCKS_VERSION, COMPRESSED_BLOCKS_VERSION)],
)
@settings(max_examples=40)
@given(table=tables)
def test_round_trip(
    compression: Compression,
    version: int,
    written: int,
    table: dict[bytes, tuple[int, bytes | None]],
) -> None:
    """Version 5 frames its columnar blocks; asked for version 3 blocks, a writer still
    writes version 4 (RFC 0018)."""
    entries = [(k, s, v) for k, (s, v) in sorted(table.items())]
    data = build(entries, compression, version=version)
    meta, decoded = decode_sst(data)
    assert list(decoded) == entries
    assert meta.top.version == written and meta.top.compressed_blocks
    assert meta.props.compression == compression


@pytest.mark.parametrize("compression", CODECS)
def test_compressible_blocks_are_compressed_and_smaller(compression: Compression) -> None:
    entries = text_entries(400)
    plain = build(entries, "none")
    packed = build(entries, compression)
    assert len(packed) < 0.6 * len(plain)
    expected = ZSTD if compression == "zstd" else LZ4
    # Every block compressed, but the last when it is under MIN_COMPRESS_BYTES (not tried).
    assert set(block_codecs(packed)[:-1]) == {expected}
    meta, _ = decode_sst(packed)
    # block_size is the size before compression: the blocks are the same, only smaller.
    assert meta.props.block_count == decode_sst(plain)[0].props.block_count
    assert meta.props.uncompressed_size == decode_sst(plain)[0].props.data_size
    assert meta.props.data_size < meta.props.uncompressed_size


@pytest.mark.parametrize("compression", CODECS)
def test_blocks_that_do_not_shrink_are_stored_raw(compression: Compression) -> None:
    rng = random.Random(5)
    noise = [(b"k%05d" % i, i, rng.randbytes(90)) for i in range(100)]
    text = text_entries(100, seq=1000)
    entries = sorted(noise + [(b"t" + k, s, v) for k, s, v in text])
    data = build(entries, compression)
    codecs = block_codecs(data)
    assert RAW in codecs and set(codecs) - {RAW}, codecs  # mixed, flagged per block
    assert list(decode_sst(data)[1]) == entries
    # Incompressible data costs the frame only: 9 bytes per block.
    raw_only = build(noise, compression)
    plain = build(noise, "none")
    blocks = decode_sst(plain)[0].props.block_count
    assert set(block_codecs(raw_only)) == {RAW}
    assert len(raw_only) - len(plain) < 9 * blocks + 64


def test_no_compression_writes_unframed_blocks() -> None:
    data = build(text_entries(50), "none")
    assert decode_footer(data).version == SST_FORMAT_VERSION == 6
    meta, _ = decode_sst(data)
    assert meta.props.compression == "none" and meta.props.uncompressed_size == 0
    assert not meta.top.compressed_blocks
    v3 = build(text_entries(50), "none", version=INDEXED_BLOCKS_VERSION)
    assert decode_footer(v3).version == 3 and not decode_sst(v3)[0].top.compressed_blocks


@pytest.mark.parametrize(("compression", "level"), [("zstd", 1), ("zstd", 19), ("zstd", -5)])
def test_levels_change_the_bytes_not_the_entries(compression: Compression, level: int) -> None:
    entries = text_entries(200)
    data = build(entries, compression, level=level)
    assert list(decode_sst(data)[1]) == entries


def test_lz4_high_compression_levels_round_trip() -> None:
    entries = text_entries(200)
    fast, high = build(entries, "lz4"), build(entries, "lz4", level=9)
    assert list(decode_sst(high)[1]) == entries
    assert len(high) <= len(fast)


@pytest.mark.parametrize("compression", CODECS)
@settings(max_examples=20)
@given(st.data())
def test_extend_writes_the_bytes_of_adding_one_by_one(
    compression: Compression, data: st.DataObject
) -> None:
    """The bulk path (persist parts) and ``add`` give byte-identical compressed SSTs."""
    n = data.draw(st.integers(1, 300))
    split = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    entries = [(k, s, v or b"") for k, s, v in text_entries(n)]
    one = SstBuilder(writer_epoch=0, block_size=256, compression=compression)
    bulk = SstBuilder(writer_epoch=0, block_size=256, compression=compression)
    one.add_all(entries)
    head, middle, tail = entries[: split[0]], entries[split[0] : split[1]], entries[split[1] :]
    bulk.add_all(head)
    bulk.extend([e[0] for e in middle], [e[1] for e in middle], [e[2] for e in middle])  # type: ignore[misc]
    bulk.add_all(tail)
    assert one.finish().data == bulk.finish().data


@pytest.mark.parametrize("compression", CODECS)
def test_flipping_any_byte_of_a_compressed_sst_is_detected(compression: Compression) -> None:
    """Every byte, compressed and raw blocks alike: a typed error, never other data."""
    rng = random.Random(2)
    entries = sorted(
        [(b"a%04d" % i, i, rng.randbytes(120)) for i in range(10)]
        + [(b"b%04d" % i, 100 + i, None if i == 3 else b"text %d " % i * 6) for i in range(40)]
    )
    data = build(entries, compression, block_size=256)
    assert {RAW} < set(block_codecs(data))
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        try:
            result = list(decode_sst(bytes(corrupt))[1])
        except CorruptionError:
            continue
        assert result == entries, f"flipping byte {position} changed the data undetected"
        pytest.fail(f"flipping byte {position} went undetected")


def frame(data: bytes, codec: int) -> bytes:
    body = data + bytes([codec])
    return body + CHECKSUM.pack(checksum(body))


def test_frames_lying_behind_a_valid_checksum_are_corruption() -> None:
    """Bytes that pass the frame's checksum but no decompressor (or claim a huge size) are
    corruption, refused before any large allocation."""
    huge = struct.pack("<I", 1 << 31) + b"\x00" * 20
    cases = [
        frame(huge, LZ4),
        frame(b"not zstd at all", ZSTD),
        frame(lz4.block.compress(b"x" * 100)[:-3], LZ4),
        frame(b"data", 7),
        frame(zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100), ZSTD),
        b"\x00" * 5,
    ]
    for stored in cases:
        with pytest.raises(CorruptionError):
            unframe_block(stored)
    assert bytes(unframe_block(frame(b"plain", RAW))) == b"plain"


def test_levels_are_validated_by_the_format_and_by_settings() -> None:
    ranges = {"none": (0, 0), "zstd": ZSTD_LEVELS, "lz4": LZ4_LEVELS}
    for compression, (low, high) in ranges.items():
        for level in (low - 1, low, high, high + 1):
            ok = low <= level <= high
            try:
                check_level(compression, level)
                format_ok = True
            except InvalidArgument:
                format_ok = False
            try:
                Settings(compression=compression, compression_level=level)  # type: ignore[arg-type]
                settings_ok = True
            except InvalidArgument:
                settings_ok = False
            assert format_ok == settings_ok == ok, (compression, level)
    with pytest.raises(InvalidArgument, match="compression"):
        Settings(compression="gzip")  # type: ignore[arg-type]
    assert (
        Settings.from_dict({"compression": "zstd", "compression_level": "9"}).compression_level == 9
    )
    with pytest.raises(InvalidArgument):
        SstBuilder(writer_epoch=0, compression="zstd", format_version=2)


def test_settings_codec_names_match_the_format() -> None:
    for name in COMPRESSIONS:
        assert Settings(compression=name).compression == name  # type: ignore[arg-type]


def test_random_frames_never_decode_silently() -> None:
    rng = random.Random(9)
    for _ in range(300):
        stored = os.urandom(rng.randrange(0, 64))
        with pytest.raises(CorruptionError):
            unframe_block(stored)


@pytest.mark.parametrize("compression", CODECS)
def test_a_tiny_block_is_stored_raw_without_trying(compression: Compression) -> None:
    """One durable put's WAL SST: a block under MIN_COMPRESS_BYTES is not compressed, however
    repetitive; a larger one of the same bytes is."""
    small = build([(b"k", 2, b"a" * (MIN_COMPRESS_BYTES - 60))], compression)
    large = build([(b"k", 2, b"a" * MIN_COMPRESS_BYTES)], compression)
    assert block_codecs(small) == [RAW] and block_codecs(large) != [RAW]
