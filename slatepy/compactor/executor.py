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

import time
from collections.abc import Callable, Iterator

from slatepy.compactor.columnar_merge import Plain, Source, batches, chain_columns, groups
from slatepy.compactor.ingested import over_ingestions
from slatepy.compactor.outputs import OutputWriter
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, Plan, WalToL0
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.merge import merge_folding, stamped
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
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
    hand_off: Callable[[], bool] = lambda: True,
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
    columns and merged a window at a time (:func:`windows`: every version of a key in the
    same window). A window of plain values only (no tombstone, no entry kind), the common
    case, is merged in C (concatenated when one input has it all, else sorted and deduped)
    and written with :meth:`SstBuilder.extend_below`; any other window takes the entry
    path (``merge_folding``, ``compacted_entries``, ``SstBuilder.add``). With range
    tombstones, or ``columnar`` False, everything takes the entry path (:func:`merge_plan`),
    which the tests hold the columnar path to: the same bytes, cuts and handles.

    ``progress`` is called before the first entry and about every ``PROGRESS_EVERY``
    entries after (the compactor checks for cancellation and renews its lease there).
    ``hand_off`` says at each yield point whether to hand the GIL to other threads
    (``Foreground.yield_to``).
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
        # L0 SSTs of the WAL live until the next L0 merge (or the close's): indexing their
        # blocks cost the writer's awaited batches a fifth of their rate (RFC 0022's
        # addendum); a sorted run's SSTs have them.
        lookup_index=not isinstance(plan, WalToL0),
        hand_off=hand_off,
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
        for batch in batches(_column_sources(plan, manifest, tables), fold):
            if progress is not None and writer.count >= reported:
                progress()
                reported = writer.count + PROGRESS_EVERY
            if isinstance(batch, Plain):
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


def _reporting(entries: Iterator[Entry], progress: Callable[[], None]) -> Iterator[Entry]:
    for count, entry in enumerate(entries):
        if count % PROGRESS_EVERY == 0:
            progress()
        yield entry


def _column_sources(plan: Plan, manifest: Manifest, tables: TableReader) -> list[Source]:
    """The inputs of ``plan`` (in :func:`plan_inputs`' order) as :class:`Source`s, read
    the way :func:`plan_inputs` reads them."""
    sources, stamps = _plan_sources(plan, manifest, tables)
    chunk = max(MIN_CHUNK_BYTES, READ_AHEAD_BYTES // max(len(sources), 1))
    return [
        Source(groups(chain_columns(tables, paths, chunk), chunk), stamp)
        for paths, stamp in zip(sources, stamps, strict=True)
    ]
