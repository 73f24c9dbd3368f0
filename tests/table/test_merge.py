"""The merge iterators: newest-wins (the KV engine), sum-of-diffs (persist), and the generic
loop with a pluggable combine that both are instances of."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import InvalidArgument
from slatepy.format.block import Entry
from slatepy.table.merge import merge, merge_newest, merge_sum, newest, sum_diffs

I64_MAX = (1 << 63) - 1
I64_MIN = -(1 << 63)

Table = dict[bytes, tuple[int, bytes | None]]
"""One source as a model: key -> (seq, value)."""


def diff(n: int) -> bytes:
    return n.to_bytes(8, "little", signed=True)


def streams(*sources: Sequence[Entry]) -> list[Iterator[Entry]]:
    return [iter(source) for source in sources]


def entries(table: Table) -> list[Entry]:
    return [(key, seq, value) for key, (seq, value) in sorted(table.items())]


keys = st.sampled_from([b"a", b"ab", b"b", b"ba", b"c", b"\xff"])  # few: sources overlap
tables = st.dictionaries(keys, st.tuples(st.integers(0, 20), st.none() | st.binary(max_size=4)))
diff_tables = st.dictionaries(
    keys,
    st.tuples(st.integers(0, 20), st.integers(-3, 3).map(diff)),
)


# -- newest wins ------------------------------------------------------------------------


def test_newest_version_wins_and_tombstones_stay() -> None:
    newer = [(b"a", 9, None), (b"c", 8, b"c2")]
    older = [(b"a", 1, b"a1"), (b"b", 2, b"b1"), (b"c", 3, b"c1")]
    expected = [(b"a", 9, None), (b"b", 2, b"b1"), (b"c", 8, b"c2")]
    assert list(merge_newest(streams(newer, older))) == expected
    assert list(merge_newest(streams(older, newer))) == expected  # seq decides, not order


@pytest.mark.parametrize(
    ("first", "second"), [(b"z", b"a"), (b"a", b"z"), (None, b"a"), (b"a", None)]
)
def test_a_tie_on_seq_keeps_the_first_source(first: bytes | None, second: bytes | None) -> None:
    sources = ([(b"k", 5, first)], [(b"k", 4, b"old"), (b"l", 5, first)], [(b"l", 5, second)])
    expected = [(b"k", 5, first), (b"l", 5, first)]
    assert list(merge_newest(streams(*sources))) == expected
    assert list(merge(streams(*sources), newest)) == expected


def test_one_source_is_passed_through() -> None:
    source = iter([(b"a", 1, b"x"), (b"b", 2, None)])
    merged = merge_newest([source])
    assert list(merged) == [(b"a", 1, b"x"), (b"b", 2, None)]


def test_no_sources_and_empty_sources() -> None:
    assert list(merge_newest([])) == []
    assert list(merge_newest(streams([], []))) == []
    assert list(merge(streams([], []), newest)) == []


@given(st.lists(tables, max_size=5))
def test_merge_newest_is_merge_with_the_newest_combine(sources: list[Table]) -> None:
    model: dict[bytes, tuple[int, int, bytes | None]] = {}  # key -> (-seq, source, value)
    for order, table in enumerate(sources):
        for key, (seq, value) in table.items():
            model[key] = min(model.get(key, (1, 0, None)), (-seq, order, value))
    expected = [(key, -neg_seq, value) for key, (neg_seq, _, value) in sorted(model.items())]
    assert list(merge_newest(streams(*map(entries, sources)))) == expected
    assert list(merge(streams(*map(entries, sources)), newest)) == expected


# -- the generic loop ---------------------------------------------------------------------


def test_combine_sees_each_key_newest_first_and_may_drop_it() -> None:
    runs: list[list[Entry]] = []

    def record(run: Sequence[Entry]) -> Entry | None:
        runs.append(list(run))
        return None if run[0][0] == b"b" else (run[0][0], len(run), b"")

    merged = merge(streams([(b"a", 1, b"1"), (b"b", 5, b"5")], [(b"a", 3, b"3")]), record)
    assert list(merged) == [(b"a", 2, b"")]
    assert runs == [[(b"a", 3, b"3"), (b"a", 1, b"1")], [(b"b", 5, b"5")]]


def test_a_source_may_repeat_a_key() -> None:
    # Persist advances times to `since` before consolidating: equal keys within one part.
    source = [(b"k", 2, diff(1)), (b"k", 1, diff(1)), (b"z", 1, diff(1))]
    assert list(merge_sum(streams(source, [(b"k", 3, diff(-1))]))) == [
        (b"k", 3, diff(1)),
        (b"z", 1, diff(1)),
    ]


# -- sum of diffs -------------------------------------------------------------------------


def test_equal_keys_sum_their_diffs_keeping_the_newest_seq() -> None:
    a = [(b"x", 1, diff(2)), (b"y", 2, diff(-1))]
    b = [(b"x", 7, diff(3)), (b"z", 3, diff(4))]
    assert list(merge_sum(streams(a, b))) == [
        (b"x", 7, diff(5)),
        (b"y", 2, diff(-1)),
        (b"z", 3, diff(4)),
    ]


def test_a_zero_sum_drops_the_key() -> None:
    a = [(b"x", 1, diff(2)), (b"y", 1, diff(1))]
    b = [(b"x", 2, diff(-2))]
    assert list(merge_sum(streams(a, b))) == [(b"y", 1, diff(1))]
    assert list(merge_sum(streams([(b"x", 1, diff(5))], [(b"x", 2, diff(-2))], b))) == [
        (b"x", 2, diff(1))
    ]


@pytest.mark.parametrize(
    ("diffs", "total"),
    [
        ([I64_MAX, I64_MIN], -1),
        ([I64_MAX, 1, -2], I64_MAX - 1),  # the partial sum I64_MAX + 1 does not fit
        ([I64_MIN, -1, 2], I64_MIN + 1),
        ([I64_MAX, I64_MAX, -I64_MAX], I64_MAX),
        ([I64_MAX, -I64_MAX], 0),
        ([1 << 40, 1 << 40, 1 << 40], 3 << 40),
    ],
)
def test_large_diffs_sum_exactly(diffs: list[int], total: int) -> None:
    # Summed newest first, in the order given: one source per diff, seqs descending.
    sources = [[(b"k", len(diffs) - i, diff(d))] for i, d in enumerate(diffs)]
    expected = [(b"k", len(diffs), diff(total))] if total else []
    assert list(merge_sum(streams(*sources))) == expected


def test_a_total_outside_i64_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="outside the i64 range"):
        list(merge_sum(streams([(b"k", 2, diff(I64_MAX))], [(b"k", 1, diff(1))])))


@pytest.mark.parametrize("value", [None, b"", b"\x01" * 7, b"\x01" * 9])
def test_a_value_that_is_not_a_diff_is_refused(value: bytes | None) -> None:
    with pytest.raises(InvalidArgument, match="a diff is 8 bytes"):
        list(merge_sum(streams([(b"k", 1, value)])))
    with pytest.raises(InvalidArgument, match="a diff is 8 bytes"):
        list(merge_sum(streams([(b"k", 1, value)], [(b"k", 2, diff(1))])))


def test_one_source_drops_its_zero_diffs() -> None:
    source = [(b"a", 1, diff(0)), (b"b", 2, diff(-4)), (b"c", 3, diff(0))]
    assert list(merge_sum(streams(source))) == [(b"b", 2, diff(-4))]


def test_sum_of_no_sources_and_empty_sources() -> None:
    assert list(merge_sum([])) == []
    assert list(merge_sum(streams([], [], []))) == []
    assert list(merge_sum(streams([], [(b"a", 1, diff(1))]))) == [(b"a", 1, diff(1))]


def test_sum_diffs_of_one_entry_is_the_entry() -> None:
    entry = (b"k", 4, diff(-7))
    assert sum_diffs([entry]) is entry


@given(st.lists(diff_tables, max_size=5))
def test_merge_sum_consolidates_like_a_counter(sources: list[Table]) -> None:
    totals: dict[bytes, int] = {}
    seqs: dict[bytes, int] = {}
    for table in sources:
        for key, (seq, value) in table.items():
            assert value is not None
            totals[key] = totals.get(key, 0) + int.from_bytes(value, "little", signed=True)
            seqs[key] = max(seqs.get(key, seq), seq)
    expected = [(key, seqs[key], diff(total)) for key, total in sorted(totals.items()) if total]
    assert list(merge_sum(streams(*map(entries, sources)))) == expected
