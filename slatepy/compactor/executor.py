"""Compaction execution: stream-merge the inputs of a plan into new SSTs.

Inputs are read in large sequential chunks through ``TableReader.scan_all`` (uncached, and
not pinned: compaction must not evict the read path's hot blocks, nor keep the indexes of
the SSTs it is about to replace) and merged with :func:`merge_newest`;
output SSTs are cut at ``target_sst_bytes`` (a WalToL0's too: its outputs are several L0
SSTs with disjoint key ranges, RFC 0011) and streamed to the store while they are built, so
memory holds about ``SEND_BYTES`` of output and one chunk per input (together at most
``READ_AHEAD_BYTES``) at a time, whatever the size of the inputs or outputs. Outputs are
written under ``compacted/`` with fresh random ids; they become part of the database only
when the manifest update publishing them succeeds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence

from slatepy.compactor.planner import CompactionPolicy, L0ToRun, Plan, WalToL0
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.kinds import RangeTombstone
from slatepy.format.sst import EncodedSst, SstBuilder
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.store.base import ObjectStore
from slatepy.store.cas import create_if_absent
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.merge import merge_folding, stamped
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import Clock, RangeIndex, compacted_entries, folding

READ_AHEAD_BYTES = 16 * 1024 * 1024
SEND_BYTES = 8 * 1024 * 1024
"""Finished data blocks an output SST buffers before they are streamed to the store."""
YIELD_EVERY = 128
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
    return merge_folding(
        plan_inputs(plan, manifest, tables), folding(ranges, merging, complete=bottom)
    )


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


def write_outputs(
    entries: Iterator[Entry],
    tables: TableReader,
    policy: CompactionPolicy,
    *,
    drop_tombstones: bool,
    block_size: int,
    bloom_bits_per_key: int,
    compression: Compression = "none",
    compression_level: int = 0,
    range_tombstones: Sequence[RangeTombstone] = (),
    clock: Clock = time.time,
    merging: Merging = NO_MERGING,
) -> list[SstHandle]:
    """Write the merged stream as SSTs in key order, cut at ``policy.target_sst_bytes``.

    Entry kinds follow :func:`slatepy.table.visibility.compacted_entries`: entries under
    ``range_tombstones`` (the inputs', :func:`plan_range_tombstones`) go, expired values
    become tombstones (``clock`` says what has expired) or, with ``drop_tombstones`` (the
    bottom: nothing older exists), go with the tombstones. The range tombstones themselves
    are written with the last output (an SST of no entries if none is left), unless
    ``drop_tombstones``: at the bottom nothing older is left under them.

    The outputs have disjoint, increasing key ranges: as L0 SSTs (WalToL0) a key is in at
    most one of them, so their order among themselves does not matter to reads; as a sorted
    run (L0ToRun) they are its SSTs in order. If the stream fails, the output being written
    is aborted; outputs already written stay unreferenced until GC deletes them.
    """
    handles: list[SstHandle] = []
    output: _Output | None = None
    entries = compacted_entries(
        entries, RangeIndex(range_tombstones), bottom=drop_tombstones, clock=clock, merging=merging
    )
    try:
        for count, (key, seq, value) in enumerate(entries):
            if count % YIELD_EVERY == 0:
                # Let the writer's threads have the GIL: a thread back from its WAL PUT would
                # otherwise wait out the interpreter's 5 ms switch interval (RFC 0006).
                time.sleep(0)
                if output is not None:
                    output.send_if_due()
            if value is None and drop_tombstones:
                continue
            if output is not None and output.builder.estimated_size >= policy.target_sst_bytes:
                # Cut only when another entry follows, so the last output is still open
                # below for the range tombstones.
                handles.append(output.finish())
                output = None
            if output is None:
                output = _Output(
                    tables.store,
                    block_size,
                    bloom_bits_per_key,
                    compression=compression,
                    compression_level=compression_level,
                )
            output.builder.add(key, seq, value)
        if range_tombstones and not drop_tombstones:
            if output is None:
                output = _Output(
                    tables.store,
                    block_size,
                    bloom_bits_per_key,
                    compression=compression,
                    compression_level=compression_level,
                )
            for tombstone in range_tombstones:
                output.builder.add_range_tombstone(tombstone)
        if output is not None:
            handles.append(output.finish())
            output = None
    finally:
        if output is not None:
            output.abort()
    return handles


class _Output:
    """One output SST on its way to ``compacted/`` under a fresh random id: finished data
    blocks are streamed out (``ObjectStore.open_writer``) once ``SEND_BYTES`` of them are
    buffered, so memory holds about one part of the SST, not the whole of it (RFC 0011).

    Written with an overwrite: the id is a fresh uuid4, and the SST becomes part of the
    database only when the manifest update naming it succeeds.
    """

    def __init__(
        self,
        store: ObjectStore,
        block_size: int,
        bloom_bits_per_key: int,
        *,
        compression: Compression = "none",
        compression_level: int = 0,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.builder = SstBuilder(
            writer_epoch=0,
            block_size=block_size,
            bloom_bits_per_key=bloom_bits_per_key,
            compression=compression,
            compression_level=compression_level,
        )
        self._writer = store.open_writer(compacted_path(self.id))

    def send_if_due(self) -> None:
        if self.builder.buffered_bytes >= SEND_BYTES:
            self._writer.write(self.builder.take_data())

    def finish(self) -> SstHandle:
        encoded = self.builder.finish()
        self._writer.write(encoded.data)
        self._writer.commit()
        return handle_of(self.id, encoded)

    def abort(self) -> None:
        self._writer.abort()


def store_sst(store: ObjectStore, encoded: EncodedSst) -> SstHandle:
    """Write ``encoded`` (whole, not empty) under a fresh id in ``compacted/``; return its
    handle."""
    sst_id = uuid.uuid4().hex
    if create_if_absent(store, compacted_path(sst_id), encoded.data) is not None:
        raise RuntimeError(f"compacted SST id collision: {sst_id}")  # a uuid4 collision
    return handle_of(sst_id, encoded)


def handle_of(sst_id: str, encoded: EncodedSst) -> SstHandle:
    """The manifest's handle of the SST ``encoded`` written as ``compacted/{sst_id}``."""
    props = encoded.meta.props
    first, last = props.first_key, props.last_key
    if first is None or last is None:
        # Range tombstones only: the handle needs a key range; the tombstones' first start
        # serves (reads find range tombstones through the handle's list, not by key).
        assert props.range_tombstones, "an SST with neither entries nor range tombstones"
        first = last = props.range_tombstones[0].start
    return SstHandle(
        sst_id,
        encoded.meta.object_size,
        first,
        last,
        props.entry_count,
        props.max_seq,
        range_tombstones=props.range_tombstones,
    )
