"""SST format versions 1 (RFC 0002), 2 (partitioned index and filters, RFC 0009), 3 (indexed
blocks) and 5 (columnar blocks, RFC 0022) all read, to the same entries."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.block import Entry, decode_block, open_block
from slatepy.format.checksum import checksum
from slatepy.format.kinds import Expiring, Operands
from slatepy.format.lookup import open_lookup
from slatepy.format.sst import (
    FOOTER,
    FOOTER_CHECKSUM,
    FOOTER_SIZE,
    SST_FORMAT_VERSION,
    SstBuilder,
    decode_footer,
    decode_partition,
    decode_sst,
    decode_stored_block,
    decode_top,
)
from tests.format.v1sst import build_v1, sample_entries

V1_SAMPLE = (Path(__file__).parent / "data" / "v1-sample.sst").read_bytes()

keys = st.binary(min_size=1, max_size=24)
tables = st.dictionaries(
    keys, st.tuples(st.integers(0, 2**63), st.none() | st.binary(max_size=80)), max_size=200
)


def entries_of(table: dict[bytes, tuple[int, bytes | None]]) -> list[Entry]:
    return [(k, s, v) for k, (s, v) in sorted(table.items())]


def build_v2(
    entries: list[Entry], *, block_size: int = 128, bits: int = 10, version: int = 6
) -> bytes:
    """An SST of the current writer (version 6), or a version 5 (columnar blocks without
    lookup indexes), 3 (indexed blocks) or 2 (legacy blocks) one."""
    return (
        SstBuilder(
            writer_epoch=4, block_size=block_size, bloom_bits_per_key=bits, format_version=version
        )
        .add_all(entries)
        .finish()
        .data
    )


def test_the_v1_helper_writes_what_the_old_builder_wrote() -> None:
    """``data/v1-sample.sst`` came from the version 1 ``SstBuilder`` (commit bbef546)."""
    assert build_v1(sample_entries(), writer_epoch=9, block_size=256) == V1_SAMPLE


def test_v1_sst_written_by_the_old_code_still_decodes() -> None:
    meta, entries = decode_sst(V1_SAMPLE)
    assert list(entries) == sample_entries()
    assert meta.top.version == 1 and meta.props.writer_epoch == 9
    assert meta.props.block_count == len(meta.blocks) > 10
    blocks = meta.blocks
    for key, seq, value in sample_entries():
        assert meta.may_contain(key)
        index = meta.block_for(key)
        assert index is not None
        handle = blocks[index]
        block = decode_block(
            V1_SAMPLE[handle.offset : handle.offset + handle.length], indexed=False
        )
        assert block.get(key) == (seq, value)
    assert not meta.may_contain(b"key9999") and not meta.may_contain(b"a")


def test_writers_write_version_6() -> None:
    data = build_v2(sample_entries())
    footer = decode_footer(data)
    assert footer.version == SST_FORMAT_VERSION == 6
    meta, entries = decode_sst(data)
    assert list(entries) == sample_entries()
    assert meta.top.partition_count > 1


@given(tables, st.sampled_from([64, 128, 512, 4096]), st.sampled_from([0, 10]))
def test_every_version_decodes_to_the_same_entries(
    table: dict[bytes, tuple[int, bytes | None]], block_size: int, bits: int
) -> None:
    entries = entries_of(table)
    for data in (
        build_v1(entries, writer_epoch=4, block_size=block_size, bits_per_key=bits),
        build_v2(entries, block_size=block_size, bits=bits, version=2),
        build_v2(entries, block_size=block_size, bits=bits, version=3),
        build_v2(entries, block_size=block_size, bits=bits, version=5),
        build_v2(entries, block_size=block_size, bits=bits),
    ):
        meta, decoded = decode_sst(data)
        assert list(decoded) == entries
        assert meta.props.entry_count == len(entries)
        blocks = meta.blocks
        for key, seq, value in entries:
            assert meta.may_contain(key)
            index = meta.block_for(key)
            assert index is not None
            handle = blocks[index]
            raw = data[handle.offset : handle.offset + handle.length]
            block = decode_stored_block(raw, meta.top)
            assert block.get(key) == (seq, value)
            if meta.top.indexed_blocks:
                assert open_block(raw).get(key) == (seq, value)
            if meta.top.lookup_blocks:  # only an SST with filters has lookup indexes
                lookup = open_lookup(raw)
                assert (lookup is not None) == (bits > 0)
                if lookup is not None:
                    assert lookup.get(key) == (seq, value)
                    assert lookup.get(key + b"\x00") == block.get(key + b"\x00")


def test_partitions_cover_runs_of_blocks_and_their_filters_know_their_keys() -> None:
    entries = [(b"k%06d" % i, i, b"v" * 30) for i in range(3000)]
    encoded = SstBuilder(writer_epoch=1, block_size=512).add_all(entries).finish()
    data, top = encoded.data, encoded.meta.top
    footer = decode_footer(data)
    assert decode_top(footer, data[footer.top_offset : -FOOTER_SIZE]) == top
    assert top.partition_count > 5
    seen = 0
    for p in range(top.partition_count):
        raw = data[top.offsets[p] : top.offsets[p + 1]]
        part = decode_partition(top, p, raw)
        built = encoded.meta.partitions[p]
        assert (part.offsets, part.first_keys, part.filter_bytes) == (
            built.offsets,
            built.first_keys,
            built.filter_bytes,
        )
        # Cut once its block entries (21 bytes each here) reach block_size.
        assert (len(part.first_keys) - 1) * 21 < 512 or p == top.partition_count - 1
        assert part.first_block == top.first_blocks[p] == seen
        seen += len(part.first_keys)
        assert part.bloom is not None
    assert seen == top.props.block_count
    for key, _, _ in entries:
        part = encoded.meta.partitions[top.partition_for(key)]
        assert part.may_contain(key)
    absent = [b"k%06da" % i for i in range(3000)]
    false = sum(encoded.meta.may_contain(k) for k in absent)
    assert false < 3000 * 0.03


def test_wal_ssts_have_no_filter_and_one_partition() -> None:
    """WAL SSTs (bloom_bits_per_key=0) stay filter-free; small ones are one partition."""
    entries = [(b"k%04d" % i, i, b"v" * 20) for i in range(100)]
    meta = SstBuilder(writer_epoch=1, bloom_bits_per_key=0).add_all(entries).finish().meta
    assert meta.top.partition_count == 1
    assert meta.partitions[0].bloom is None and meta.partitions[0].filter_bytes == 0


def test_empty_sst_has_no_partitions() -> None:
    meta, entries = decode_sst(SstBuilder(writer_epoch=3).finish().data)
    assert list(entries) == [] and meta.top.partition_count == 0
    assert meta.block_for(b"x") is None and not meta.may_contain(b"x")


def test_an_unknown_version_is_refused_with_a_clear_error() -> None:
    data = bytearray(build_v2(sample_entries()))
    fields = list(FOOTER.unpack_from(data, len(data) - FOOTER_SIZE))
    fields[1] = 7
    footer = FOOTER.pack(*fields)
    data[-FOOTER_SIZE:] = footer + FOOTER_CHECKSUM.pack(checksum(footer))
    with pytest.raises(UnsupportedFormatVersion, match="format version 7, this slatepy reads up"):
        decode_sst(bytes(data))  # a newer slatepy's SST: upgrade, not damage


def test_flipping_any_byte_of_a_v1_sst_is_detected() -> None:
    expected = sample_entries()
    rng = random.Random(2)
    for position in range(len(V1_SAMPLE)):
        corrupt = bytearray(V1_SAMPLE)
        corrupt[position] ^= 1 << rng.randrange(8)
        try:
            _, entries = decode_sst(bytes(corrupt))
            result = list(entries)
        except CorruptionError:
            continue
        assert result == expected, f"flipping byte {position} changed the data undetected"
        pytest.fail(f"flipping byte {position} went undetected")


def test_structural_lies_behind_valid_checksums_are_caught() -> None:
    """A partition that disagrees with the top level (re-checksummed) is still refused."""
    entries = [(b"k%04d" % i, i, b"v" * 30) for i in range(400)]
    encoded = SstBuilder(writer_epoch=1, block_size=256).add_all(entries).finish()
    top, data = encoded.meta.top, encoded.data
    raw = bytearray(data[top.offsets[1] : top.offsets[2]])
    struct.pack_into("<I", raw, 0, struct.unpack_from("<I", raw)[0] + 1)  # one block more
    body = bytes(raw[:-8])
    raw[-8:] = struct.pack("<Q", checksum(body))
    with pytest.raises(CorruptionError, match="partition 1"):
        decode_partition(top, 1, bytes(raw))
    with pytest.raises(CorruptionError, match="partition 0"):
        decode_partition(top, 0, data[top.offsets[1] : top.offsets[2]])


def pinned_entries() -> list[Entry]:
    """The entries of ``data/v{3,5,6}-sample.sst``: the v1 sample's
    (values and tombstones) with some expiring values and merge operands (RFC 0019)."""
    out: list[Entry] = []
    for i, (key, seq, stored) in enumerate(sample_entries()):
        value = stored
        if i % 7 == 3:
            value = Expiring.make(b"ttl-%d" % i, 1_700_000_000_000 + i)
        elif i % 13 == 5:
            value = Operands.of([b"+%d" % i, b"+1"])
        out.append((key, seq, value))
    return out


@pytest.mark.parametrize("version", [3, 5, 6])
def test_pinned_bytes_of_versions_3_5_and_6_still_decode_and_are_still_written(
    version: int,
) -> None:
    """``data/v{3,5}-sample.sst`` were written when version 5 was introduced (RFC 0022),
    ``data/v6-sample.sst`` when version 6 was (lookup indexes, stop 38): readers must keep
    decoding them, and the builder keeps writing the same bytes."""
    pinned = (Path(__file__).parent / "data" / f"v{version}-sample.sst").read_bytes()
    assert decode_footer(pinned).version == version
    meta, decoded = decode_sst(pinned)
    entries = list(decoded)
    assert entries == pinned_entries()
    assert [type(v) for _, _, v in entries] == [type(v) for _, _, v in pinned_entries()]
    assert meta.props.block_count > 5
    built = SstBuilder(writer_epoch=4, block_size=256, format_version=version)
    assert bytes(built.add_all(pinned_entries()).finish().data) == pinned
