"""Merging sorted entry streams, with a pluggable combine for the entries of one key.

Every merge orders its input the same way: by key, then newest (highest seq) first, then by
source (an earlier source wins a tie on seq). What becomes of the entries of one key is the
combine's decision: the KV engine keeps the newest version (:func:`newest`, tombstones
included, so they go on hiding older versions); persist sums its diffs and drops the keys
whose diffs cancel (:func:`sum_diffs`).

:func:`merge_newest` is the KV engine's merge with the combine written into the loop: scans
and compaction run every entry through it, and a call and a list per key cost about a
quarter more CPU than the specialised loop (``python -m bench.merge``, RFC 0015 §12).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, islice
from operator import eq, itemgetter, lt, ne, neg, not_
from typing import TypeVar

from slatepy.errors import InvalidArgument
from slatepy.format.block import Entry
from slatepy.format.kinds import Operands
from slatepy.table.key_order import newest_fixed_width, worth_numpy

Combine = Callable[[Sequence[Entry]], Entry | None]
"""What the entries of one key (at least one, newest first) become: one entry to emit, or
None to emit nothing for the key."""

DIFF_SIZE = 8
"""Bytes of a persist diff: an i64, little-endian."""
_ZERO = bytes(DIFF_SIZE)
_DIFF_MIN = -(1 << 63)
_DIFF_MAX = (1 << 63) - 1
V = TypeVar("V")


def _ordered(sources: Iterable[Iterator[Entry]]) -> Iterator[tuple[bytes, int, int, bytes | None]]:
    """The entries of all sources as ``(key, -seq, source index, value)``, in merge order."""
    return heapq.merge(*(_tagged(source, order) for order, source in enumerate(sources)))


def _tagged(source: Iterator[Entry], order: int) -> Iterator[tuple[bytes, int, int, bytes | None]]:
    # A function, not a nested generator expression: that would read ``order`` only when
    # heapq.merge first pulls from it, after every source was enumerated, and tag all of
    # them with the last index (ties on seq then fell to comparing the values).
    for key, seq, value in source:
        yield key, -seq, order, value


def merge(sources: Iterable[Iterator[Entry]], combine: Combine) -> Iterator[Entry]:
    """Merge key-sorted streams into one, letting ``combine`` decide each key's output.

    A source may repeat a key (all its entries meet in the key's run). Memory: one pending
    entry per source and the entries of the current key.
    """
    run: list[Entry] = []
    for key, neg_seq, _, value in _ordered(sources):
        if run and key != run[0][0]:
            out = combine(run)
            if out is not None:
                yield out
            run = []
        run.append((key, -neg_seq, value))
    if run:
        out = combine(run)
        if out is not None:
            yield out


def stamped(entries: Iterator[Entry], global_seq: int) -> Iterator[Entry]:
    """``entries`` of an SST, each with ``global_seq`` as its seq when the SST is an
    ingested one (``global_seq`` non-zero: its entries are stored with seq 0), else as they
    are (RFC 0016)."""
    if not global_seq:
        return entries
    return ((key, global_seq, value) for key, _, value in entries)


def newest(run: Sequence[Entry]) -> Entry:
    """The KV engine's combine: the newest version of the key (a tombstone too)."""
    return run[0]


def merge_newest(sources: Iterable[Iterator[Entry]]) -> Iterator[Entry]:
    """Merge key-sorted streams (each with unique keys) into one, keeping the highest seq.

    The same as ``merge(sources, newest)``, in a loop of its own for speed (see the module
    docstring). Ties on seq (the same version copied into two tables) keep the first
    source's entry. Memory: one pending entry per source.
    """
    sources = list(sources)
    if len(sources) == 1:  # a database compacted into one sorted run: nothing to merge
        yield from sources[0]
        return
    last: bytes | None = None
    for key, neg_seq, _, value in _ordered(sources):
        if key != last:
            last = key
            yield key, -neg_seq, value


def merge_folding(
    sources: Iterable[Iterator[Entry]], fold: Callable[[list[Entry]], Entry | None]
) -> Iterator[Entry]:
    """:func:`merge_newest`, except that a key whose newest entry is merge operands has all
    of its entries (newest first) passed to ``fold``, which says what to emit for it (RFC
    0019). Keys of plain versions cost one class check more than in :func:`merge_newest`.
    """
    sources = list(sources)
    if len(sources) == 1:  # one entry per key: nothing to fold across sources
        yield from sources[0]
        return
    last: bytes | None = None
    run: list[Entry] | None = None
    for key, neg_seq, _, value in _ordered(sources):
        if key != last:
            if run is not None:
                out = fold(run)
                run = None
                if out is not None:
                    yield out
            last = key
            if value.__class__ is Operands:
                run = [(key, -neg_seq, value)]
            else:
                yield key, -neg_seq, value
        elif run is not None:
            run.append((key, -neg_seq, value))
    if run is not None:
        out = fold(run)
        if out is not None:
            yield out


def sum_diffs(run: Sequence[Entry]) -> Entry | None:
    """Persist's combine: the key with the sum of its diffs, or None when they cancel out.

    Values are diffs (:data:`DIFF_SIZE` bytes, i64 little-endian); the sum keeps the newest
    entry's seq. Partial sums may leave the i64 range as long as the total fits.

    Raises:
        InvalidArgument: a value is not a diff (a tombstone, or not 8 bytes long), or the
            total does not fit in an i64.
    """
    if len(run) == 1:  # most keys: the entry is its own sum, no need to decode it
        entry = run[0]
        value = entry[2]
        if value is not None and len(value) == DIFF_SIZE:
            return None if value == _ZERO else entry
    key = run[0][0]
    total = 0
    for _, _, value in run:
        total += _diff(key, value)
    if total == 0:
        return None
    if not _DIFF_MIN <= total <= _DIFF_MAX:
        raise InvalidArgument(f"key {key!r}: the diffs sum to {total}, outside the i64 range")
    return key, run[0][1], total.to_bytes(DIFF_SIZE, "little", signed=True)


def _diff(key: bytes, value: bytes | None) -> int:
    """The diff ``value`` of ``key`` as an int."""
    if value is None or len(value) != DIFF_SIZE:
        found = "a tombstone" if value is None else f"{len(value)} bytes"
        raise InvalidArgument(f"key {key!r}: a diff is {DIFF_SIZE} bytes, found {found}")
    return int.from_bytes(value, "little", signed=True)


def merge_sum(sources: Iterable[Iterator[Entry]]) -> Iterator[Entry]:
    """Merge key-sorted streams of persist updates, consolidating each key's diffs
    (:func:`sum_diffs`): one entry per key, none for a key whose diffs sum to zero."""
    return merge(sources, sum_diffs)


def newest_columns(
    parts: Iterable[tuple[Sequence[bytes], Sequence[int], Sequence[V]]],
) -> tuple[list[bytes], list[int], list[V]]:
    """The newest version of each key of ``parts`` (columns ``(keys, seqs, values)``, in
    source order, each ascending with unique keys; together every version of their keys),
    in ascending key order: the highest seq, an earlier part winning a tie. Tombstones and
    entry kinds are versions like any other (the caller folds or filters them).

    Done in C, with no tuple per row: the columns are concatenated in source order and their
    indexes sorted by key, a stable sort (of runs already sorted), so each key's entries stay
    in source order. The first of each key is then the one to keep when, within every key,
    seqs do not increase in source order (sources come newest first: so it is unless
    versions were written out of order, or ties); else the rows are sorted again by (key,
    newest seq first, source order) and the first of each key kept, as ``merge_folding``
    keeps it. Compaction's columnar path and every ordered read of the engine (windows of
    overlapping L0 SSTs, sorted runs and the memtable) share it.

    A window of keys of one length is ordered by numpy instead when that pays (see
    :mod:`slatepy.table.key_order`), with the same result.
    """
    parts = list(parts)
    keys = list(chain.from_iterable(p[0] for p in parts))
    if worth_numpy(len(keys)):
        fast = newest_fixed_width(parts, keys)
        if fast is not None:
            return fast
    seqs = _joined_seqs([p[1] for p in parts])
    values = list(chain.from_iterable(p[2] for p in parts))
    index = sorted(range(len(keys)), key=keys.__getitem__)
    take = _taker(index)
    merged = take(keys)
    merged_seqs = take(seqs)
    # any() first: a window of distinct keys (the common one) builds no repeats list.
    if any(map(eq, islice(merged, 1, None), merged)):
        repeats = list(map(eq, islice(merged, 1, None), merged))  # [i]: merged[i + 1] == merged[i]
        if any(
            map(lt, compress(merged_seqs, repeats), compress(islice(merged_seqs, 1, None), repeats))
        ):
            return _newest_sorting_seqs(keys, list(seqs), values)
        first = [True, *map(not_, repeats)]
        take = _taker(list(compress(index, first)))
        merged = list(compress(merged, first))
        merged_seqs = list(compress(merged_seqs, first))
    return merged, merged_seqs, take(values)


def _taker(index: list[int]) -> Callable[[Sequence[V]], list[V]]:
    """A function taking the items at ``index`` of a column, in C: an ``itemgetter`` of
    them all gathers without a call per item (about a third cheaper than ``map`` of
    ``__getitem__``); it returns a bare item for one index, hence the comprehension."""
    if len(index) < 2:
        return lambda column: [column[i] for i in index]
    get = itemgetter(*index)
    return lambda column: list(get(column))


def _joined_seqs(columns: list[Sequence[int]]) -> Sequence[int]:
    """The seq columns end to end: one ``array('Q')`` when they all are (a memory copy, no
    int made for a row the merge drops), else a list."""
    arrays = [c for c in columns if isinstance(c, array) and c.typecode == "Q"]
    if len(arrays) == len(columns):
        joined = array("Q")
        for column in arrays:
            joined += column
        return joined
    return list(chain.from_iterable(columns))


def _newest_sorting_seqs(
    keys: list[bytes], seqs: list[int], values: list[V]
) -> tuple[list[bytes], list[int], list[V]]:
    """:func:`newest_columns` by a sort of (key, -seq, concatenation index): the index breaks
    ties on seq by source order and, being unique, keeps the sort from comparing further."""
    order = sorted(zip(keys, map(neg, seqs), range(len(keys)), strict=True))
    merged = list(map(itemgetter(0), order))
    first = list(map(ne, merged, chain((None,), merged)))
    index = list(map(itemgetter(2), compress(order, first)))
    merged = list(compress(merged, first))
    return merged, list(map(seqs.__getitem__, index)), list(map(values.__getitem__, index))
