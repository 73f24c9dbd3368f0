"""Reading the compacted part of a database (L0 and sorted runs) as one manifest names it.

Shared by the writer (``Db``) and readers (``DbReader``): both put their memtable in front
of what is here. Every read passes the SST's size from the manifest, so opening an SST is a
plain range GET (no suffix request: Azure has none), and tells the table reader which view it
reads, so the top-level indexes it keeps in memory follow the live SSTs (RFC 0009).
"""

from __future__ import annotations

import contextlib
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from functools import partial

from slatepy.engine.columns import (
    Kinds,
    _stamped,
    live_columns,
    live_rows,
    memtable_columns,
    merge_columns,
)
from slatepy.engine.memtable import Version
from slatepy.errors import CorruptionError, NotFound
from slatepy.format.block import Entry
from slatepy.format.bloom import key_hash
from slatepy.format.sst import SstTop
from slatepy.manifest.record import Manifest, SortedRun, SstHandle
from slatepy.table.grouping import Columns
from slatepy.table.layout import compacted_path
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
from slatepy.table.scans import ReadAhead
from slatepy.table.visibility import (
    EMPTY,
    Clock,
    RangeIndex,
    combined,
    folding,
    resolve,
)

FILTER_FIRST_L0 = 5
"""From this many L0 SSTs, a get asks each one's filter before its block cache (hashing the
key once). Measured break-even at 4 SSTs (warm gets alike, cold ones a little faster), a
quarter less CPU a get at 20: so only past the planner's default ``l0_trigger`` of 4, when
compaction lags."""


def missing_sst(exc: NotFound) -> CorruptionError:
    """The error for an SST that the current (or a protected) view references but the store
    no longer has: GC could not have taken it, so the database is damaged."""
    return CorruptionError(
        f"{exc.path}: an SST the current manifest references is missing (run `slatepy doctor`)",
        path=exc.path,
    )


def get_compacted(tables: TableReader, view: Manifest, key: bytes) -> Version | None:
    """The newest ``(seq, value)`` of ``key`` in the compacted SSTs of ``view``."""
    if tables.followed is not view:
        _follow(tables, view)
    plan = _last_plan
    if plan.view is not view:
        plan = _plan_for(view)
    get = tables.get
    # L0 is newest first, so the first hit is the newest version, unless an ingested SST
    # is there: its global seq need not follow L0's order (a WAL compaction published after
    # an ingestion holds older writes), so then every L0 SST is asked and the highest seq
    # wins (the first on a tie: two ingestions of one global seq, the later one in front).
    if plan.l0:
        best: Version | None = None
        # Many L0 SSTs, most without the key: each one's filter, the key hashed once,
        # rules it out for less than the block lookup get() makes first.
        hashed = key_hash(key) if len(plan.l0) >= FILTER_FIRST_L0 else None
        get_filtered = tables.get_filtered
        for first_key, last_key, path, size, global_seq in plan.l0:
            if first_key <= key <= last_key:
                if hashed is None:
                    found = get(path, key, size=size)
                else:
                    found = get_filtered(path, key, hashed, size=size)
                if found is not None:
                    if global_seq:
                        found = (global_seq, found[1])
                    if not plan.ingested:
                        return found
                    if best is None or found[0] > best[0]:
                        best = found
        if best is not None:
            return best
    for first_keys, last_keys, paths, sizes in plan.runs:
        i = bisect_right(first_keys, key) - 1
        if i >= 0 and key <= last_keys[i]:
            found = get(paths[i], key, size=sizes[i])
            if found is not None:
                return found
    return None


class _GetPlan:
    """What a get reads of one view, precomputed once per view: each L0 SST's key range,
    path, size and global seq, and each sorted run's first keys, last keys, paths and
    sizes as parallel lists (so finding a run's SST is one C bisect)."""

    __slots__ = ("ingested", "l0", "runs", "view")

    def __init__(self, view: Manifest | None) -> None:
        self.view = view
        self.l0: list[tuple[bytes, bytes, str, int, int]] = []
        self.runs: list[tuple[list[bytes], list[bytes], list[str], list[int]]] = []
        self.ingested = False
        if view is None:
            return
        self.ingested = view.l0_has_ingested()
        self.l0 = [
            (h.first_key, h.last_key, compacted_path(h.id), h.object_size, h.global_seq)
            for h in view.l0
        ]
        self.runs = [
            (
                [h.first_key for h in run.ssts],
                [h.last_key for h in run.ssts],
                [compacted_path(h.id) for h in run.ssts],
                [h.object_size for h in run.ssts],
            )
            for run in view.sorted_runs
            if run.ssts
        ]


