"""The writer start-up protocol (manifest seed, "Writer Protocol") and WAL recovery.

1. Bump ``writer_epoch`` and register a short-lived snapshot in one manifest update (the
   snapshot keeps the WAL from being collected while we fence and replay).
2. Write empty SSTs carrying the new epoch into ``max_parallel_writes`` consecutive WAL slots
   (the wider of the old writer's and ours), starting at the first free slot, so a gap left
   by an in-flight parallel write is closed too. An older epoch in a slot means start over at
   the next free one; the same or a newer epoch means we are fenced.
3. Replay every WAL SST after ``wal_id_last_compacted`` and before the fence into a memtable.
   Replay happens after fencing so no older writer can add to the WAL behind our back.
4. Remove the snapshot.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec

from slatepy.config import Settings
from slatepy.engine.fencing import WAL_DIR, WAL_SUFFIX, fence_wal, first_open_after
from slatepy.engine.memtable import Memtable
from slatepy.errors import CorruptionError, NotFound
from slatepy.format.sst import decode_sst
from slatepy.manifest.record import Manifest, Snapshot
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects

REPLAY_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class WriterStart:
    """What a freshly started writer knows."""

    epoch: int
    fence_id: int
    memtable: Memtable
    last_seq: int
    replayed_ssts: int
    manifest: Manifest
    wal_max_seq: dict[int, int]


def start_writer(store: ObjectStore, manifests: ManifestStore, settings: Settings) -> WriterStart:
    """Run the start-up protocol; raises ``FencedError`` if a newer writer wins meanwhile."""
    snapshot_id = uuid.uuid4().hex
    fences_needed = settings.max_parallel_writes

    def bump(manifest: Manifest, next_id: int) -> Manifest:
        nonlocal fences_needed
        # The old writer may have had more PUTs in flight than we will: fence for the wider.
        fences_needed = max(manifest.max_parallel_writes, settings.max_parallel_writes)
        now = time.time()
        snapshot = Snapshot(snapshot_id, next_id, int(now + settings.writer_snapshot_ttl) + 1)
        bumped = (
            manifest.without_expired_snapshots(now)
            .with_writer_epoch(manifest.writer_epoch + 1)
            .with_snapshot(snapshot)
        )
        return msgspec.structs.replace(bumped, max_parallel_writes=settings.max_parallel_writes)

    stored = manifests.update(bump)
    epoch = stored.manifest.writer_epoch
    first = stored.manifest.wal_id_last_compacted + 1
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    fences = fence_wal(
        wal,
        first_open_after(wal, first - 1),
        epoch,
        fences_needed,
        attempts=settings.wal_write_attempts,
    )
    fence_id = fences[-1]
    memtable, wal_max_seq = replay(wal, first, fences[0])
    released = manifests.update(lambda m, _: m.without_snapshot(snapshot_id))
    return WriterStart(
        epoch,
        fence_id,
        memtable,
        # New writes must sort after everything already written, compacted or not.
        max(max(wal_max_seq.values(), default=0), released.manifest.max_compacted_seq()),
        fences[0] - first,
        released.manifest,
        wal_max_seq,
    )


def replay(wal: NumberedObjects, first: int, end: int) -> tuple[Memtable, dict[int, int]]:
    """Apply WAL SSTs ``first .. end-1`` in order; return the memtable and each SST's max seq.

    Raises:
        CorruptionError: an SST in the range is missing (the WAL must be contiguous) or corrupt.
    """
    memtable = Memtable()
    max_seq: dict[int, int] = {}

    def fetch(wal_id: int) -> bytes:
        try:
            return wal.read(wal_id)
        except NotFound as exc:
            raise CorruptionError(
                f"WAL gap: {wal.path(wal_id)} is missing but later WAL SSTs exist"
            ) from exc

    with ThreadPoolExecutor(REPLAY_CONCURRENCY, thread_name_prefix="slatepy-replay") as pool:
        for wal_id, data in zip(range(first, end), pool.map(fetch, range(first, end)), strict=True):
            meta, entries = decode_sst(data)
            for key, seq, value in entries:
                memtable.put(key, seq, value)
            max_seq[wal_id] = meta.props.max_seq
    return memtable, max_seq
