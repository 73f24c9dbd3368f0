"""The write path's consolidate step (``persist/pipeline.py``), also used by reads and
compaction: updates forwarded to a frontier, diffs of equal ``(k, v, t)`` summed, zero sums
dropped, sorted by ``(k, v, t)`` (RFC 0015 §2, §7.2). Nothing here does I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from itertools import islice

from slatepy.persist.codec import I64_MAX, I64_MIN, Update
from slatepy.persist.errors import UsageError

_third = operator.itemgetter(2)
_pair_and_time = operator.itemgetter(0, 1)


def advance(time: int, frontier: int) -> int:
    """``time`` forwarded to ``frontier``: ``max(time, frontier)``. Monotone, so a stream
    sorted by ``(k, v, t)`` stays sorted after it."""
    return frontier if time < frontier else time


def consolidate(updates: Iterable[Update], since: int | None = None) -> list[Update]:
    """Forward times to ``since`` (none when ``None``), sum the diffs of equal
    ``(k, v, t)``, drop zero sums, sort by ``(k, v, t)``.

    Raises:
        UsageError: a sum does not fit an i64.
    """
    if since is None:
        # Sorting the update tuples orders them by (k, v, t) (ties by diff), in C; when no
        # (k, v, t) repeats and no diff is zero (a typical batch) that is the answer.
        ordered = sorted(updates)
        triples = list(map(_pair_and_time, ordered))
        if 0 not in map(_third, ordered) and all(
            map(operator.ne, triples, islice(triples, 1, None))
        ):
            return ordered
        updates = ordered
    sums: dict[tuple[bytes, bytes, int], int] = {}
    for (key, value), time, diff in updates:
        triple = (key, value, since if since is not None and time < since else time)
        sums[triple] = sums.get(triple, 0) + diff
    out: list[Update] = []
    for (key, value, time), diff in sorted(sums.items()):
        if diff:
            if not I64_MIN <= diff <= I64_MAX:
                raise UsageError(f"the diffs of {(key, value, time)!r} sum beyond an i64")
            out.append(((key, value), time, diff))
    return out
