"""The merge iterators."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from slatepy.format.block import Entry
from slatepy.table.merge import merge_newest


def streams(*sources: Sequence[Entry]) -> list[Iterator[Entry]]:
    return [iter(source) for source in sources]


@pytest.mark.parametrize(
    ("first", "second"), [(b"z", b"a"), (b"a", b"z"), (None, b"a"), (b"a", None)]
)
def test_a_tie_on_seq_keeps_the_first_source(first: bytes | None, second: bytes | None) -> None:
    sources = ([(b"k", 5, first)], [(b"k", 4, b"old"), (b"l", 5, first)], [(b"l", 5, second)])
    expected = [(b"k", 5, first), (b"l", 5, first)]
    assert list(merge_newest(streams(*sources))) == expected
