"""Columnar data blocks (SST format version 5, RFC 0022): round trips with every entry kind,
the layout, corruption behind valid checksums, and honest memory accounting."""

from __future__ import annotations

import random
import tracemalloc

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import CorruptionError
from slatepy.format.block import Block
from slatepy.format.checksum import append_checksum
from slatepy.format.columnar import (
    ColumnBlockBuilder,
    RawColumnarBlock,
    decode_columnar,
    open_columnar,
)
from slatepy.format.kinds import FLAG_EXPIRING, FLAG_TOMBSTONE, Expiring, Operands

values = st.one_of(
    st.none(),
    st.binary(max_size=60),
    st.builds(Expiring.make, st.binary(max_size=20), st.integers(0, 2**63)),
    st.builds(Operands.of, st.lists(st.binary(max_size=10), max_size=3)),
)


SEQS_2 = (1).to_bytes(8, "little") + (2).to_bytes(8, "little")


def build(entries: list[tuple[bytes, int, bytes | None]]) -> bytes:
    builder = ColumnBlockBuilder()
    for key, seq, value in entries:
        builder.add(key, seq, value)
    return builder.finish()


def body(columns: object) -> bytes:
    """A block of arbitrary columns with a valid checksum (a structural lie)."""
    return append_checksum(msgspec.msgpack.encode(columns))


@given(
    st.dictionaries(
        st.binary(min_size=1, max_size=20), st.tuples(st.integers(0, 2**64 - 1), values), min_size=1
    )
)
def test_round_trip_keeps_every_kind(table: dict[bytes, tuple[int, bytes | None]]) -> None:
    entries = [(k, s, v) for k, (s, v) in sorted(table.items())]
    block = decode_columnar(build(entries))
    assert block.entries() == entries
    assert [type(v) for v in block.values] == [type(v) for _, _, v in entries]
    for key, seq, value in entries:
        assert block.get(key) == (seq, value)


def test_plain_blocks_have_an_empty_flags_column() -> None:
    entries = [(b"k%03d" % i, i, b"v" * i) for i in range(50)]
    data = build(entries)
    flags, keys, _, seqs = msgspec.msgpack.decode(data[:-8])
    assert flags == b"" and keys == [k for k, _, _ in entries]
    assert seqs == b"".join(i.to_bytes(8, "little") for i in range(50))
    mixed = build([*entries[:3], (b"k100", 7, None), (b"k101", 8, Expiring.make(b"x", 5))])
    flags = msgspec.msgpack.decode(mixed[:-8])[0]
    assert flags == bytes([0, 0, 0, FLAG_TOMBSTONE, FLAG_EXPIRING])


def test_extend_matches_add() -> None:
    entries = [(b"k%03d" % i, i, b"v" * i) for i in range(20)]
    one = ColumnBlockBuilder()
    for key, seq, value in entries:
        one.add(key, seq, value)
    bulk = ColumnBlockBuilder()
    bulk.add(b"a", 1, None)  # a tombstone first: the flags column exists before extend
    bulk.extend([k for k, _, _ in entries], list(range(20)), [v for _, _, v in entries], 0)
    decoded = decode_columnar(bulk.finish())
    assert decoded.entries() == [(b"a", 1, None), *entries]
    assert decode_columnar(one.finish()).entries() == entries


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ((b"", [b"a", b"b"], [b"1"], SEQS_2), "different lengths"),
        ((b"", [b"a", b"b"], [b"1", b"2"], SEQS_2[:12]), "different lengths"),
        ((b"", [], [], b""), "no entries"),
        ((b"\x00", [b"a", b"b"], [b"1", b"2"], SEQS_2), "flags column"),
        ((b"\x00\x08", [b"a", b"b"], [b"1", b"2"], SEQS_2), "unknown flags"),
        ((b"", [b"a"], [1], SEQS_2[:8]), "bad columns"),
        ((b"", [b"a"], [b"1"], [1]), "bad columns"),
        ([b"", [b"a"], [b"1"]], "bad columns"),
        ({"keys": [b"a"]}, "bad columns"),
    ],
)
def test_structural_lies_behind_a_valid_checksum_are_refused(columns: object, match: str) -> None:
    with pytest.raises(CorruptionError, match=match):
        decode_columnar(body(columns))


def test_flipping_any_byte_is_detected() -> None:
    data = build([(b"k%02d" % i, i, b"value %d" % i if i % 3 else None) for i in range(20)])
    rng = random.Random(4)
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptionError):
            decode_columnar(bytes(corrupt))


def test_the_raw_form_answers_as_the_decoded_one() -> None:
    entries = [(b"k%03d" % i, i, b"v%d" % i if i % 4 else None) for i in range(40)]
    data = build(entries)
    decoded, raw = open_columnar(memoryview(data))
    assert isinstance(raw, RawColumnarBlock) and raw.hits == 0
    assert decoded == decode_columnar(data) == raw.decode()
    for key, seq, value in entries:
        assert raw.get(key) == decoded.get(key) == (seq, value)
    assert raw.get(b"k0005") is None
    assert len(data) - 8 <= raw.size_in_memory <= len(data) + 200


def measured(make: object) -> int:
    """Bytes held by what ``make()`` returns (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()  # type: ignore[operator]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept is not None
    return held


@pytest.mark.parametrize(("key_size", "value_size"), [(16, 100), (8, 8), (40, 1000)])
def test_the_decoded_size_counted_is_close_to_the_memory_held(
    key_size: int, value_size: int
) -> None:
    """The block cache counts ``size_in_memory``; for a decoded columnar block it must be
    near what the lists and their objects really take (not the encoded size)."""
    entries = [(b"%0*d" % (key_size, i), 10**9 + i, b"v" * value_size) for i in range(200)]
    data = build(entries)
    block: list[Block] = []
    held = measured(lambda: block.append(decode_columnar(data)) or block)
    counted = block[0].size_in_memory
    assert 0.8 * held <= counted <= 1.5 * held, (counted, held)


def test_an_expiring_value_too_short_for_its_expiry_is_corruption() -> None:
    """Found when an expiring entry's expiry was read (``struct.error``), not at decode."""
    columns = (bytes([0, FLAG_EXPIRING]), [b"a", b"b"], [b"1", b"short"], SEQS_2)
    with pytest.raises(CorruptionError, match="no expiry"):
        decode_columnar(body(columns))
    with pytest.raises(CorruptionError, match="no expiry"):
        open_columnar(body(columns))
    exact = (bytes([0, FLAG_EXPIRING]), [b"a", b"b"], [b"1", bytes(8)], SEQS_2)
    assert decode_columnar(body(exact)).values[1] == Expiring.make(b"", 0)  # 8 bytes: fine
    tombstone = (bytes([0, FLAG_TOMBSTONE | FLAG_EXPIRING]), [b"a", b"b"], [b"1", b""], SEQS_2)
    assert decode_columnar(body(tombstone)).values[1] is None


@pytest.mark.parametrize("keys", [[b"b", b"a"], [b"a", b"a"]])
def test_a_block_read_for_lookups_refuses_keys_out_of_order(keys: list[bytes]) -> None:
    """Lookups bisect the keys: unordered ones would miss silently. Scans skip the check
    (it costs some 15% of a full scan's throughput)."""
    data = body((b"", keys, [b"1", b"2"], SEQS_2))
    with pytest.raises(CorruptionError, match="strictly increasing"):
        open_columnar(data)
    raw = RawColumnarBlock(data[:-8])
    with pytest.raises(CorruptionError, match="strictly increasing"):
        raw.decode()
    with pytest.raises(CorruptionError, match="strictly increasing"):
        raw.get(b"a")
