"""Compaction execution: stream-merge the inputs of a plan into new SSTs.

Inputs are read in large sequential chunks through ``TableReader.scan_all`` (uncached, and
not pinned: compaction must not evict the read path's hot blocks, nor keep the indexes of
the SSTs it is about to replace) and merged with :func:`merge_newest`;
output SSTs are cut at ``target_sst_bytes`` (a WalToL0's too: its outputs are several L0
SSTs with disjoint key ranges, RFC 0011), so memory holds one output SST and one chunk per
input (together at most ``READ_AHEAD_BYTES``) at a time, whatever the size of the inputs.
Outputs are written create-if-absent under ``compacted/`` with fresh random ids; they become
part of the database only when the manifest update publishing them succeeds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from slatepy.compactor.planner import CompactionPolicy, Plan, WalToL0
from slatepy.format.block import Entry
from slatepy.format.sst import EncodedSst, SstBuilder
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.store.base import ObjectStore
from slatepy.store.cas import create_if_absent
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.reader import TableReader

READ_AHEAD_BYTES = 16 * 1024 * 1024
YIELD_EVERY = 128
MIN_CHUNK_BYTES = 64 * 1024


def plan_inputs(plan: Plan, manifest: Manifest, tables: TableReader) -> list[Iterator[Entry]]:
    """Entry streams of a plan's inputs: one per WAL SST, L0 SST or sorted run."""
    if isinstance(plan, WalToL0):
        wal = NumberedObjects(tables.store, WAL_DIR, WAL_SUFFIX)
        ids = range(plan.last_wal_id, plan.first_wal_id - 1, -1)
        sizes: dict[int, int] = {}
        if not tables.store.supports_suffix:
            # One LIST instead of a HEAD per WAL SST to find where each footer is (Azure).
            listed = wal.entries(after=plan.first_wal_id - 1)
            sizes = {i: meta.size for i, meta in listed if i <= plan.last_wal_id}
        sources: list[list[tuple[str, int | None]]] = [[(wal.path(i), sizes.get(i))] for i in ids]
    else:
        sources = [
            [(compacted_path(h.id), h.object_size)] for h in manifest.l0 if h.id in plan.l0_ids
        ]
        sources += [
            [(compacted_path(h.id), h.object_size) for h in run.ssts]
            for run in manifest.sorted_runs
            if run.id in plan.run_ids
        ]
    # All inputs are open at once, so they share one read-ahead budget.
    chunk = max(MIN_CHUNK_BYTES, READ_AHEAD_BYTES // max(len(sources), 1))
    return [_chain(tables, paths, chunk) for paths in sources]


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
) -> list[SstHandle]:
    """Write the merged stream as SSTs in key order, cut at ``policy.target_sst_bytes``.

    The outputs have disjoint, increasing key ranges: as L0 SSTs (WalToL0) a key is in at
    most one of them, so their order among themselves does not matter to reads; as a sorted
    run (L0ToRun) they are its SSTs in order.
    """
    handles: list[SstHandle] = []
    builder: SstBuilder | None = None

    for count, (key, seq, value) in enumerate(entries):
        if count % YIELD_EVERY == 0:
            # Let the writer's threads have the GIL: a thread back from its WAL PUT would
            # otherwise wait out the interpreter's 5 ms switch interval (RFC 0006).
            time.sleep(0)
        if value is None and drop_tombstones:
            continue
        if builder is None:
            builder = SstBuilder(
                writer_epoch=0, block_size=block_size, bloom_bits_per_key=bloom_bits_per_key
            )
        builder.add(key, seq, value)
        if builder.estimated_size >= policy.target_sst_bytes:
            handles.append(store_sst(tables.store, builder.finish()))
            builder = None
    if builder is not None:
        handles.append(store_sst(tables.store, builder.finish()))
    return handles


def store_sst(store: ObjectStore, encoded: EncodedSst) -> SstHandle:
    """Write ``encoded`` (not empty) under a fresh id in ``compacted/``; return its handle."""
    sst_id = uuid.uuid4().hex
    props = encoded.meta.props
    assert props.first_key is not None and props.last_key is not None
    if create_if_absent(store, compacted_path(sst_id), encoded.data) is not None:
        raise RuntimeError(f"compacted SST id collision: {sst_id}")  # a uuid4 collision
    return SstHandle(
        sst_id,
        len(encoded.data),
        props.first_key,
        props.last_key,
        props.entry_count,
        props.max_seq,
    )