_last_plan = _GetPlan(None)


_PLANS: dict[int, _GetPlan] = {}


def _plan_for(view: Manifest) -> _GetPlan:
    """The get plan of ``view``: built once per view object and cached (several views may
    be read in turn: a writer's and a reader's, snapshots), the last one checked first."""
    global _last_plan
    plan = _PLANS.get(id(view))
    if plan is None or plan.view is not view:
        plan = _GetPlan(view)
        if len(_PLANS) >= _VIEW_CACHE_SIZE:
            # Another thread may evict first: the cache only needs to stay bounded.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                _PLANS.pop(next(iter(_PLANS)))
        _PLANS[id(view)] = plan  # holds the view, so its id is not reused
    _last_plan = plan
    return plan


def versions_compacted(tables: TableReader, view: Manifest, key: bytes) -> list[Version]:
    """Every version of ``key`` in the compacted SSTs of ``view``, newest first: what merge
    operands fold over (a get's slow path; :func:`get_compacted` stops at the newest)."""
    if tables.followed is not view:
        _follow(tables, view)
    found: list[Version] = []
    handles = [h for h in view.l0 if h.first_key <= key <= h.last_key]
    handles += [h for h in (_run_sst_for(run, key) for run in view.sorted_runs) if h is not None]
    for handle in handles:
        version = tables.get(compacted_path(handle.id), key, size=handle.object_size)
        if version is not None:
            found.append((handle.global_seq, version[1]) if handle.global_seq else version)
    found.sort(key=lambda v: -v[0])
    return found


def get_many_compacted(
    tables: TableReader, view: Manifest, keys: Sequence[bytes]
) -> dict[bytes, Version]:
    """The newest ``(seq, value)`` of each of ``keys`` (sorted, distinct) found in ``view``.

    Each SST is asked once, for all the keys still unresolved within its key range
    (:meth:`TableReader.get_many`), newest source first, as :func:`get_compacted` does for one.
    """
    if tables.followed is not view:
        _follow(tables, view)
    found: dict[bytes, Version] = {}
    pending = list(keys)

    def ask(handle: SstHandle) -> None:
        inside = pending[
            bisect_left(pending, handle.first_key) : bisect_right(pending, handle.last_key)
        ]
        if inside:
            results = tables.get_many(compacted_path(handle.id), inside, size=handle.object_size)
            for k, r in zip(inside, results, strict=True):
                if r is None:
                    continue
                version = (handle.global_seq, r[1]) if handle.global_seq else r
                if k not in found or version[0] > found[k][0]:
                    found[k] = version

    # L0 newest first: what one finds, older ones are not asked; with an ingested SST in L0
    # every L0 SST is asked and the highest seq wins (see get_compacted).
    ingested = view.l0_has_ingested()
    for handle in view.l0:
        ask(handle)
        if not ingested:
            pending = [k for k in pending if k not in found]
    pending = [k for k in pending if k not in found]
    for run in view.sorted_runs:
        for handle in run.ssts:  # disjoint key ranges: one pass over the run
            ask(handle)
        pending = [k for k in pending if k not in found]
    return found


def newer_version(memtable: Version | None, compacted: Version | None) -> Version | None:
    """The newer of a key's memtable and compacted versions. The memtable's is newer unless
    an ingestion published after it (RFC 0016). ``Db._get`` inlines this rule."""
    if compacted is None or (memtable is not None and memtable[0] >= compacted[0]):
        return memtable
    return compacted


def newer_value(memtable: Version | None, compacted: Version | None) -> bytes | None:
    """The stored value of the newer of a key's memtable and compacted versions (None:
    absent or deleted), entry kinds not resolved: see :func:`visible`."""
    version = newer_version(memtable, compacted)
    return None if version is None else version[1]


