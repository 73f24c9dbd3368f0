"""Merging sorted entry streams: the newest version of each key wins."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from slatepy.format.block import Entry


def merge_newest(sources: Iterable[Iterator[Entry]]) -> Iterator[Entry]:
    """Merge key-sorted streams (each with unique keys) into one, keeping the highest seq.

    Ties on seq (the same version copied into two tables) keep the first source's entry.
    Memory: one pending entry per source.
    """
    sources = list(sources)
    if len(sources) == 1:  # a database compacted into one sorted run: nothing to merge
        yield from sources[0]
        return
    tagged = (_tagged(source, order) for order, source in enumerate(sources))
    last: bytes | None = None
    for key, neg_seq, _, value in heapq.merge(*tagged):
        if key != last:
            last = key
            yield key, -neg_seq, value


def _tagged(source: Iterator[Entry], order: int) -> Iterator[tuple[bytes, int, int, bytes | None]]:
    # A function, not a nested generator expression: that would read ``order`` only when
    # heapq.merge first pulls from it, after every source was enumerated, and tag all of
    # them with the last index (ties on seq then fell to comparing the values).
    for key, seq, value in source:
        yield key, -seq, order, value
