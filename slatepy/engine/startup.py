"""The writer start-up protocol (manifest seed, "Writer Protocol") and WAL recovery.

1. Bump ``writer_epoch`` and register a short-lived snapshot in one manifest update (the
   snapshot keeps the WAL from being collected while we fence and replay).
   The WAL is listed inside that update (before it lands): a run of missing SSTs below later
   ones wider than any in-flight window is corruption, and the first free slot is where
   fencing starts. Every WAL SST of that listing that step 3 will replay is read and checked
   there too, so a damaged or missing one fails the open before anything is written: a failed
   open leaves no epoch bump and no snapshot behind (issue 12, RFC 0012).
2. Write empty SSTs carrying the new epoch into ``max_parallel_writes`` consecutive WAL slots
   (the wider of the manifest's fence width and ours), starting at the first free slot, so a
   gap left by an in-flight parallel write is closed too. An older epoch in a slot means
   start over at the next free one; the same or a newer epoch means we are fenced (see
   :class:`~slatepy.engine.fencing.Fencing` for why passing slots is safe).
3. Replay every WAL SST after ``wal_id_last_compacted`` and before the fence into a memtable.
   Replay happens after fencing so no older writer can add to the WAL behind our back; an
   SST of a newer epoch in that range means we are fenced. The SSTs step 1 read are not read
   again (WAL SSTs are write-once, so those bytes are what a read now would return); only the
   slots an older writer filled between our listing and our fence are read here.
4. Remove the snapshot and, if we still hold the epoch, lower the fence width to ours.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec

from slatepy.config import Settings
from slatepy.engine.fencing import describe_gap, epoch_verifier, fence_wal, fenced, wal_gaps
from slatepy.engine.memtable import Memtable, Version
from slatepy.engine.view import get_compacted
from slatepy.errors import CorruptionError, NotFound, UnsupportedFormatVersion
from slatepy.format.block import Entry
from slatepy.format.sst import SstMeta, decode_sst
from slatepy.manifest.record import Manifest, Snapshot, SstOptions
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects, contiguous_end
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader

REPLAY_CONCURRENCY = 8

DecodedWal = tuple[SstMeta, list[Entry]]
"""A WAL SST read whole and checked: its meta and every entry."""


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


def start_writer(
    store: ObjectStore,
    manifests: ManifestStore,
    settings: Settings,
    merging: Merging = NO_MERGING,
) -> WriterStart:
    """Run the start-up protocol; raises ``FencedError`` if a newer writer wins meanwhile.

    Raises:
        FencedError: a newer writer bumped the epoch or took a WAL slot first.
        CorruptionError: WAL SSTs are missing below later ones (a gap no write in flight
            can explain), or a WAL SST in the replayed range is damaged.
    """
    snapshot_id = uuid.uuid4().hex
    own_width = settings.max_parallel_writes
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    fences_needed = start = 0
    checked: dict[int, DecodedWal] = {}

    def bump(manifest: Manifest, next_id: int) -> Manifest:
        nonlocal fences_needed, start
        # The old writer may have had more PUTs in flight than we will: fence for the wider,
        # and keep the wider in the manifest until our fence of that width is complete (if
        # we die before, the next writer must still fence that wide).
        fences_needed = max(manifest.max_parallel_writes, own_width)
        # Listed before our bump lands, so no slot below ``start`` can hold a newer epoch.
        first = manifest.wal_id_last_compacted + 1
        ids = wal.ids(after=first - 1)
        check_no_gaps(wal, ids, first, manifest.max_parallel_writes)
        start = contiguous_end(ids, first)
        # Before the bump lands: a damaged WAL SST must fail the open with nothing changed.
        # A retry (lost CAS) reads only what it has not read yet.
        read_wal(wal, [i for i in range(first, start) if i not in checked], into=checked)
        now = time.time()
        snapshot = Snapshot(snapshot_id, next_id, int(now + settings.writer_snapshot_ttl) + 1)
        bumped = (
            manifest.without_expired_snapshots(now)
            .with_writer_epoch(manifest.writer_epoch + 1)
            .with_snapshot(snapshot)
        )
        return msgspec.structs.replace(
            bumped, max_parallel_writes=fences_needed, sst_options=sst_options_of(settings)
        )

    stored = manifests.update(bump)
    epoch = stored.manifest.writer_epoch
    first = stored.manifest.wal_id_last_compacted + 1

    verify = epoch_verifier(manifests, epoch, "this writer's")

    fences = fence_wal(
        wal, start, epoch, fences_needed, verify=verify, attempts=settings.wal_write_attempts
    )
    manifest = stored.manifest
    tables = TableReader(store, cache_bytes=1 << 20)  # asked only after an ingestion
    memtable, wal_max_seq = replay(
        wal,
        first,
        fences[0],
        epoch=epoch,
        checked=checked,
        merging=merging,
        ingest_seq=manifest.last_ingest_seq,
        compacted_version=lambda key: get_compacted(tables, manifest, key),
    )

    def release(manifest: Manifest, _: int) -> Manifest:
        released = manifest.without_snapshot(snapshot_id)
        if manifest.writer_epoch == epoch:
            # Our fence covered every older writer's window: only ours matters from now on.
            released = msgspec.structs.replace(released, max_parallel_writes=own_width)
        return released

    released = manifests.update(release)
    return WriterStart(
        epoch,
        fences[-1],
        memtable,
        # New writes must sort after everything already written, compacted or not.
        max(max(wal_max_seq.values(), default=0), released.manifest.max_compacted_seq()),
        fences[0] - first,
        released.manifest,
        wal_max_seq,
    )


def sst_options_of(settings: Settings) -> SstOptions:
    """The SST options a writer records in the manifest for compactors to follow."""
    return SstOptions(
        compression=settings.compression,
        compression_level=settings.compression_level,
        block_size=settings.block_size,
        bloom_bits_per_key=settings.bloom_bits_per_key,
    )


def check_no_gaps(wal: NumberedObjects, ids: list[int], first: int, width: int) -> None:
    """Raise ``CorruptionError`` naming the missing WAL SSTs if ``ids`` has a lost run."""
    gaps = wal_gaps(ids, first, width)
    if gaps:
        missing = ", ".join(describe_gap(wal, g) for g in gaps)
        raise CorruptionError(
            f"WAL gap: {missing} missing below {wal.path(ids[-1])}; more than the "
            f"{width} writes a writer may have in flight, so they were lost (deleted or "
            "never copied), not still being written. Restore them from a backup.",
            path=wal.path(gaps[0].start),
        )


def decode_wal_sst(path: str, data: bytes) -> tuple[SstMeta, list[Entry]]:
    """Decode a whole WAL SST, every block checked before any entry is used.

    Raises:
        CorruptionError: naming ``path``.
    """
    try:
        meta, entries = decode_sst(data)
        return meta, list(entries)
    except UnsupportedFormatVersion as exc:
        raise exc.at(path) from None
    except CorruptionError as exc:
        raise CorruptionError(f"{path}: {exc}", path=path) from exc


def read_wal_sst(wal: NumberedObjects, wal_id: int) -> DecodedWal:
    """Read and check WAL SST ``wal_id`` whole.

    Raises:
        CorruptionError: naming the object: it is damaged, or missing (a WAL SST is only
            read when a later one exists or the manifest says it should, so it was lost).
    """
    try:
        data = wal.read(wal_id)
    except NotFound as exc:
        raise CorruptionError(
            f"WAL gap: {wal.path(wal_id)} is missing but later WAL SSTs exist",
            path=wal.path(wal_id),
        ) from exc
    return decode_wal_sst(wal.path(wal_id), data)


def read_wal(wal: NumberedObjects, ids: list[int], *, into: dict[int, DecodedWal]) -> None:
    """Read and check the WAL SSTs ``ids`` (in parallel) into ``into``.

    One that vanished since it was listed is skipped: only a garbage collector deletes WAL
    SSTs, after a compaction newer than the manifest the caller read, so the caller's update
    will lose its compare-and-swap and list again (and replay still reports a real gap).

    Raises:
        CorruptionError: naming the lowest damaged one of ``ids``.
    """
    if not ids:
        return

    def read(wal_id: int) -> DecodedWal | None:
        try:
            data = wal.read(wal_id)
        except NotFound:
            return None
        return decode_wal_sst(wal.path(wal_id), data)

    with ThreadPoolExecutor(REPLAY_CONCURRENCY, thread_name_prefix="slatepy-replay") as pool:
        for wal_id, decoded in zip(ids, pool.map(read, ids), strict=True):
            if decoded is not None:
                into[wal_id] = decoded


def replay(
    wal: NumberedObjects,
    first: int,
    end: int,
    *,
    epoch: int | None = None,
    checked: dict[int, DecodedWal] | None = None,
    merging: Merging = NO_MERGING,
    ingest_seq: int = 0,
    compacted_version: Callable[[bytes], Version | None] | None = None,
) -> tuple[Memtable, dict[int, int]]:
    """Apply WAL SSTs ``first .. end-1`` in order; return the memtable and each SST's max seq.

    Args:
        epoch: A starting writer's epoch: an SST of a newer epoch in the range means a
            newer writer got in first, and this writer must not start.
        checked: SSTs already read and checked (start-up reads them before its epoch bump);
            they are used instead of reading again, and removed from the dict as applied.
        ingest_seq, compacted_version: The view's newest ingestion and its compacted
            versions: merge operands written after an ingestion fold over its value, not
            over an older write replayed here (:meth:`Memtable.ingested_bases`).

    Raises:
        CorruptionError: an SST in the range is missing (the WAL must be contiguous) or corrupt.
        FencedError: an SST in the range holds a newer epoch than ``epoch``.
    """
    memtable = Memtable(merging)
    memtable.ingest_seq, memtable.compacted_version = ingest_seq, compacted_version
    max_seq: dict[int, int] = {}
    done = {} if checked is None else checked

    def fetch(wal_id: int) -> DecodedWal:
        found = done.pop(wal_id, None)
        return read_wal_sst(wal, wal_id) if found is None else found

    with ThreadPoolExecutor(REPLAY_CONCURRENCY, thread_name_prefix="slatepy-replay") as pool:
        for wal_id, (meta, entries) in zip(
            range(first, end), pool.map(fetch, range(first, end)), strict=True
        ):
            if epoch is not None and meta.props.writer_epoch > epoch:
                raise fenced(wal_id, epoch, meta.props.writer_epoch)
            if meta.props.range_tombstones:
                # Before the entries, as a live write applies them (Memtable.apply): a merge
                # after a range delete stacks on nothing, not on the operands it removed.
                memtable.apply((), meta.props.range_tombstones)
            for key, seq, value in entries:
                memtable.put(key, seq, value)
            max_seq[wal_id] = meta.props.max_seq
    return memtable, max_seq