def visible(
    key: bytes,
    version: Version | None,
    ranges: RangeIndex,
    view: Manifest | None,
    clock: Clock,
    *,
    merging: Merging = NO_MERGING,
    tables: TableReader | None = None,
) -> bytes | None:
    """What a point read of ``key`` returns, given its newest ``version`` anywhere (None:
    none): the one rule for entry kinds (RFC 0019), via :func:`resolve`. ``ranges`` are the
    memtable's range tombstones, ``view`` the compacted state whose range tombstones count
    too (None: none). Merge operands are folded with ``merging`` over the older versions in
    ``view`` (read from ``tables``).

    Raises:
        InvalidArgument: the key holds merge operands and ``merging`` has no operator.
    """
    if version is None:
        return None
    covered = ranges.seq_at(key) if ranges is not EMPTY else 0
    if view is not None:
        compacted = view_ranges(view)
        if compacted is not EMPTY:
            covered = max(covered, compacted.seq_at(key))

    def older() -> list[Version]:
        if tables is None or view is None:
            return []
        return [v for v in versions_compacted(tables, view, key) if v[0] < version[0]]

    return resolve(key, version, covered, clock, merging=merging, older=older)


def scan_ranges(ranges: RangeIndex, view: Manifest, start: bytes, end: bytes | None) -> RangeIndex:
    """The range tombstones a scan of ``[start, end)`` must apply: the memtable's
    (``ranges``) and ``view``'s, those that meet the range."""
    both = combined(ranges, view_ranges(view))
    return both if both is EMPTY else both.overlapping(start, end)


def compacted_sources(
    tables: TableReader, view: Manifest, start: bytes, end: bytes | None, reverse: bool
) -> list[Iterator[Columns]]:
    """Column streams (newest source first) of ``start <= key < end`` in ``view``'s SSTs,
    each in scan order (descending keys with ``reverse``). The sources share one scan's
    read-ahead memory: each keeps up to ``scan_requests_in_flight`` chunks in flight, of at
    most its share of ``scan_read_ahead_bytes``, so a merged scan holds about the memory of
    one, whatever the number of L0 SSTs and runs (issue 33 item 4). They share one pool of
    threads (:class:`~slatepy.table.scans.ReadAhead`), large enough for every source's
    requests, whose threads go from one source's fetch to the next instead of each source
    starting its own."""
    if tables.followed is not view:
        _follow(tables, view)
    count = len(view.l0) + len(view.sorted_runs)
    share = tables.scan_read_ahead_bytes // count if count > 1 else None
    read_ahead = ReadAhead(tables, tables.scan_requests_in_flight * count)
    sources = [
        _stamped(
            tables.scan_columns(
                compacted_path(h.id),
                start,
                end,
                size=h.object_size,
                reverse=reverse,
                read_ahead_bytes=share,
                read_ahead=read_ahead,
            ),
            h.global_seq,
        )
        for h in view.l0
    ]
    sources += [
        _run_columns(tables, run, start, end, reverse, share=share, read_ahead=read_ahead)
        for run in view.sorted_runs
    ]
    return sources


def scan_merged(
    tables: TableReader,
    newer: list[Entry],
    view: Manifest,
    start: bytes,
    end: bytes | None,
    *,
    ranges: RangeIndex = EMPTY,
    clock: Clock = time.time,
    merging: Merging = NO_MERGING,
) -> Iterator[tuple[bytes, bytes]]:
    """Live ``(key, value)`` pairs of ``newer`` (memtable entries) over ``view``'s SSTs, the
    newest version of each key winning; tombstones hide what they shadow, and so do range
    tombstones (``ranges``: the memtable's; the view's are added here) and expiry
    (:func:`slatepy.table.visibility.live_entries`); merge operands fold over what is below
    them (``merging``).

    The sources are merged a block at a time (:func:`~slatepy.engine.columns.merge_columns`,
    the path of the iterators and ``scan_batches``): a run of blocks only one source covers
    (a compacted database) reaches the caller as one ``zip`` of its keys and values, chained
    in C (:class:`~slatepy.engine.columns.Rows`), with no per-row Python between the decoded
    blocks and the caller.
    """
    sources = compacted_sources(tables, view, start, end, False)
    if newer:
        sources.insert(0, memtable_columns(newer, False))
    index = scan_ranges(ranges, view, start, end)
    kinds = Kinds(index, clock, merging)
    merged = merge_columns(sources, False, folding(index, merging, complete=True))
    return live_rows(map(partial(live_columns, kinds=kinds), merged), merged)


