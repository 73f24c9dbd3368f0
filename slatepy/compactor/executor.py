"""Compaction execution: stream-merge the inputs of a plan into new SSTs.

Inputs are read in large sequential chunks through ``TableReader.scan_all`` or
``scan_all_columns`` (uncached, and not pinned: compaction must not evict the read path's
hot blocks, nor keep the indexes of the SSTs it is about to replace) and merged newest
version first (``merge_folding``); output SSTs are cut at ``target_sst_bytes`` (a
WalToL0's too: its outputs are several L0 SSTs with disjoint key ranges, RFC 0011) and
streamed to the store while they are built (``slatepy.compactor.outputs``), so memory
holds about ``SEND_BYTES`` of output and one chunk per input (together at most
``READ_AHEAD_BYTES``) at a time, whatever the size of the inputs or outputs. Outputs are
written under ``compacted/`` with fresh random ids; they become part of the database only
when the manifest update publishing them succeeds.

:func:`compact_plan` runs a compaction. Runs of plain values (the common case) are merged
and written a column at a time, in C; other entries, and compactions with range tombstones,
one at a time (:func:`merge_plan`, the reference the columnar path is tested against: the
same bytes either way). RFC 0003, addendum on the columnar path.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import NamedTuple, cast

from slatepy.compactor.ingested import over_ingestions
from slatepy.compactor.outputs import OutputWriter
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, Plan, WalToL0
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.merge import merge_folding, newest_columns, stamped
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import Piece, TableReader
from slatepy.table.visibility import Clock, RangeIndex, compacted_entries, folding

READ_AHEAD_BYTES = 16 * 1024 * 1024
MIN_CHUNK_BYTES = 64 * 1024


def plan_inputs(plan: Plan, manifest: Manifest, tables: TableReader) -> list[Iterator[Entry]]:
    """Entry streams of a plan's inputs: one per WAL SST, L0 SST or sorted run."""
    sources, stamps = _plan_sources(plan, manifest, tables)
    # All inputs are open at once, so they share one read-ahead budget.
    chunk = max(MIN_CHUNK_BYTES, READ_AHEAD_BYTES // max(len(sources), 1))
    # Ingested L0 SSTs store seq 0: their entries take the handle's global seq, which the
    # outputs then store (RFC 0016).
    return [
        stamped(_chain(tables, paths, chunk), stamp)
        for paths, stamp in zip(sources, stamps, strict=True)
    ]


def drops_tombstones(plan: Plan) -> bool:
    """Whether ``plan`` writes the bottom of the database (nothing older stays outside it):
    tombstones, expired values and range tombstones go, merge operands become values."""
    return isinstance(plan, L0ToRun) and plan.drop_tombstones


def merge_plan(
    plan: Plan, manifest: Manifest, tables: TableReader, merging: Merging, *, bottom: bool
) -> Iterator[Entry]:
    """The merged entries of a plan's inputs, newest version per key, merge operands folded
    over what is beneath them in the inputs (completely when ``bottom``)."""
    ranges = RangeIndex(plan_range_tombstones(plan, manifest, tables))
    fold = folding(ranges, merging, complete=bottom)
    if isinstance(plan, WalToL0):
        fold = over_ingestions(fold, manifest, tables)
    return merge_folding(plan_inputs(plan, manifest, tables), fold)


def plan_range_tombstones(
    plan: Plan, manifest: Manifest, tables: TableReader
) -> list[RangeTombstone]:
    """The range tombstones of a plan's inputs (RFC 0019): from the manifest's handles for
    compacted SSTs, from the properties (the top level, read once) for WAL SSTs."""
    if isinstance(plan, WalToL0):
        sources, _ = _plan_sources(plan, manifest, tables)
        return [
            t
            for paths in sources
            for path, size in paths
            for t in tables.top(path, size=size).props.range_tombstones
        ]
    handles = [h for h in manifest.l0 if h.id in plan.l0_ids]
    handles += [h for run in manifest.sorted_runs if run.id in plan.run_ids for h in run.ssts]
    return [t for h in handles for t in h.range_tombstones]


def _plan_sources(
    plan: Plan, manifest: Manifest, tables: TableReader
) -> tuple[list[list[tuple[str, int | None]]], list[int]]:
    """The inputs of a plan as lists of ``(path, size)`` (one list per WAL SST, L0 SST or
    sorted run), and the global seq to stamp each input's entries with (0: none)."""
    if isinstance(plan, WalToL0):
        wal = NumberedObjects(tables.store, WAL_DIR, WAL_SUFFIX)
        ids = range(plan.last_wal_id, plan.first_wal_id - 1, -1)
        sizes: dict[int, int] = {}
        if not tables.store.supports_suffix:
            # One LIST instead of a HEAD per WAL SST to find where each footer is (Azure).
            listed = wal.entries(after=plan.first_wal_id - 1)
            sizes = {i: meta.size for i, meta in listed if i <= plan.last_wal_id}
        sources: list[list[tuple[str, int | None]]] = [[(wal.path(i), sizes.get(i))] for i in ids]
        return sources, [0] * len(sources)
    sources = [[(compacted_path(h.id), h.object_size)] for h in manifest.l0 if h.id in plan.l0_ids]
    sources += [
        [(compacted_path(h.id), h.object_size) for h in run.ssts]
        for run in manifest.sorted_runs
        if run.id in plan.run_ids
    ]
    stamps = [h.global_seq for h in manifest.l0 if h.id in plan.l0_ids]
    stamps += [0] * (len(sources) - len(stamps))
    return sources, stamps


def _chain(tables: TableReader, paths: list[tuple[str, int | None]], chunk: int) -> Iterator[Entry]:
    """The entries of SSTs with disjoint, increasing key ranges, ``chunk`` bytes at a time.

    Sizes come from the manifest where it has them (compacted SSTs), so opening those is a
    plain range GET; WAL SSTs are opened with a suffix GET, which for most of them returns
    the whole object.
    """
    for path, size in paths:
        yield from tables.scan_all(path, chunk_bytes=chunk, size=size)


def compact_plan(
    plan: Plan,
    manifest: Manifest,
    tables: TableReader,
    policy: CompactionPolicy,
    *,
    block_size: int,
    bloom_bits_per_key: int,
    compression: Compression = "none",
    compression_level: int = 0,
    clock: Clock = time.time,
    merging: Merging = NO_MERGING,
    progress: Callable[[], None] | None = None,
    columnar: bool = True,
) -> list[SstHandle]:
    """Merge a plan's inputs and write the outputs, in key order, cut at
    ``policy.target_sst_bytes``.

    Entry kinds follow :func:`slatepy.table.visibility.compacted_entries`: entries under the
    inputs' range tombstones (:func:`plan_range_tombstones`) go, expired values become
    tombstones (``clock`` says what has expired) or, at the bottom (:func:`drops_tombstones`:
    nothing older exists), go with the tombstones. The range tombstones themselves are
    written with the last output (an SST of no entries if none is left), except at the
    bottom, where nothing older is left under them.

    The outputs have disjoint, increasing key ranges: as L0 SSTs (WalToL0) a key is in at
    most one of them, so their order among themselves does not matter to reads; as a sorted
    run (L0ToRun) they are its SSTs in order. If the merge fails, the output being written
    is aborted; outputs already written stay unreferenced until GC deletes them.

    Without range tombstones among the inputs, the inputs are read a block at a time as
    columns and merged a window at a time (:func:`_windows`: every version of a key in the
    same window). A window of plain values only (no tombstone, no entry kind), the common
    case, is merged in C (concatenated when one input has it all, else sorted and deduped)
    and written with :meth:`SstBuilder.extend_below`; any other window takes the entry
    path (``merge_folding``, ``compacted_entries``, ``SstBuilder.add``). With range
    tombstones, or ``columnar`` False, everything takes the entry path (:func:`merge_plan`),
    which the tests hold the columnar path to: the same bytes, cuts and handles.

    ``progress`` is called before the first entry and about every ``PROGRESS_EVERY``
    entries after (the compactor checks for cancellation and renews its lease there).
    """
    bottom = drops_tombstones(plan)
    range_tombstones = plan_range_tombstones(plan, manifest, tables)
    writer = OutputWriter(
        tables.store,
        policy,
        drop_tombstones=bottom,
        block_size=block_size,
        bloom_bits_per_key=bloom_bits_per_key,
        compression=compression,
        compression_level=compression_level,
    )
    try:
        if range_tombstones or not columnar:
            entries = merge_plan(plan, manifest, tables, merging, bottom=bottom)
            writer.add_entries(
                compacted_entries(
                    entries if progress is None else _reporting(entries, progress),
                    RangeIndex(range_tombstones),
                    bottom=bottom,
                    clock=clock,
                    merging=merging,
                )
            )
            return writer.finish(range_tombstones)
        fold = folding(RangeIndex(), merging, complete=bottom)
        if isinstance(plan, WalToL0):
            fold = over_ingestions(fold, manifest, tables)
        ranges = RangeIndex()
        reported = 0
        for batch in _batches(_column_sources(plan, manifest, tables), fold):
            if progress is not None and writer.count >= reported:
                progress()
                reported = writer.count + PROGRESS_EVERY
            if isinstance(batch, _Plain):
                writer.add_plain(*batch)
            else:
                writer.add_entries(
                    compacted_entries(
                        iter(batch), ranges, bottom=bottom, clock=clock, merging=merging
                    )
                )
        return writer.finish(())
    finally:
        writer.abort()


PROGRESS_EVERY = 4096
"""Entries between calls of :func:`compact_plan`'s ``progress``."""
PLAIN_BATCH_ROWS = 512
"""Rows the columnar path writes between GIL yields and checks for output to send."""
SOURCE_GROUP_ROWS = 2048
"""Rows of an input the columnar path takes at a time (whole blocks: the block reaching it
ends the group), or fewer when their keys and values reach the input's read chunk."""
MAX_WINDOW_ROWS = 8192
"""Rows of several inputs the columnar path merges in one step (about 2 ms of sorting)."""


def _reporting(entries: Iterator[Entry], progress: Callable[[], None]) -> Iterator[Entry]:
    for count, entry in enumerate(entries):
        if count % PROGRESS_EVERY == 0:
            progress()
        yield entry


class _Plain(NamedTuple):
    """Merged entries (newest version per key, key order) whose values are all plain:
    written as they are."""

    keys: list[bytes]
    seqs: list[int]
    values: list[bytes]


class _Source:
    """One input (a WAL SST, an L0 SST or a sorted run) as columns, a group of blocks at a
    time (:func:`_groups`): ``keys[pos:]`` are not merged yet; ``keys`` None once the input
    is exhausted."""

    __slots__ = ("_groups", "_stamp", "keys", "plain", "pos", "seqs", "values")

    def __init__(self, groups: Iterator[Piece], stamp: int) -> None:
        self._groups = groups
        self._stamp = stamp
        self.keys: list[bytes] | None = None
        self.seqs: list[int] = []
        self.values: list[bytes | None] = []
        self.plain = False
        self.pos = 0
        self.advance()

    def advance(self) -> None:
        """Move on to the next group."""
        for keys, seqs, values, plain in self._groups:
            if keys:
                self.keys, self.values, self.pos, self.plain = keys, values, 0, plain
                # Ingested L0 SSTs store seq 0: their entries take the handle's global seq
                # (RFC 0016), as ``stamped`` gives them on the entry path.
                self.seqs = [self._stamp] * len(keys) if self._stamp else list(seqs)
                return
        self.keys = None


def _column_sources(plan: Plan, manifest: Manifest, tables: TableReader) -> list[_Source]:
    """The inputs of ``plan`` (in :func:`plan_inputs`' order) as :class:`_Source`s, read
    the way :func:`plan_inputs` reads them."""
    sources, stamps = _plan_sources(plan, manifest, tables)
    chunk = max(MIN_CHUNK_BYTES, READ_AHEAD_BYTES // max(len(sources), 1))
    return [
        _Source(_groups(_chain_columns(tables, paths, chunk), chunk), stamp)
        for paths, stamp in zip(sources, stamps, strict=True)
    ]


def _groups(pieces: Iterator[Piece], budget: int) -> Iterator[Piece]:
    """A source's blocks joined into groups of ``SOURCE_GROUP_ROWS`` rows or ``budget``
    bytes of keys and values, whichever comes first (or what is left), each with whether
    all its values are plain: windows then hold whole groups of the inputs that overlap
    them, not a block or two of each (a window costs a step per input in it), and memory
    about one read chunk per input, as on the entry path (large values, few rows)."""
    keys: list[bytes] = []
    seqs: list[int] = []
    values: list[bytes | None] = []
    plain = True
    size = 0
    for piece_keys, piece_seqs, piece_values, piece_plain in pieces:
        keys += piece_keys
        seqs += piece_seqs
        values += piece_values
        size += sum(map(len, piece_keys))
        if piece_plain:
            size += sum(map(len, cast("list[bytes]", piece_values)))
        else:
            size += sum(len(v) for v in piece_values if v is not None)
        plain = plain and piece_plain
        if len(keys) >= SOURCE_GROUP_ROWS or size >= budget:
            yield keys, seqs, values, plain
            keys, seqs, values, plain, size = [], [], [], True, 0
    if keys:
        yield keys, seqs, values, plain


def _chain_columns(
    tables: TableReader, paths: list[tuple[str, int | None]], chunk: int
) -> Iterator[Piece]:
    """:func:`_chain` a block at a time."""
    for path, size in paths:
        yield from tables.scan_all_columns(path, chunk_bytes=chunk, size=size)


WindowPart = tuple[list[bytes], list[int], list[bytes | None], bool]
Window = list[WindowPart]
"""The columns of the sources that have entries in a window, in source order, and whether
each one's values are all plain."""


def _windows(sources: list[_Source]) -> Iterator[Window]:
    """The sources' entries in consecutive key ranges, so every version of a key is in one
    window and memory holds one group per source.

    A window ends at the smallest last key of the sources' current groups (a source whose
    next key lies beyond that cannot hold it); the sources it draws on are found through a
    heap by next key, so a window costs the sources it holds, not all of them (a WalToL0
    may have hundreds of WAL SSTs of disjoint key ranges: one a window, concatenated).
    """
    heap = [(s.keys[0], rank, s) for rank, s in enumerate(sources) if s.keys is not None]
    heapq.heapify(heap)
    while heap:
        _, rank, source = heapq.heappop(heap)
        taken = [(rank, source)]
        assert source.keys is not None
        bound = source.keys[-1]
        while heap and heap[0][0] <= bound:
            _, rank, source = heapq.heappop(heap)
            taken.append((rank, source))
            assert source.keys is not None
            bound = min(bound, source.keys[-1])
        taken.sort(key=itemgetter(0))  # source order: ties on seq go to the earlier one
        window: Window = []
        for rank, source in taken:
            keys = source.keys
            assert keys is not None
            pos = source.pos
            count = len(keys)
            cut = count if keys[-1] <= bound else bisect_right(keys, bound, pos)
            if cut > pos:
                window.append(_sliced((keys, source.seqs, source.values, source.plain), pos, cut))
                source.pos = cut
            if cut == count:
                source.advance()
            if source.keys is not None:
                heapq.heappush(heap, (source.keys[source.pos], rank, source))
        if len(window) > 1 and sum(len(w[0]) for w in window) > MAX_WINDOW_ROWS:
            yield from _split(window)
        else:
            yield window


def _sliced(columns: WindowPart, lo: int, hi: int) -> WindowPart:
    """Rows ``lo:hi`` of ``columns`` (the lists themselves when that is all of them) and
    whether their values are all plain."""
    keys, seqs, values, plain = columns
    if lo == 0 and hi == len(keys):
        return columns
    part = values[lo:hi]
    return keys[lo:hi], seqs[lo:hi], part, plain or _all_plain(part)


def _split(window: Window) -> Iterator[Window]:
    """A window of many rows cut into windows of about ``MAX_WINDOW_ROWS`` at keys of its
    largest source (a key's versions stay together: each cut is after a key), so one merge
    holds the GIL for a few ms at most."""
    total = sum(len(w[0]) for w in window)
    largest = max(window, key=lambda w: len(w[0]))[0]
    parts = -(-total // MAX_WINDOW_ROWS)
    bounds = [largest[len(largest) * i // parts - 1] for i in range(1, parts)]
    starts = [0] * len(window)
    for bound in [*bounds, None]:
        sub: Window = []
        for n, columns in enumerate(window):
            keys, lo = columns[0], starts[n]
            hi = len(keys) if bound is None else bisect_right(keys, bound, lo)
            if hi > lo:
                sub.append(_sliced(columns, lo, hi))
                starts[n] = hi
        if sub:
            yield sub


def _all_plain(values: list[bytes | None]) -> bool:
    """Whether every value is exactly ``bytes`` (what ``compacted_entries`` writes as it
    is): a group holding a tombstone or an entry kind may have none in this window."""
    return set(map(type, values)) == _BYTES_ONLY


_BYTES_ONLY = {bytes}


def _batches(
    sources: list[_Source], fold: Callable[[list[Entry]], Entry | None]
) -> Iterator[_Plain | list[Entry]]:
    """The merge of ``sources`` (``merge_folding``'s: newest version per key, ties on seq to
    the earlier source, merge operands folded by ``fold``), a window at a time: plain
    windows as :class:`_Plain` batches of at most ``PLAIN_BATCH_ROWS`` rows, others as
    lists of entries for ``compacted_entries``."""
    for window in _windows(sources):
        if not all(plain for _, _, _, plain in window):
            yield list(merge_folding((zip(k, s, v, strict=True) for k, s, v, _ in window), fold))
            continue
        if len(window) == 1:
            keys, seqs, values, _ = window[0]
        else:
            keys, seqs, values = _merge_plain(window)
        for begin in range(0, len(keys), PLAIN_BATCH_ROWS):
            end = begin + PLAIN_BATCH_ROWS
            yield _Plain(keys[begin:end], seqs[begin:end], values[begin:end])  # type: ignore[arg-type]


def _merge_plain(window: Window) -> tuple[list[bytes], list[int], list[bytes | None]]:
    """The newest version of each key of a window, in C (:func:`newest_columns`)."""
    return newest_columns([(k, s, v) for k, s, v, _ in window])
