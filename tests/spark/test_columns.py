"""The bulk load's vectorised columns (``slatepy.spark.columns``) against plain Python: the
same encoded keys as the codec, the same order as ``sorted`` of bytes, the last of equal
keys, and runs merged with the later one winning."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from slatepy.errors import InvalidArgument  # noqa: E402
from slatepy.spark.codec import Column, RowCodec  # noqa: E402
from slatepy.spark.columns import (  # noqa: E402
    BINARY,
    Pairs,
    binary_columns,
    in_order,
    merge_sorted,
    sort_unique,
    sorted_chunks,
)

PAIRS = st.lists(st.tuples(st.binary(min_size=1, max_size=4), st.binary(max_size=3)), max_size=60)
FIXED = st.lists(st.tuples(st.binary(min_size=3, max_size=3), st.binary(max_size=3)), max_size=60)


def arrays(pairs: list[tuple[bytes, bytes]]) -> Pairs:
    return pa.array([k for k, _ in pairs], BINARY), pa.array([v for _, v in pairs], BINARY)


def last_of_equal(pairs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The reference: a stable sort by key, the last of equal keys kept."""
    ordered = sorted(pairs, key=lambda p: p[0])
    return [list(group)[-1] for _, group in itertools.groupby(ordered, key=lambda p: p[0])]


def listed(pairs: Pairs) -> list[tuple[bytes, bytes]]:
    return list(zip(pairs[0].to_pylist(), pairs[1].to_pylist(), strict=True))


@settings(max_examples=150, deadline=None)
@given(st.one_of(PAIRS, FIXED))
def test_sort_unique_is_a_stable_sort_keeping_the_last_of_equal_keys(
    pairs: list[tuple[bytes, bytes]],
) -> None:
    # FIXED: keys of one width take numpy's sort; PAIRS mostly Arrow's; sorted input none.
    assert listed(sort_unique(arrays(pairs))) == last_of_equal(pairs)
    chunks = [row for part in sorted_chunks(arrays(pairs), 7) for row in listed(part)]
    assert chunks == last_of_equal(pairs)
    ordered = last_of_equal(pairs)
    assert listed(sort_unique(arrays(ordered))) == ordered


@settings(max_examples=150, deadline=None)
@given(st.lists(PAIRS, min_size=1, max_size=5), st.integers(1, 7))
def test_merge_sorted_runs_keeps_the_later_runs_row(
    runs: list[list[tuple[bytes, bytes]]], chunk: int
) -> None:
    def chunks(run: list[tuple[bytes, bytes]]) -> Iterator[Pairs]:
        unique = last_of_equal(run)
        for i in range(0, len(unique), chunk):
            yield arrays(unique[i : i + chunk])

    merged = [row for part in merge_sorted([chunks(r) for r in runs]) for row in listed(part)]
    assert merged == last_of_equal([row for run in runs for row in last_of_equal(run)])


def test_in_order_needs_strictly_increasing_keys_across_chunks() -> None:
    def keys(*chunks: list[bytes]) -> list[object]:
        return [pa.array(c, BINARY) for c in chunks]

    assert in_order(keys([b"a", b"b"], [], [b"c"]))
    assert not in_order(keys([b"a", b"b"], [b"b"]))  # equal across chunks
    assert not in_order(keys([b"a", b"a"]))  # equal within
    assert not in_order(keys([b"b"], [b"a"]))


@pytest.mark.parametrize("kind", ["long", "integer", "short", "byte", "string", "binary"])
def test_binary_columns_encode_as_the_codec(kind: str) -> None:
    columns = (Column("k", kind, False), Column("v", "binary", False))
    codec = RowCodec.of(columns, ["k"], "v")
    keys: list[object] = {
        "long": [-(2**63), -1, 0, 1, 2**63 - 1],
        "integer": [-(2**31), -1, 0, 2**31 - 1],
        "short": [-(2**15), 0, 2**15 - 1],
        "byte": [-128, 0, 127],
        "string": ["", "é", "a\x00b"],
        "binary": [b"", b"\x00", b"\xff"],
    }[kind]
    arrow = {"long": pa.int64(), "integer": pa.int32(), "short": pa.int16(), "byte": pa.int8()}
    key_array = pa.array(keys, arrow.get(kind, pa.string() if kind == "string" else pa.binary()))
    values = [b"%d" % i for i in range(len(keys))]
    batch = pa.record_batch([key_array, pa.array(values, pa.binary())], names=["k", "v"])
    encoded_keys, encoded_values = binary_columns(codec, batch)
    assert (encoded_keys.to_pylist(), encoded_values.to_pylist()) == codec.from_batch(batch)


def test_binary_columns_with_a_null_key_fail_naming_the_option() -> None:
    columns = (Column("k", "long", True), Column("v", "binary", False))
    codec = RowCodec.of(columns, ["k"], "v")
    batch = pa.record_batch(
        [pa.array([1, None], pa.int64()), pa.array([b"a", b"b"])], names=["k", "v"]
    )
    with pytest.raises(InvalidArgument, match="option 'key'"):
        binary_columns(codec, batch)