def compacted_ids(view: Manifest) -> set[str]:
    """Ids of every compacted SST ``view`` references."""
    return {h.id for h in (*view.l0, *(h for run in view.sorted_runs for h in run.ssts))}


def _run_columns(
    tables: TableReader,
    run: SortedRun,
    start: bytes,
    end: bytes | None,
    reverse: bool,
    *,
    share: int | None = None,
    read_ahead: ReadAhead | None = None,
) -> Iterator[Columns]:
    """A sorted run's columns in ``[start, end)``, SST after SST (backwards for reverse).
    Forward, while one SST is read the next is opened by a read-ahead thread (its top
    level is one GET), and it is read in large chunks from its start: the scan is long by
    then (see ``TableReader.scan``). Its SSTs read ahead with ``read_ahead``'s threads
    (None: threads of the run's own)."""
    first = max(0, bisect_right(run.ssts, start, key=_first_key) - 1)
    handles = [
        h for h in run.ssts[first:] if h.last_key >= start and (end is None or h.first_key < end)
    ]
    if reverse:
        handles.reverse()
    read_ahead = read_ahead or ReadAhead(tables, tables.scan_requests_in_flight)
    opening: list[Future[SstTop]] = []
    read_ahead.join()  # the threads live on from one SST's stream to the next
    try:
        for i, handle in enumerate(handles):
            if (
                not reverse
                and i + 1 < len(handles)
                and not tables.is_open(compacted_path(handles[i + 1].id))
            ):
                following = handles[i + 1]
                opening.append(
                    read_ahead.submit(
                        tables.top, compacted_path(following.id), size=following.object_size
                    )
                )
            yield from tables.scan_columns(
                compacted_path(handle.id),
                start,
                end,
                size=handle.object_size,
                continued=i > 0,
                reverse=reverse,
                read_ahead_bytes=share,
                read_ahead=read_ahead,
            )
    finally:
        read_ahead.leave(opening)


def _follow(tables: TableReader, view: Manifest) -> None:
    """Tell ``tables`` the SSTs of the view now read, so it can release the rest."""
    tables.retain(view, [compacted_path(i) for i in compacted_ids(view)])


def _first_key(handle: SstHandle) -> bytes:
    return handle.first_key


def _run_sst_for(run: SortedRun, key: bytes) -> SstHandle | None:
    """The only SST of a sorted run whose key range can hold ``key``."""
    # bisect with key= builds no list: a get costs O(log n) whatever the run's length.
    i = bisect_right(run.ssts, key, key=_first_key) - 1
    if i >= 0 and key <= run.ssts[i].last_key:
        return run.ssts[i]
    return None


_VIEW_CACHE: dict[int, tuple[Manifest, RangeIndex]] = {}
_VIEW_CACHE_SIZE = 16


_last: tuple[Manifest | None, RangeIndex] = (None, EMPTY)


def view_ranges(view: Manifest) -> RangeIndex:
    """The range tombstones of every compacted SST of ``view`` (from the manifest's handles),
    built once per view object and cached (:data:`EMPTY` when there are none)."""
    global _last
    last = _last
    if last[0] is view:
        return last[1]
    cached = _VIEW_CACHE.get(id(view))
    if cached is not None and cached[0] is view:
        _last = cached
        return cached[1]
    tombstones = [t for h in view.l0 for t in h.range_tombstones]
    tombstones += [t for run in view.sorted_runs for h in run.ssts for t in h.range_tombstones]
    index = RangeIndex(tombstones) if tombstones else EMPTY
    if len(_VIEW_CACHE) >= _VIEW_CACHE_SIZE:
        # Another thread may evict first: the cache only needs to stay bounded.
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            _VIEW_CACHE.pop(next(iter(_VIEW_CACHE)))
    _VIEW_CACHE[id(view)] = _last = (view, index)  # held, so its id is not reused
    return index
