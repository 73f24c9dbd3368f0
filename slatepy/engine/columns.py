"""Merging column streams (a block's keys, seqs and values as parallel lists) into the
versions a read sees, a *window* at a time, and filtering them to live rows (RFC 0020).

Up to the nearest chunk end among the sources, every source's entries are final, so the
window's versions of each key are all present and can be resolved together. A window that
only one source contributes to (the common case: a compacted database, or sources with
disjoint key ranges) passes through untouched; otherwise its rows are sorted by
``(key, seq, source)`` in C and the newest version of each key kept with a dict. Per-row
Python work is only the tombstone filter (:func:`live_columns`).

Shared by every ordered read: ``Db.scan`` (:func:`slatepy.engine.view.scan_merged`) and the
iterators, reverse and batched scans of :mod:`slatepy.engine.iterator`.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from typing import cast

from slatepy.engine.window_slices import dominated, newest_by_slices
from slatepy.format.block import Entry, PlainValues
from slatepy.format.kinds import Operands
from slatepy.table.grouping import Columns
from slatepy.table.merge import newest_columns
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.visibility import EMPTY, Clock, RangeIndex, live_entries

MEMTABLE_CHUNK = 4096
"""Memtable entries per column chunk (a memtable source's "block")."""
LiveColumns = tuple[list[bytes], list[bytes]]
"""``(keys, values)`` of live rows, in scan order."""
_FIRST = itemgetter(0)
_PLAIN = frozenset({bytes, type(None)})
Fold = Callable[[list[Entry]], Entry | None]
"""Folds one key's versions (newest first) whose newest are merge operands."""


@dataclass(frozen=True, slots=True)
class Kinds:
    """What entry kinds (RFC 0019) need to be resolved in a view: its range tombstones (the
    memtable's, taken with its entries, and the manifest's), the clock expiry is judged by,
    and the merge operator."""

    ranges: RangeIndex = EMPTY
    clock: Clock = time.time
    merging: Merging = NO_MERGING


def resolve_window(
    parts: Sequence[tuple[int, Columns]], reverse: bool, fold: Fold | None = None
) -> Columns:
    """The version each key of a merge window yields: the newest (highest seq; on a tie the
    earlier source), tombstones included; a newest version of merge operands is ``fold``ed
    with the key's older versions (newest first), as ``merge_folding`` does for scans.

    ``parts`` are ``(source index, columns)``, each in scan order, together holding every
    version of their keys the view has.
    """
    plain = all(p[1][2].__class__ is PlainValues for p in parts)
    if fold is None or plain or not any(Operands in set(map(type, p[1][2])) for p in parts):
        # No merge operands to fold (the common case): the columnar merge compaction uses,
        # no tuple per row. Reversed parts are descending runs, which the sort takes as
        # cheaply as ascending ones.
        if dominated(parts):  # a run and a few rows of others: slices of the run
            new_keys, new_seqs, new_values = newest_by_slices(parts, reverse)
        else:
            new_keys, new_seqs, new_values = newest_columns(p[1] for p in parts)
            if reverse:
                new_keys.reverse()
                new_seqs.reverse()
                new_values.reverse()
        return new_keys, new_seqs, PlainValues(new_values) if plain else new_values
    rows: list[tuple[bytes, int, int, bytes | None]] = []
    for order, (keys, seqs, values) in parts:
        rows.extend(zip(keys, seqs, repeat(-order), values, strict=False))
    rows.sort()  # by key, then oldest first: the last row of each key wins
    winners = list(dict(zip(map(_FIRST, rows), rows, strict=True)).values())
    winners = _folded(rows, winners, fold)
    if reverse:
        winners.reverse()
    return [r[0] for r in winners], [r[1] for r in winners], [r[3] for r in winners]


def _folded(
    rows: list[tuple[bytes, int, int, bytes | None]],
    winners: list[tuple[bytes, int, int, bytes | None]],
    fold: Fold,
) -> list[tuple[bytes, int, int, bytes | None]]:
    """``winners`` with each merge-operand winner folded over its key's older ``rows``."""
    out = []
    for winner in winners:
        if winner[3].__class__ is not Operands:
            out.append(winner)
            continue
        key = winner[0]
        lo = bisect_left(rows, key, key=_FIRST)
        hi = bisect_right(rows, key, lo, key=_FIRST)
        folded = fold([(k, seq, v) for k, seq, _, v in reversed(rows[lo:hi])])
        if folded is not None:
            out.append((key, folded[1], winner[2], folded[2]))
    return out


def live_columns(
    columns: tuple[list[bytes], Sequence[int], list[bytes | None]], kinds: Kinds | None = None
) -> LiveColumns:
    """The rows of resolved ``columns`` a reader sees: every one but the tombstones, and
    with ``kinds`` (RFC 0019) none under a range tombstone, none expired, merge operands
    over nothing folded alone (:func:`slatepy.table.visibility.live_entries`)."""
    keys, seqs, values = columns
    if values.__class__ is PlainValues and (kinds is None or not kinds.ranges):
        return keys, values  # plain: all bytes, all live
    if kinds is not None and (kinds.ranges or not _PLAIN.issuperset(map(type, values))):
        rows = zip(keys, seqs, values, strict=True)
        pairs = list(live_entries(rows, kinds.ranges, kinds.clock, kinds.merging))
        return [k for k, _ in pairs], [v for _, v in pairs]
    if None not in values:
        return keys, values  # type: ignore[return-value]  # no None: all bytes
    kept = [i for i, v in enumerate(values) if v is not None]
    return [keys[i] for i in kept], [values[i] for i in kept]  # type: ignore[misc]


class Rows(chain[tuple[bytes, bytes]]):
    """Rows of live column chunks, iterated in C: a chain of each chunk's ``zip(keys,
    values)``, so no Python frame runs per row (a generator's ``yield from`` cost about a
    tenth of a full scan). :meth:`close` stops the chunks' stream early (joining any
    read-ahead thread), as closing a generator would; unlike a generator, the rest of the
    chunk in hand (a few thousand rows at most) may still be iterated after it."""

    __slots__ = ("_source", "keep")
    _source: object
    keep: object
    """What must stay referenced while the rows are read (a view whose SSTs a writer's
    collector spares while it is referenced: RFC 0029)."""

    def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


def live_rows(chunks: Iterator[LiveColumns], source: Iterator[object] | None = None) -> Rows:
    """The ``(key, value)`` rows of ``chunks`` (their keys and values lists of equal length);
    ``source``: the stream to close with them (``chunks`` itself when None)."""
    rows = cast(Rows, Rows.from_iterable(map(_zip_pair, chunks)))
    rows._source = chunks if source is None else source
    return rows


def _zip_pair(chunk: LiveColumns) -> Iterator[tuple[bytes, bytes]]:
    return zip(chunk[0], chunk[1], strict=True)


def merge_columns(
    sources: Sequence[Iterator[Columns]], reverse: bool, fold: Fold | None = None
) -> Iterator[Columns]:
    """Merge column streams (each in scan order, unique keys within a source; an earlier
    source wins a tie on seq) into one stream of resolved versions (:func:`resolve_window`)."""
    heads: list[_Head] = []
    for order, source in enumerate(sources):
        head = _Head(order, source)
        if head.advance():
            heads.append(head)
    while heads:
        if len(heads) == 1:
            head = heads[0]
            yield head.rest()
            yield from head.source  # one source: its versions are already one per key
            return
        # Every source's entries up to the nearest chunk end are in hand: merge those.
        bound = max(h.keys[-1] for h in heads) if reverse else min(h.keys[-1] for h in heads)
        parts: list[tuple[int, Columns]] = []
        for head in heads:
            taken = head.take_through(bound, reverse)
            if taken is not None:
                parts.append((head.order, taken))
        heads = [h for h in heads if h.pos < len(h.keys) or h.advance()]
        if len(parts) == 1:
            yield parts[0][1]
        elif parts:
            yield resolve_window(parts, reverse, fold)


class _Head:
    """A source's current chunk and the position consumed in it."""

    __slots__ = ("keys", "order", "pos", "seqs", "source", "values")

    def __init__(self, order: int, source: Iterator[Columns]) -> None:
        self.order = order
        self.source = source
        self.keys: list[bytes] = []
        self.seqs: MutableSequence[int] = []
        self.values: list[bytes | None] = []
        self.pos = 0

    def advance(self) -> bool:
        """Load the next non-empty chunk; False when the source is exhausted."""
        for keys, seqs, values in self.source:
            if keys:
                self.keys, self.seqs, self.values, self.pos = keys, seqs, values, 0
                return True
        return False

    def rest(self) -> Columns:
        pos = self.pos
        if pos == 0:
            return self.keys, self.seqs, self.values
        return self.keys[pos:], self.seqs[pos:], self.values[pos:]

    def take_through(self, bound: bytes, reverse: bool) -> Columns | None:
        """The chunk's entries from the position up to and including ``bound`` (in scan
        order); None if there are none."""
        keys, pos = self.keys, self.pos
        cut = _descending_cut(keys, bound, pos) if reverse else bisect_right(keys, bound, pos)
        if cut == pos:
            return None
        self.pos = cut
        values = self.values
        if pos == 0 and cut == len(keys):
            return keys, self.seqs, values
        part = values[pos:cut]
        if values.__class__ is PlainValues:
            part = PlainValues(part)  # still known plain: a list copy in C, no test per row
        return keys[pos:cut], self.seqs[pos:cut], part


def _descending_cut(keys: list[bytes], bound: bytes, lo: int) -> int:
    """In descending ``keys``, the index after the last key >= ``bound`` (from ``lo``)."""
    hi = len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] >= bound:
            lo = mid + 1
        else:
            hi = mid
    return lo


def memtable_columns(entries: Sequence[Entry], reverse: bool) -> Iterator[Columns]:
    """Key-sorted memtable entries as column chunks in scan order."""
    n = len(entries)
    starts = range(0, n, MEMTABLE_CHUNK)
    for first in reversed(starts) if reverse else starts:
        chunk = entries[first : first + MEMTABLE_CHUNK]
        if reverse:
            chunk = chunk[::-1]
        keys, seqs, values = (list(c) for c in zip(*chunk, strict=True))
        yield keys, seqs, values


def _stamped(columns: Iterator[Columns], global_seq: int) -> Iterator[Columns]:
    """An ingested SST's columns with its global seq on every entry (RFC 0016)."""
    if not global_seq:
        return columns
    return ((k, [global_seq] * len(k), v) for k, _, v in columns)
