"""Blocks, SSTs and bloom filters: round trips, properties, corrupt bytes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import CorruptionError, InvalidArgument
from slatepy.format.block import BlockBuilder, decode_block
from slatepy.format.bloom import BloomFilter, build_filter
from slatepy.format.sst import (
    FOOTER_SIZE,
    SST_FORMAT_VERSION,
    SstBuilder,
    decode_footer,
    decode_partition,
    decode_sst,
    decode_stored_block,
    decode_top,
)

keys = st.binary(min_size=1, max_size=40)
values = st.none() | st.binary(max_size=300)
tables = st.dictionaries(keys, st.tuples(st.integers(0, 2**63), values), max_size=300)


def build(table: dict[bytes, tuple[int, bytes | None]], *, block_size: int = 512) -> bytes:
    builder = SstBuilder(writer_epoch=7, block_size=block_size)
    for key, (seq, value) in sorted(table.items()):
        builder.add(key, seq, value)
    return builder.finish().data


@given(tables)
def test_sst_round_trip(table: dict[bytes, tuple[int, bytes | None]]) -> None:
    data = build(table)
    meta, entries = decode_sst(data)
    assert list(entries) == [(k, s, v) for k, (s, v) in sorted(table.items())]
    assert meta.props.entry_count == len(table)
    assert meta.props.writer_epoch == 7
    assert meta.props.tombstone_count == sum(v is None for _, v in table.values())
    for key, version in table.items():  # each key routes to the block holding it
        assert meta.may_contain(key)
        index = meta.block_for(key)
        assert index is not None
        handle = meta.blocks[index]
        block = decode_stored_block(data[handle.offset : handle.offset + handle.length], meta.top)
        assert block.get(key) == version


@given(st.lists(keys, min_size=1, max_size=60, unique=True))
def test_block_round_trip(block_keys: list[bytes]) -> None:
    builder = BlockBuilder()
    for i, key in enumerate(sorted(block_keys)):
        builder.add(key, i, key * 2 if i % 3 else None)
    block = decode_block(builder.finish())
    assert block.keys == sorted(block_keys)
    assert block.get(b"\xff" * 41) is None


def test_top_level_is_read_from_a_suffix_alone() -> None:
    table = {b"k%05d" % i: (i, b"v" * 50) for i in range(2000)}
    data = build(table, block_size=4096)
    footer = decode_footer(data[-FOOTER_SIZE:])
    assert footer.object_size == len(data) and footer.version == SST_FORMAT_VERSION
    top = decode_top(footer, data[footer.top_offset : len(data) - FOOTER_SIZE])
    assert top.props.first_key == b"k00000" and top.props.last_key == b"k01999"
    assert top.props.block_count > 10 and top.partition_count >= 1
    parts = [
        decode_partition(top, p, data[top.offsets[p] : top.offsets[p + 1]])
        for p in range(top.partition_count)
    ]
    assert sum(len(p.first_keys) for p in parts) == top.props.block_count


def test_empty_sst_is_a_valid_fencing_sst() -> None:
    meta, entries = decode_sst(SstBuilder(writer_epoch=3).finish().data)
    assert list(entries) == []
    assert meta.props.writer_epoch == 3
    assert not meta.may_contain(b"anything")


def test_keys_must_increase() -> None:
    builder = SstBuilder(writer_epoch=1)
    builder.add(b"b", 1, b"x")
    with pytest.raises(InvalidArgument):
        builder.add(b"a", 2, b"y")


def test_bloom_filter_has_no_false_negatives_and_few_false_positives() -> None:
    present = [b"key-%d" % i for i in range(5000)]
    bloom = BloomFilter(build_filter(present, len(present), 10))
    assert all(bloom.may_contain(k) for k in present)
    false_positives = sum(bloom.may_contain(b"absent-%d" % i) for i in range(5000))
    assert false_positives / 5000 < 0.03


def test_bloom_bit_layout_is_stable() -> None:
    """The filter layout is part of the format: these bytes must never change."""
    encoded = build_filter([b"a", b"b", b"c"], 3, 10)
    assert encoded[0] == 7 and len(encoded) == 1 + 8
    assert encoded.hex() == GOLDEN_BLOOM


GOLDEN_BLOOM = "07000218a8218718e2"  # computed once when the format was fixed


def _decode_everything(data: bytes) -> list[tuple[bytes, int, bytes | None]]:
    _, entries = decode_sst(data)
    return list(entries)


@pytest.mark.parametrize("bits_per_key", [10, 0])
def test_flipping_any_byte_of_an_sst_is_detected(bits_per_key: int) -> None:
    """Every byte of a version 2 SST with several partitions (with and without filters)."""
    builder = SstBuilder(writer_epoch=7, block_size=128, bloom_bits_per_key=bits_per_key)
    for i in range(120):
        builder.add(b"key%04d" % i, i, None if i == 5 else b"value%04d" % i)
    encoded = builder.finish()
    assert encoded.meta.top.partition_count >= 3
    data = encoded.data
    expected = _decode_everything(data)
    rng = random.Random(1)
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        try:
            result = _decode_everything(bytes(corrupt))
        except CorruptionError:
            continue
        assert result == expected, f"flipping byte {position} changed the data undetected"
        pytest.fail(f"flipping byte {position} went undetected")


@given(st.binary(max_size=400))
def test_random_bytes_never_decode_as_an_sst(data: bytes) -> None:
    with pytest.raises(CorruptionError):
        _decode_everything(data)


def test_taking_data_while_building_gives_the_same_sst() -> None:
    """A writer streaming an SST out (``take_data``) sends exactly the bytes of one built
    whole, and the meta counts the whole object."""

    def build(take_every: int | None) -> tuple[bytes, int]:
        builder = SstBuilder(writer_epoch=0, block_size=256)
        taken = bytearray()
        for i in range(3000):
            builder.add(b"key%06d" % i, i + 1, b"v" * (i % 40))
            if take_every and i % take_every == 0:
                taken += builder.take_data()
                assert builder.buffered_bytes == 0
        encoded = builder.finish()
        return bytes(taken + encoded.data), encoded.meta.object_size

    whole, size = build(None)
    streamed, streamed_size = build(97)
    assert streamed == whole and size == streamed_size == len(whole)
    meta, entries = decode_sst(streamed)
    assert meta.props.entry_count == 3000 and len(list(entries)) == 3000


@given(
    st.dictionaries(keys, st.tuples(st.integers(0, 2**63), st.binary(max_size=300)), max_size=300),
    st.sampled_from([64, 512, 4096]),
    st.sampled_from([0, 10]),
    st.sampled_from([2, 3, 5, 6]),
    st.data(),
)
def test_extend_writes_the_bytes_of_adding_one_by_one(
    table: dict[bytes, tuple[int, bytes]],
    block_size: int,
    bits_per_key: int,
    version: int,
    data: st.DataObject,
) -> None:
    """``extend`` (the bulk path) between ``add`` calls: byte-identical SSTs."""
    entries = [(k, s, v) for k, (s, v) in sorted(table.items())]
    first = data.draw(st.integers(0, len(entries)))
    second = data.draw(st.integers(first, len(entries)))

    def builder() -> SstBuilder:
        return SstBuilder(
            writer_epoch=3,
            block_size=block_size,
            bloom_bits_per_key=bits_per_key,
            format_version=version,
        )

    one_by_one, bulk = builder(), builder()
    one_by_one.add_all(entries)
    bulk.add_all(entries[:first])
    middle = entries[first:second]
    bulk.extend([e[0] for e in middle], [e[1] for e in middle], [e[2] for e in middle])
    bulk.add_all(entries[second:])
    assert bulk.finish().data == one_by_one.finish().data


def test_extend_rejects_keys_out_of_order() -> None:
    builder = SstBuilder(writer_epoch=1)
    builder.add(b"b", 1, b"x")
    with pytest.raises(InvalidArgument):
        builder.extend([b"c", b"a"], [1, 1], [b"", b""])
    with pytest.raises(InvalidArgument):
        builder.extend([b"b"], [1], [b""])


def test_extend_below_refuses_keys_out_of_order_and_adds_none_of_them() -> None:
    builder = SstBuilder(writer_epoch=1)
    builder.add(b"b", 1, b"x")
    size = builder.estimated_size
    with pytest.raises(InvalidArgument):
        builder.extend_below([b"c", b"d", b"a"], [1, 1, 1], [b"", b"", b""], 0, 1 << 30)
    with pytest.raises(InvalidArgument):
        builder.extend_below([b"a", b"c"], [1, 1], [b"", b""], 0, 1 << 30)
    assert builder.estimated_size == size
    assert [entry[0] for entry in decode_sst(builder.finish().data)[1]] == [b"b"]


def test_a_partition_indexes_a_bounded_amount_of_data_whatever_the_block_size() -> None:
    """A cold get reads one index partition (its handles and its keys' filter) before its
    block: with large blocks, closing partitions only by handle bytes made them index 16x
    the data (review of the 16 KiB default), so they are also closed at
    ``PARTITION_DATA_BYTES`` of blocks."""
    from slatepy.format.sst_builder import PARTITION_DATA_BYTES

    table = {b"key%013d" % i: (i, b"v" * 100) for i in range(60_000)}
    for block_size in (4096, 16384):
        data = build(table, block_size=block_size)
        footer = decode_footer(data[-FOOTER_SIZE:])
        top = decode_top(footer, data[footer.top_offset : len(data) - FOOTER_SIZE])
        spans = [
            top.data_offsets[p + 1] - top.data_offsets[p] for p in range(top.partition_count - 1)
        ]
        assert spans and max(spans) < PARTITION_DATA_BYTES + block_size, block_size
