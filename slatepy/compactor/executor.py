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
from collections.abc import Iterator

from slatepy.compactor.planner import CompactionPolicy, Plan, WalToL0
from slatepy.format.block import Entry
from slatepy.format.compression import Compression
from slatepy.format.sst import EncodedSst, SstBuilder
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.store.base import ObjectStore
from slatepy.store.cas import create_if_absent
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.merge import stamped
from slatepy.table.reader import TableReader

READ_AHEAD_BYTES = 16 * 1024 * 1024
SEND_BYTES = 8 * 1024 * 1024
"""Finished data blocks an output SST buffers before they are streamed to the store."""
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
        # Ingested L0 SSTs store seq 0: their entries take the handle's global seq, which
        # the outputs then store (RFC 0016).
        stamps = [h.global_seq for h in manifest.l0 if h.id in plan.l0_ids]
        stamps += [0] * (len(sources) - len(stamps))
        chunk = max(MIN_CHUNK_BYTES, READ_AHEAD_BYTES // max(len(sources), 1))
        return [
            stamped(_chain(tables, paths, chunk), stamp)
            for paths, stamp in zip(sources, stamps, strict=True)
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
    compression: Compression = "none",
    compression_level: int = 0,
) -> list[SstHandle]:
    """Write the merged stream as SSTs in key order, cut at ``policy.target_sst_bytes``.

    The outputs have disjoint, increasing key ranges: as L0 SSTs (WalToL0) a key is in at
    most one of them, so their order among themselves does not matter to reads; as a sorted
    run (L0ToRun) they are its SSTs in order. If the stream fails, the output being written
    is aborted; outputs already written stay unreferenced until GC deletes them.
    """
    handles: list[SstHandle] = []
    output: _Output | None = None
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
            if output is None:
                output = _Output(
                    tables.store,
                    block_size,
                    bloom_bits_per_key,
                    compression=compression,
                    compression_level=compression_level,
                )
            output.builder.add(key, seq, value)
            if output.builder.estimated_size >= policy.target_sst_bytes:
                handles.append(output.finish())
                output = None
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
    assert props.first_key is not None and props.last_key is not None
    return SstHandle(
        sst_id,
        encoded.meta.object_size,
        props.first_key,
        props.last_key,
        props.entry_count,
        props.max_seq,
    )
