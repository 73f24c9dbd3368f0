"""Pinned snapshots: one consistent view of a database, read in pieces by many processes.

A :class:`~slatepy.engine.reader.DbReader` is one process's view that follows the database.
A distributed scan (Spark tasks on many machines) needs the opposite: one view fixed when the
scan is planned, which every task reads part of, in any order and any process, with every
part seeing the same state. The reader protocol gives it in two halves:

* :func:`pin_snapshot` (the planner, once) is the reader protocol's steps 1-4: in one manifest
  update, list the WAL's contiguous prefix after ``wal_id_last_compacted``, raise
  ``wal_id_last_seen`` to it and register a snapshot of that very manifest, expiring after
  ``ttl`` seconds. The returned :class:`PinnedSnapshot` names the manifest id and the WAL
  tail: small, picklable, all a task needs.
* :func:`scan_pinned` (each task) is steps 5-6 for a key range: read that manifest, load the
  WAL SSTs after its ``wal_id_last_compacted`` up to the pinned tail, and merge them over the
  manifest's SSTs. Nothing is written.

Why it is consistent: manifests and WAL SSTs are write-once, so the same ids give the same
bytes to every task. Why it is safe from GC: the snapshot keeps the pinned manifest active,
which protects every compacted SST it references and every WAL SST from its
``wal_id_last_compacted`` on (GC rules 2-3). The snapshot is *not* removed when the scan
ends (a planner cannot know when the last task finishes, and a task cannot know it is the
last): it expires after ``ttl`` and the next manifest update drops it. A scan that runs
longer than ``ttl`` may find SSTs collected and fails with ``CorruptionError``/``NotFound``;
raise ``ttl`` for such scans. :func:`release_snapshot` drops it early.

A clone (RFC 0017) reads the SSTs it shares from its source's store: open the store with
:func:`open_pinned_store` (the routing store under the usual stack) in the planner and in
every task. The pin also keeps the clone's source checkpoint: its snapshot keeps the pinned
manifest active, and the clone's GC releases the checkpoint only once no active manifest
references a shared SST.

Partitioning: :func:`split_points` proposes boundaries from the first keys of the manifest's
compacted SSTs, so a task reads whole SSTs (each read opens few objects) and a key range
prunes the SSTs outside it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from slatepy.config import Settings
from slatepy.engine.batch import check_range
from slatepy.engine.clone import with_external
from slatepy.engine.startup import replay
from slatepy.engine.view import missing_sst, scan_merged
from slatepy.errors import InvalidArgument, NotFound
from slatepy.manifest.record import Manifest, Snapshot
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.store.stack import open_stack
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.reader import TableReader


@dataclass(frozen=True, slots=True)
class PinnedSnapshot:
    """A view fixed by :func:`pin_snapshot`: every read of it returns the same state.

    Attributes:
        manifest_id: The manifest the view reads (kept active by the snapshot).
        wal_id: The last WAL SST of the view: every SST after the manifest's
            ``wal_id_last_compacted`` up to this one is part of it, later ones are not.
        snapshot_id: The snapshot registered in the manifest.
        expire_time_s: When the snapshot expires (UTC epoch seconds).
    """

    manifest_id: int
    wal_id: int
    snapshot_id: str
    expire_time_s: int


def open_pinned_store(url: str, settings: Settings) -> ObjectStore:
    """The store a planner or task of a pinned scan reads ``url`` through: the usual stack
    (retries, metrics, disk cache) over the store, reading a clone's shared SSTs where they
    live (:func:`~slatepy.engine.clone.with_external`). Call ``drain()`` when done."""
    return open_stack(with_external(url, settings), settings)


def pin_snapshot(
    store: ObjectStore, settings: Settings, *, ttl: float
) -> tuple[PinnedSnapshot, Manifest]:
    """Register a snapshot of the newest manifest with its WAL prefix (reader steps 1-4).

    Returns the pinned view and its manifest. Expired snapshots are dropped in the same
    update, so a pin left to expire costs nothing once it has.

    Raises:
        InvalidArgument: ``ttl`` is not positive.
        NotFound: no database at the store.
    """
    if not ttl > 0:
        raise InvalidArgument(f"snapshot ttl must be > 0 seconds, got {ttl}")
    manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
    if manifests.load() is None:
        raise NotFound(f"no slatepy database at {store.url}", path="manifest/")
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    snapshot_id = uuid.uuid4().hex
    tail = expiry = 0

    def add_snapshot(m: Manifest, next_id: int) -> Manifest:
        nonlocal tail, expiry
        # Listed inside the update, after the manifest was read: the listing is never older
        # than the manifest it goes with (as in DbReader._register).
        found = wal.contiguous_tail(m.wal_id_last_compacted)
        tail = m.wal_id_last_compacted if found is None else found
        now = time.time()
        expiry = int(now + ttl) + 1
        m = m.without_expired_snapshots(now).with_snapshot(Snapshot(snapshot_id, next_id, expiry))
        return msgspec.structs.replace(m, wal_id_last_seen=max(m.wal_id_last_seen, tail))

    stored = manifests.update(add_snapshot)
    return PinnedSnapshot(stored.id, tail, snapshot_id, expiry), stored.manifest


def release_snapshot(store: ObjectStore, settings: Settings, pinned: PinnedSnapshot) -> None:
    """Remove the pinned view's snapshot (no-op if it is gone), so GC may collect sooner."""
    manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
    manifests.update(
        lambda m, _: (
            m.without_snapshot(pinned.snapshot_id)
            if any(s.id == pinned.snapshot_id for s in m.snapshots)
            else None
        )
    )


