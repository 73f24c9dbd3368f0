"""Merging a window that one source dominates by slices of it, not by sorting every row
(issue 33 item 1: a few fresh L0 SSTs or a memtable over a compacted run).

A merge window (:func:`slatepy.engine.columns.merge_columns`) whose rows are nearly all one
source's (a run's group of 2,048 rows and a few rows of small L0 SSTs) spends most of a
sort's cost on rows that need no ordering: the run's keys between two keys of the others
are already final. Here the source whose next key comes first hands on, with one C bisect,
every row before the others' next key as one slice (a list copy in C); a key that several
sources hold at once is resolved on its own (highest seq, an earlier source on a tie). The
steps are one per stretch of a source, so this pays only when stretches are long:
:func:`dominated` says when (the rows outside the largest part are few), and other windows
keep the sort of :func:`slatepy.table.merge.newest_columns`, whose result this equals.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import repeat

from slatepy.table.grouping import Columns
from slatepy.table.merge import newest_columns

LEAD_RATIO = 8
"""A window goes by slices when its rows outside its largest part are at most a
``LEAD_RATIO``-th of its rows. Measured on windows of a 2,048-row part and ``m`` rows of
one other (16-byte keys, Python path, best of 20): slices cost 74 µs against the sort's 295
at m = 2% of the part, 222 against 344 at 12%, 325 against 371 at 20%, 444 against 402 at
30%: each other row costs a step here, about 0.7 µs, the sort about 0.15 µs a row of the
window. Several other parts add their own (tagged) sort, about 0.3 µs a row: hence a margin
below the break-even."""


def dominated(parts: Sequence[tuple[int, Columns]]) -> bool:
    """Whether one part holds all but a ``LEAD_RATIO``-th of the window's rows."""
    sizes = [len(p[1][0]) for p in parts]
    total = sum(sizes)
    return (total - max(sizes)) * LEAD_RATIO <= total


def newest_by_slices(
    parts: Sequence[tuple[int, Columns]], reverse: bool
) -> tuple[list[bytes], list[int], list[bytes | None]]:
    """The newest version of each key of ``parts`` (``(source index, columns)`` in source
    order, each in scan order with unique keys), in scan order: the highest seq, the earlier
    source on a tie, tombstones and entry kinds kept as versions (as
    :func:`slatepy.table.merge.newest_columns`, reversed with ``reverse``).

    The largest part is the base; the others' rows (few, in a dominated window) are merged
    among themselves by ``newest_columns``, each tagged with its source, then placed into
    the base at their bisected positions: the base's rows between two of them go on as one
    slice; a key both hold keeps the newer version."""
    if reverse:  # descending parts: merged ascending, then turned back
        ascending = [(o, (k[::-1], s[::-1], v[::-1])) for o, (k, s, v) in parts]
        keys, seqs, values = newest_by_slices(ascending, False)
        keys.reverse()
        seqs.reverse()
        values.reverse()
        return keys, seqs, values
    base_order, (base_keys, base_seqs, base_values) = max(parts, key=lambda p: len(p[1][0]))
    rest = [(order, columns) for order, columns in parts if order != base_order]
    other_keys: Sequence[bytes]
    other_seqs: Sequence[int]
    other_values: Sequence[bytes | None]
    orders: Iterable[int]
    if len(rest) == 1:  # one other part: already in order, one version a key
        order, (other_keys, other_seqs, other_values) = rest[0]
        orders = repeat(order)
    else:
        other_keys, other_seqs, tagged = newest_columns(
            (keys, seqs, list(zip(repeat(order), values))) for order, (keys, seqs, values) in rest
        )
        orders = [order for order, _ in tagged]
        other_values = [value for _, value in tagged]
    cuts = list(map(bisect_left, repeat(base_keys), other_keys))
    out_keys: list[bytes] = []
    out_seqs: list[int] = []
    out_values: list[bytes | None] = []
    size = len(base_keys)
    done = 0  # base rows placed
    for key, other_seq, other_value, order, cut in zip(
        other_keys,
        other_seqs,
        other_values,
        orders,
        cuts,
        strict=False,  # orders may repeat
    ):
        if cut > done:
            out_keys += base_keys[done:cut]
            out_seqs += base_seqs[done:cut]
            out_values += base_values[done:cut]
        seq, value = other_seq, other_value
        done = cut
        if cut < size and base_keys[cut] == key:  # both hold the key: the newer version
            done = cut + 1
            base_seq = base_seqs[cut]
            if base_seq > seq or (base_seq == seq and base_order < order):
                seq, value = base_seq, base_values[cut]
        out_keys.append(key)
        out_seqs.append(seq)
        out_values.append(value)
    out_keys += base_keys[done:]
    out_seqs += base_seqs[done:]
    out_values += base_values[done:]
    return out_keys, out_seqs, out_values
