"""Which version of a key is visible: the one place that knows the entry kinds (RFC 0019).

Every read path (``Db``/``DbReader`` gets, get_many, scans, and any iterator built on them)
and compaction decide visibility here:

* :class:`RangeIndex` answers "the highest seq of a range tombstone covering ``key``" in
  O(log n) from disjoint fragments built once per set of range tombstones (a view's, a
  memtable's, a compaction's inputs');
* :func:`resolve` turns the versions of a key into what a read returns: its value, or
  None when it is a tombstone, an expired value, or older than a range tombstone over it;
  merge operands are folded over the versions beneath them (:class:`Merging`);
* :func:`folding` is the fold a merge of sorted streams applies to a key whose newest entry
  is merge operands (``slatepy.table.merge.merge_folding``);
* :func:`live_entries` does the same over a merged, key-ordered stream (scans);
* :func:`compacted_entries` is compaction's rule: what to write for each merged entry.

A version older than a range tombstone over its key (``seq < tombstone.seq``) is deleted;
one of the same seq came later in the same write batch and is kept.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator

from slatepy.format.block import Entry
from slatepy.format.kinds import Expiring, Operands, RangeTombstone
from slatepy.table.merge_operator import NO_MERGING, Merging, missing_operator

Clock = Callable[[], float]
"""Wall-clock seconds since the epoch (``time.time``); injectable for tests."""

Version = tuple[int, bytes | None]


def frozen_clock(clock: Clock) -> Clock:
    """``clock`` stopped now: a snapshot (or one scan) judges expiry as of when it was taken,
    so a value that expires later still reads the same in it, like every other write."""
    moment = clock()
    return lambda: moment


def now_ms(clock: Clock = time.time) -> int:
    return int(clock() * 1000)


class RangeIndex:
    """Range tombstones as disjoint fragments: ``seq_at(key)`` is the highest seq of those
    covering ``key`` (0: none). Built in O(fragments x tombstones) at worst; an empty index
    is falsy, and the read paths' fast paths compare with :data:`EMPTY` (the one empty index
    they are given) instead."""

    __slots__ = ("_bounds", "_seqs", "tombstones")

    def __init__(self, tombstones: Iterable[RangeTombstone] = ()) -> None:
        self.tombstones = tuple(tombstones)
        bounds = sorted({b for t in self.tombstones for b in (t.start, t.end)})
        seqs = [0] * len(bounds)  # seqs[i] covers [bounds[i], bounds[i+1])
        position = {b: i for i, b in enumerate(bounds)}
        for t in self.tombstones:
            for i in range(position[t.start], position[t.end]):
                seqs[i] = max(seqs[i], t.seq)
        self._bounds = bounds
        self._seqs = seqs

    def __bool__(self) -> bool:
        return bool(self.tombstones)

    def seq_at(self, key: bytes) -> int:
        i = bisect_right(self._bounds, key) - 1
        return self._seqs[i] if i >= 0 else 0

    def overlapping(self, start: bytes, end: bytes | None) -> RangeIndex:
        """The index of the tombstones that meet ``[start, end)`` (``end`` None: unbounded)."""
        if not self.tombstones:
            return self
        return RangeIndex(
            t for t in self.tombstones if t.end > start and (end is None or t.start < end)
        )


EMPTY = RangeIndex()


def combined(*indexes: RangeIndex) -> RangeIndex:
    """One index of the tombstones of ``indexes`` (an empty one is returned as is)."""
    present = [i for i in indexes if i]
    if len(present) <= 1:
        return present[0] if present else EMPTY
    return RangeIndex(t for i in present for t in i.tombstones)


def resolve(
    key: bytes,
    version: Version | None,
    covered: int,
    clock: Clock,
    *,
    merging: Merging = NO_MERGING,
    older: Callable[[], list[Version]] | None = None,
) -> bytes | None:
    """What a read of ``key`` returns, given its newest ``version`` (None: none anywhere),
    ``covered``, the highest seq of a range tombstone over the key (0: none), and for merge
    operands ``older``: the versions beneath ``version``, newest first (called only then).

    Raises:
        InvalidArgument: the key holds merge operands and ``merging`` has no operator.
    """
    if version is None:
        return None
    seq, value = version
    if seq < covered or value is None:
        return None
    if value.__class__ is bytes:
        return value
    if value.__class__ is Operands:
        below = [v for s, v in (older() if older is not None else []) if s >= covered]
        value = merging.fold(key, [value, *below], complete=True)
        if value is None or value.__class__ is bytes:
            return value
    if isinstance(value, Expiring):
        return None if value.expired(now_ms(clock)) else value.value
    if value.__class__ is Operands:
        raise missing_operator(key)  # a complete fold leaves operands only without one
    return value


def folding(
    ranges: RangeIndex, merging: Merging, *, complete: bool
) -> Callable[[list[Entry]], Entry | None]:
    """The fold of a key's entries (newest first, the newest merge operands) for
    ``merge_folding``: entries under a range tombstone count as absent (the tombstone is a
    base of nothing); ``complete``: the entries are every version there is."""

    def fold(run: list[Entry]) -> Entry | None:
        key, seq, _ = run[0]
        covered = ranges.seq_at(key) if ranges else 0
        if seq < covered:
            return run[0]  # deleted whole: the caller drops it as it would any entry
        values = [v for _, s, v in run if s >= covered]
        cut = len(values) < len(run)
        return key, seq, merging.fold(key, values, complete=complete or cut)

    return fold


def live_entries(
    entries: Iterator[Entry], ranges: RangeIndex, clock: Clock, merging: Merging = NO_MERGING
) -> Iterator[tuple[bytes, bytes]]:
    """The visible ``(key, value)`` pairs of a merged stream (newest version per key, merge
    operands folded by ``merge_folding`` with :func:`folding`): operands left are over
    nothing."""
    now = now_ms(clock)
    seq_at = ranges.seq_at if ranges else None
    for key, seq, stored in entries:
        if stored.__class__ is bytes:
            if seq_at is None or seq >= seq_at(key):
                yield key, stored
            continue
        if stored is None or (seq_at is not None and seq < seq_at(key)):
            continue
        value = stored
        if value.__class__ is Operands:
            value = merging.apply(key, None, value)
            if value.__class__ is bytes:
                yield key, value
                continue
        if isinstance(value, Expiring) and not value.expired(now):
            yield key, value.value


def live_expiring(
    entries: Iterator[Entry], ranges: RangeIndex, clock: Clock, merging: Merging = NO_MERGING
) -> Iterator[tuple[bytes, bytes, int | None]]:
    """:func:`live_entries` with each value's expiry: ``(key, value, expire_at_ms)``, None
    for a value written without a TTL (what a copy needs to keep the TTLs)."""
    now = now_ms(clock)
    seq_at = ranges.seq_at if ranges else None
    for key, seq, stored in entries:
        if stored is None or (seq_at is not None and seq < seq_at(key)):
            continue
        value = stored
        if value.__class__ is Operands:
            value = merging.apply(key, None, value)
        if isinstance(value, Expiring):
            if not value.expired(now):
                yield key, value.value, value.expire_at_ms
        elif value.__class__ is not Operands:
            yield key, bytes(value), None


def compacted_entries(
    entries: Iterator[Entry],
    ranges: RangeIndex,
    *,
    bottom: bool,
    clock: Clock,
    merging: Merging = NO_MERGING,
) -> Iterator[Entry]:
    """What compaction writes for a merged stream (newest version per key): entries under a
    range tombstone of the inputs are dropped; an expired value becomes a tombstone, so it
    keeps hiding older versions in SSTs outside this compaction (it must not let them
    resurrect); at the ``bottom`` (nothing older exists) tombstones, expired values and the
    covered entries all go, and merge operands left become values (with an operator; else
    they stay operands)."""
    now = now_ms(clock)
    seq_at = ranges.seq_at if ranges else None
    for entry in entries:
        value = entry[2]
        if seq_at is not None and entry[1] < seq_at(entry[0]):
            continue
        if value is None or value.__class__ is bytes:
            if value is None and bottom:
                continue
            yield entry
        elif isinstance(value, Expiring) and value.expired(now):
            if not bottom:
                yield entry[0], entry[1], None
        elif value.__class__ is Operands and bottom and merging.operator is not None:
            merged = merging.apply(entry[0], None, value)
            if not (isinstance(merged, Expiring) and merged.expired(now)):
                yield entry[0], entry[1], merged
        else:
            yield entry
