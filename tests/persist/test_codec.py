"""The update codec: the order-preserving key encoding, validation, consolidation and
inline parts (RFC 0015 §2, §5.1)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.errors import CorruptionError
from slatepy.format.block import BlockBuilder, decode_block
from slatepy.persist.codec import (
    MAX_ENCODED_KEY,
    U64_MAX,
    Update,
    decode_entries,
    decode_entry,
    decode_inline,
    decode_key,
    encode_columns,
    encode_diff,
    encode_inline,
    encode_key,
    encoded_key_size,
)
from slatepy.persist.consolidation import advance, consolidate
from slatepy.persist.errors import InvalidBounds, UsageError
from slatepy.persist.validate import check_bounds, check_frontier, check_updates

# Bytes rich in the escape's special values, so that the edge cases come up often.
fields = st.binary(max_size=6) | st.lists(
    st.sampled_from([b"\0", b"\x01", b"\xff", b"a"]), max_size=5
).map(b"".join)
times = st.integers(0, U64_MAX) | st.sampled_from([0, 1, 255, 256, U64_MAX])
triples = st.tuples(fields, fields, times)


@given(triples)
def test_key_round_trip(triple: tuple[bytes, bytes, int]) -> None:
    encoded = encode_key(*triple)
    assert decode_key(encoded) == triple
    assert len(encoded) == encoded_key_size(triple[0], triple[1])


@settings(max_examples=300)
@given(triples, triples)
def test_byte_order_is_tuple_order(
    a: tuple[bytes, bytes, int], b: tuple[bytes, bytes, int]
) -> None:
    ea, eb = encode_key(*a), encode_key(*b)
    assert (ea < eb) == (a < b)
    assert (ea == eb) == (a == b)


def test_prefix_sorts_first_even_before_a_nul() -> None:
    assert encode_key(b"a", b"", 9) < encode_key(b"a\0", b"", 0) < encode_key(b"a\x01", b"", 0)
    assert encode_key(b"", b"\xff", 5) < encode_key(b"\0", b"", 0)


@pytest.mark.parametrize(
    "data",
    [
        b"abc",  # no terminator
        b"a\0b\0\x01\0\x01" + b"\0" * 8,  # an unescaped NUL in the key
        b"a\0\x01b\0\x01" + b"\0" * 7,  # time of 7 bytes
        b"a\0\x01b\0\x01" + b"\0" * 9,  # time of 9 bytes
    ],
)
def test_decode_key_rejects_malformed_bytes(data: bytes) -> None:
    with pytest.raises(CorruptionError):
        decode_key(data)


def test_check_updates_accepts_valid_updates_as_a_list() -> None:
    updates = [((b"k", b"v"), 3, -2), ((b"", b""), 4, 0)]
    assert check_updates(iter(updates), 3, 5) == updates
    assert check_updates([((b"k", b""), U64_MAX, 1)], 0, None) == [((b"k", b""), U64_MAX, 1)]


updates_lists = st.lists(
    st.tuples(st.tuples(fields, fields), st.integers(0, 20), st.integers(-3, 3)), max_size=30
)


@given(updates_lists, st.booleans())
def test_check_updates_fast_path_agrees_with_the_loop(updates: list[Update], lists: bool) -> None:
    """Plain tuples take the column checks, other sequences the per-update loop: the same
    updates come out as tuples either way."""
    given_updates: list[object] = (
        [[list(kv), t, d] for kv, t, d in updates] if lists else list(updates)
    )
    assert check_updates(given_updates, 0, 21) == updates
    if updates:
        with pytest.raises(UsageError, match="outside"):
            check_updates(given_updates, 0, max(t for _, t, _ in updates))


@given(updates_lists)
def test_encode_columns_is_encode_key_and_encode_diff(updates: list[Update]) -> None:
    keys, seqs, values = encode_columns(updates)
    assert keys == [encode_key(k, v, t) for (k, v), t, _ in updates]
    assert seqs == [t for _, t, _ in updates]
    assert values == [encode_diff(d) for _, _, d in updates]


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (((b"k", "v"), 1, 1), "must be bytes"),
        ((("k", b"v"), 1, 1), "must be bytes"),
        (((bytearray(b"k"), b"v"), 1, 1), "must be bytes"),
        (((b"k", b"v"), True, 1), "time must be an int"),
        (((b"k", b"v"), -1, 1), "time must be an int"),
        (((b"k", b"v"), 1.0, 1), "time must be an int"),
        (((b"k", b"v"), 0, 1), "outside [1, 10)"),
        (((b"k", b"v"), 10, 1), "outside [1, 10)"),
        (((b"k", b"v"), 1, 1 << 63), "diff must be an int"),
        (((b"k", b"v"), 1, False), "diff must be an int"),
        (((b"k", b"v"), 1), "is not ((key, value), time, diff)"),
        ((b"kv", 1, 1), "must be bytes"),
        (None, "is not ((key, value), time, diff)"),
    ],
)
def test_check_updates_rejects(update: object, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        check_updates([((b"ok", b""), 1, 1), update], 1, 10)


def test_key_size_limit_is_the_sst_key_limit() -> None:
    fits = b"x" * (MAX_ENCODED_KEY - 12)
    assert encoded_key_size(fits, b"") == MAX_ENCODED_KEY
    check_updates([((fits, b""), 0, 1)], 0, 1)
    with pytest.raises(UsageError, match="too large"):
        check_updates([((fits, b"\0"), 0, 1)], 0, 1)  # the NUL costs 2 bytes escaped


def test_the_size_check_counts_nuls_wherever_they_could_overflow() -> None:
    """Keys of NULs only double when escaped: the largest that fits, and one more."""
    most = (MAX_ENCODED_KEY - 12) // 2
    check_updates([((b"\0" * most, b""), 0, 1)], 0, 1)
    with pytest.raises(UsageError, match="too large"):
        check_updates([((b"\0" * most, b"\0"), 0, 1)], 0, 1)


@pytest.mark.parametrize(("lower", "upper"), [(5, 5), (6, 5), (None, 7), (None, None)])
def test_check_bounds_raises_invalid_bounds(lower: int | None, upper: int | None) -> None:
    with pytest.raises(InvalidBounds):
        check_bounds(lower, upper, names=("lower", "upper"))
    assert issubclass(InvalidBounds, UsageError) and issubclass(InvalidBounds, ValueError)


def test_check_bounds_accepts_none_as_the_greatest_upper() -> None:
    check_bounds(5, None, names=("lower", "upper"))
    check_bounds(5, 6, names=("lower", "upper"))


def test_check_frontier() -> None:
    assert check_frontier(None, "upper") is None
    assert check_frontier(7, "upper") == 7
    for bad in (-1, 1 << 64, "7", 7.0, True):
        with pytest.raises(UsageError):
            check_frontier(bad, "upper")


def test_advance_is_max() -> None:
    assert advance(3, 5) == 5
    assert advance(7, 5) == 7


def test_consolidate_forwards_sums_drops_zeros_and_sorts() -> None:
    updates: list[Update] = [
        ((b"b", b""), 9, 1),
        ((b"a", b"x"), 1, 1),
        ((b"a", b"x"), 4, -1),  # cancels the one above once both are at since 5
        ((b"a", b""), 2, 2),
        ((b"a", b""), 3, 3),
        ((b"c", b""), 7, 0),
    ]
    assert consolidate(updates, since=5) == [((b"a", b""), 5, 5), ((b"b", b""), 9, 1)]
    assert consolidate(updates) == [
        ((b"a", b""), 2, 2),
        ((b"a", b""), 3, 3),
        ((b"a", b"x"), 1, 1),
        ((b"a", b"x"), 4, -1),
        ((b"b", b""), 9, 1),
    ]


def test_consolidate_refuses_a_sum_beyond_i64() -> None:
    with pytest.raises(UsageError, match="beyond an i64"):
        consolidate([((b"k", b""), 1, (1 << 63) - 1), ((b"k", b""), 1, 1)])


@given(updates_lists, st.none() | st.integers(0, 25))
def test_consolidate_matches_a_multiset_model(updates: list[Update], since: int | None) -> None:
    model: Counter[tuple[bytes, bytes, int]] = Counter()
    for (k, v), t, d in updates:
        model[(k, v, t if since is None else max(t, since))] += d
    expected = sorted(((k, v), t, d) for (k, v, t), d in model.items() if d)
    out = consolidate(updates, since)
    assert out == expected
    assert consolidate(out, since) == out


@given(updates_lists)
def test_inline_part_round_trip(updates: list[Update]) -> None:
    data = consolidate(updates)
    if not data:
        return
    encoded = encode_inline(data)
    assert decode_inline(encoded) == data
    # It is a data block of the SST format: entry keys in order, seq = time, 8-byte values.
    block = decode_block(encoded)
    assert block.keys == sorted(block.keys)
    assert block.seqs == [t for _, t, _ in data]
    assert block.values == [encode_diff(d) for _, _, d in data]


@pytest.mark.parametrize(
    "updates",
    [
        [],
        [((b"a", b""), 1, 0)],
        [((b"b", b""), 1, 1), ((b"a", b""), 1, 1)],
        [((b"a", b""), 1, 1), ((b"a", b""), 1, 2)],
    ],
)
def test_encode_inline_requires_consolidated_updates(updates: list[Update]) -> None:
    with pytest.raises(UsageError):
        encode_inline(updates)


def test_inline_part_flipped_byte_is_corruption() -> None:
    data = encode_inline([((b"k", b"v"), 3, 1), ((b"k", b"w"), 3, -1)])
    for i in range(len(data)):
        broken = bytearray(data)
        broken[i] ^= 0x40
        with pytest.raises(CorruptionError):
            decode_inline(bytes(broken))


@pytest.mark.parametrize(
    ("seq", "value"),
    [(4, encode_diff(1)), (3, None), (3, b"\x01\x00")],
    ids=["seq-not-time", "tombstone", "short-value"],
)
def test_decode_entry_rejects_entries_that_are_not_updates(seq: int, value: bytes | None) -> None:
    key = encode_key(b"k", b"v", 3)
    with pytest.raises(CorruptionError):
        decode_entry(key, seq, value)
    builder = BlockBuilder()
    builder.add(key, seq, value)
    with pytest.raises(CorruptionError):
        decode_inline(builder.finish())


@given(updates_lists)
def test_decode_entries_is_decode_entry_on_each(updates: list[Update]) -> None:
    """The column path (no NUL in a field) and the per-entry path (NULs) agree."""
    entries = list(zip(*encode_columns(consolidate(updates)), strict=True))
    assert decode_entries(entries) == [decode_entry(*entry) for entry in entries]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ((encode_key(b"k", b"v", 3), 4, encode_diff(1)), "seq 4 is not the key's time 3"),
        ((encode_key(b"k", b"v", 3), 3, None), "not an 8-byte diff"),
        ((b"k\0\x01v" + bytes(8), 0, encode_diff(1)), "value has no terminator"),
        ((b"k\0\x01v\0\x01\0\x01" + bytes(8), 0, encode_diff(1)), "time is not the last 8"),
    ],
)
def test_decode_entries_reports_a_bad_entry_like_decode_entry(
    entry: tuple[bytes, int, bytes | None], message: str
) -> None:
    good = (encode_key(b"a", b"b", 3), 3, encode_diff(2))
    for decode in (lambda: decode_entry(*entry), lambda: decode_entries([good, entry])):
        with pytest.raises(CorruptionError, match=re.escape(message)):
            decode()
