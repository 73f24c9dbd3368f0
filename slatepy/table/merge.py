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
    tagged = (
        ((key, -seq, order, value) for key, seq, value in source)
        for order, source in enumerate(sources)
    )
    last: bytes | None = None
    for key, neg_seq, _, value in heapq.merge(*tagged):
        if key != last:
            last = key
            yield key, -neg_seq, value
