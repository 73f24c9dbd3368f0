"""The numpy merge of fixed-width keys (``newest_fixed_width``, issue 33) keeps exactly what
the entry-at-a-time merge and the Python columnar merge keep: the highest seq of each key, an
earlier source winning a tie, tombstones and entry kinds kept as versions, whatever bytes the
keys hold (NULs, trailing NULs and 0xff included) and whether parts come ascending or
descending."""

from __future__ import annotations

from array import array
from itertools import chain, pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.format.kinds import Operands
from slatepy.table.key_order import VECTOR_MIN_ROWS, newest_fixed_width
from slatepy.table.merge import merge_newest, newest_columns

Part = tuple[list[bytes], list[int], list[bytes | None]]

suffix_bytes = st.sampled_from([0, 1, 0x61, 0xFE, 0xFF])
value = st.one_of(st.none(), st.binary(max_size=3), st.builds(Operands, st.binary(max_size=3)))


@st.composite
def fixed_width_parts(draw: st.DrawFn) -> list[Part]:
    """Up to 6 sources of keys of one width (1 to 20 bytes: one word or several after the
    shared prefix), each key-sorted with unique keys; seqs from a small range (ties and seqs
    out of source order happen)."""
    width = draw(st.integers(1, 20))
    prefix = draw(st.binary(min_size=0, max_size=width))
    tail = width - len(prefix)
    key = st.lists(suffix_bytes, min_size=tail, max_size=tail).map(lambda b: prefix + bytes(b))
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        versions = draw(st.dictionaries(key, st.tuples(st.integers(0, 4), value), max_size=25))
        keys = sorted(versions)
        parts.append((keys, [versions[k][0] for k in keys], [versions[k][1] for k in keys]))
    return parts


def expected(parts: list[Part]) -> list[tuple[bytes, int, bytes | None]]:
    return list(merge_newest(iter(list(zip(*p, strict=True))) for p in parts))


def seqs_rise_in_source_order(parts: list[Part]) -> bool:
    """Whether a key has a version with a higher seq in a later source than in an earlier one."""
    seen: dict[bytes, list[int]] = {}
    for keys, seqs, _ in parts:
        for key, seq in zip(keys, seqs, strict=True):
            seen.setdefault(key, []).append(seq)
    return any(any(a < b for a, b in pairwise(s)) for s in seen.values())


@settings(max_examples=300, deadline=None)
@given(fixed_width_parts(), st.booleans(), st.booleans())
def test_the_numpy_merge_keeps_what_the_entry_merge_keeps(
    parts: list[Part], descending: bool, seq_arrays: bool
) -> None:
    """Seqs as lists (the memtable's) or as ``array('Q')`` (a decoded block's)."""
    model = expected(parts)
    given_parts: list[Any] = parts
    if descending:
        given_parts = [(k[::-1], s[::-1], v[::-1]) for k, s, v in parts]
    if seq_arrays:
        given_parts = [(k, array("Q", s), v) for k, s, v in given_parts]
    given_parts = [p for p in given_parts if p[0]]
    if not given_parts:
        return
    keys = list(chain.from_iterable(p[0] for p in given_parts))
    got = newest_fixed_width(given_parts, keys)
    if got is None:
        assert seqs_rise_in_source_order(parts)  # the only reason to decline fixed widths
    else:
        assert list(zip(*got, strict=True)) == model
    assert list(zip(*newest_columns(given_parts), strict=True)) == model


def test_variable_length_keys_take_the_python_merge() -> None:
    parts: list[Part] = [([b"a", b"a\x00"], [1, 1], [b"x", b"y"]), ([b"a\x00"], [2], [b"z"])]
    assert newest_fixed_width(parts, [b"a", b"a\x00", b"a\x00"]) is None
    assert newest_columns(parts) == ([b"a", b"a\x00"], [1, 2], [b"x", b"z"])


def test_two_overlapping_runs_merge_alike() -> None:
    """Two fully overlapping runs of 16-byte keys (as a sustained load leaves them), the
    newer rewriting every third key and deleting every fifth."""
    rows = VECTOR_MIN_ROWS * 2
    old: Part = ([b"key-%012d" % i for i in range(rows)], [1] * rows, [b"old"] * rows)
    new_keys = [b"key-%012d" % i for i in range(0, rows, 3)]
    new: Part = (
        new_keys,
        [2] * len(new_keys),
        [None if i % 5 == 0 else b"new" for i in range(len(new_keys))],
    )
    keys = list(chain(new[0], old[0]))
    assert newest_fixed_width([new, old], keys) is not None
    assert list(zip(*newest_columns([new, old]), strict=True)) == expected([new, old])