def scan_pinned(
    store: ObjectStore,
    settings: Settings,
    pinned: PinnedSnapshot,
    start: bytes = b"",
    end: bytes | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """Live ``(key, value)`` with ``start <= key < end`` of the pinned view, in key order.

    Raises:
        NotFound: the view was collected (its snapshot expired or was released).
        CorruptionError: an SST of the view is gone while its snapshot protects it.
    """
    check_range(start, end)
    try:
        manifest = ManifestStore(store, attempts=settings.manifest_update_attempts).read(
            pinned.manifest_id
        )
    except NotFound as exc:
        raise _gone(pinned, exc) from exc
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    memtable, _ = replay(wal, manifest.wal_id_last_compacted + 1, pinned.wal_id + 1)
    tables = TableReader(
        store,
        block_cache_bytes=settings.block_cache_bytes,
        meta_cache_bytes=settings.meta_cache_bytes,
        scan_read_ahead_bytes=settings.scan_read_ahead_bytes,
        scan_requests_in_flight=settings.scan_requests_in_flight,
    )
    try:
        yield from scan_merged(
            tables, memtable.range(start, end), manifest, start, end, ranges=memtable.ranges
        )
    except NotFound as exc:
        if time.time() > pinned.expire_time_s:
            raise _gone(pinned, exc) from exc
        raise missing_sst(exc) from exc


def _gone(pinned: PinnedSnapshot, exc: NotFound) -> NotFound:
    return NotFound(
        f"the pinned view of manifest {pinned.manifest_id} was collected: its snapshot "
        f"expired (or was released) before the read; pin a new one, with a longer ttl for "
        f"scans this long ({exc})",
        path=exc.path,
    )


def split_points(
    manifest: Manifest, start: bytes, end: bytes | None, *, max_parts: int
) -> list[bytes]:
    """Keys cutting ``[start, end)`` into at most ``max_parts`` ranges along SST boundaries.

    The candidates are the first keys of the compacted SSTs strictly inside the range; with
    more than ``max_parts - 1`` of them, evenly spaced ones are kept. Returned sorted and
    distinct; ranges are ``[start, p0), [p0, p1), ..., [pn, end)``. With no compacted SSTs
    (everything still in the WAL) there are none: one range.
    """
    if max_parts < 1:
        raise InvalidArgument(f"max_parts must be >= 1, got {max_parts}")
    handles = [*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts)]
    # Not the smallest first key: below it there is no compacted data, only a few WAL keys
    # at most, which the first range reads as well.
    lowest = min((h.first_key for h in handles), default=b"")
    keys = sorted(
        {
            h.first_key
            for h in handles
            if h.first_key > max(start, lowest) and (end is None or h.first_key < end)
        }
    )
    if len(keys) <= max_parts - 1:
        return keys
    step = len(keys) / max_parts
    return sorted({keys[int(step * (i + 1))] for i in range(max_parts - 1)})
