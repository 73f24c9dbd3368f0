"""The row codec: key order is tuple order, values round-trip, bad mappings name the option."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

from slatepy.errors import InvalidArgument
from slatepy.spark.codec import Column, RowCodec, prefix_end

LONG = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=6)
BLOB = st.binary(max_size=6)


def codec(*types: str, value: str | None = None, extra: tuple[Column, ...] = ()) -> RowCodec:
    columns = tuple(Column(f"k{i}", t, False) for i, t in enumerate(types)) + extra
    return RowCodec.of(columns, [f"k{i}" for i in range(len(types))], value)


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # Strings compare as their UTF-8 bytes (Spark's order, and the key's)
    return tuple(v.encode() if isinstance(v, str) else v for v in row)


@pytest.mark.parametrize(
    ("types", "values"),
    [
        (("long",), st.tuples(LONG)),
        (("string",), st.tuples(TEXT)),
        (("string", "long"), st.tuples(TEXT, LONG)),
        (("binary", "string"), st.tuples(BLOB, TEXT)),
        (("string", "binary", "integer"), st.tuples(TEXT, BLOB, st.integers(-(2**31), 2**31 - 1))),
    ],
)
def test_key_order_is_tuple_order_and_keys_decode(types: tuple[str, ...], values: Any) -> None:
    c = codec(*types)

    @given(st.lists(values, max_size=30))
    def check(rows: list[tuple[Any, ...]]) -> None:
        keys = c.encode_keys([list(col) for col in zip(*rows, strict=True)] or [[] for _ in types])
        assert [k for _, k in sorted(zip(map(_sort_key, rows), keys, strict=True))] == sorted(keys)
        assert len(set(keys)) == len(set(rows))
        decoded = c.decode_keys(keys)
        assert [tuple(r) for r in zip(*decoded, strict=True)] == rows or not rows

    check()


def test_a_single_string_or_binary_key_is_its_bytes() -> None:
    assert codec("string").encode_keys([["abc"]]) == [b"abc"]
    assert codec("binary").encode_keys([[b"\x00x"]]) == [b"\x00x"]
    assert codec("long").encode_keys([[1]]) == [b"\x80" + b"\x00" * 6 + b"\x01"]


def test_values_round_trip_as_msgpack_or_raw() -> None:
    extra = (Column("name", "string"), Column("score", "double"), Column("ok", "boolean"))
    c = codec("long", extra=extra)
    values = c.encode_values({1: ["a", None], 2: [1.5, 2.0], 3: [True, None]}, 2)
    assert c.decode_values(values) == {1: ["a", None], 2: [1.5, 2.0], 3: [True, None]}
    raw = codec("string", value="v", extra=(Column("v", "binary"),))
    assert raw.encode_values({1: [b"x"]}, 1) == [b"x"]
    assert raw.decode_values([b"x"]) == {1: [b"x"]}


def test_bounds_and_prefixes() -> None:
    c = codec("string", "long")
    (key,) = c.encode_keys([["ab"], [5]])
    assert c.encode_bound("ab", "start") <= key < c.encode_bound("ac", "end")
    assert key.startswith(c.encode_bound("a", "prefix", prefix=True))
    assert prefix_end(b"ab\xff") == b"ac"
    assert prefix_end(b"\xff\xff") is None
    with pytest.raises(InvalidArgument, match="option 'prefix'"):
        codec("long").encode_bound("1", "prefix", prefix=True)
    with pytest.raises(InvalidArgument, match="option 'start'"):
        codec("long").encode_bound("x", "start")


@pytest.mark.parametrize(
    ("columns", "key", "value", "option"),
    [
        ((Column("id", "long"),), [], None, "option 'key' is required"),
        ((Column("id", "long"),), ["nope"], None, "option 'key': no column 'nope'"),
        ((Column("id", "double"),), ["id"], None, "option 'key': column 'id' is of type double"),
        ((Column("id", "long"), Column("v", "string")), ["id"], "v", "option 'value'"),
        ((Column("id", "long"), Column("v", "binary")), ["id"], "w", "option 'value': no column"),
        (
            (Column("id", "long"), Column("v", "binary"), Column("x", "long")),
            ["id"],
            "v",
            "option 'value': with a value column",
        ),
        ((Column("id", "long"), Column("t", "timestamp")), ["id"], None, "option 'value' not set"),
    ],
)
def test_mappings_that_cannot_encode_name_the_option(
    columns: tuple[Column, ...], key: list[str], value: str | None, option: str
) -> None:
    with pytest.raises(InvalidArgument, match=option):
        RowCodec.of(columns, key, value)


def test_nulls_in_keys_or_the_value_column_name_the_option() -> None:
    with pytest.raises(InvalidArgument, match="option 'key': key column 'k0' holds a null"):
        codec("string").encode_keys([["a", None]])
    raw = codec("string", value="v", extra=(Column("v", "binary"),))
    with pytest.raises(InvalidArgument, match="option 'value'"):
        raw.encode_values({1: [None]}, 1)
    with pytest.raises(InvalidArgument, match=r"option 'key'.*out of range"):
        codec("integer").encode_keys([[2**31]])
