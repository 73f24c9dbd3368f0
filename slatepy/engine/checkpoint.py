"""Checkpoints: named, durable views of a database that GC keeps until deleted (RFC 0017).

A checkpoint is a :class:`~slatepy.manifest.record.Snapshot` with ``kind="checkpoint"``: it
holds the manifest written by the update that registered it (so the compacted SSTs that
manifest references) and the WAL SSTs after its ``wal_id_last_compacted`` up to the
checkpoint's ``wal_id``, the contiguous WAL prefix listed inside that update (the reader
protocol's steps 1-4, as :func:`~slatepy.engine.pinned.pin_snapshot` does). So a checkpoint
contains every write that was durable (acknowledged) when it was created;
:meth:`slatepy.Db.create_checkpoint` flushes the writer's WAL first, so that includes every
write the writer made before the call, awaited or not.

GC keeps everything the checkpoint's manifest reaches (rules 1-3: it is an active manifest)
until the checkpoint expires (``lifetime`` seconds after creation or the last refresh) or is
deleted; a checkpoint without a lifetime never expires. The next manifest update by anyone
drops an expired checkpoint.

:class:`~slatepy.engine.checkpoint_reader.CheckpointReader` is the reader
``DbReader.open(url, checkpoint=id)`` returns; this module (the records) knows no reader, so the
reader and clones build on it without an import circle.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from slatepy.config import Settings
from slatepy.errors import InvalidArgument, NotFound
from slatepy.manifest.record import Manifest, Snapshot
from slatepy.manifest.store import ManifestStore, StoredManifest
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint as registered in the manifest.

    Attributes:
        id: Its id (a uuid4 in hex): what ``DbReader.open(..., checkpoint=id)`` takes.
        manifest_id: The manifest it holds.
        wal_id: The last WAL SST it covers (every SST after the manifest's
            ``wal_id_last_compacted`` up to this one is part of it).
        name: The name given at creation ("" if none).
        create_time: When it was created (UTC).
        expire_time: When it expires (UTC); None: never.
    """

    id: str
    manifest_id: int
    wal_id: int
    name: str
    create_time: dt.datetime
    expire_time: dt.datetime | None

    @staticmethod
    def of(snapshot: Snapshot) -> Checkpoint:
        return Checkpoint(
            snapshot.id,
            snapshot.manifest_id,
            snapshot.wal_id,
            snapshot.name,
            _utc(snapshot.create_time_s),
            None if snapshot.expire_time_s == 0 else _utc(snapshot.expire_time_s),
        )


def create_checkpoint(
    store: ObjectStore,
    settings: Settings,
    *,
    lifetime: float | None = None,
    name: str | None = None,
    of: str | None = None,
) -> Checkpoint:
    """Register a checkpoint of the newest manifest and the durable WAL prefix after it.

    Args:
        lifetime: Seconds until it expires (refresh to extend); None: it never expires.
        name: A label for humans (``list_checkpoints``, ``slatepy inspect``).
        of: Hold the view of this existing checkpoint instead (a second checkpoint of it,
            which a clone of that checkpoint registers for itself).

    Raises:
        InvalidArgument: ``lifetime`` is not positive.
        NotFound: no database at the store; no live checkpoint ``of``.
    """
    _check_lifetime(lifetime)
    manifests = _manifests(store, settings)
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    checkpoint_id = uuid.uuid4().hex
    registered: Snapshot | None = None

    def add(m: Manifest, next_id: int) -> Manifest:
        nonlocal registered
        now = time.time()
        if of is None:
            # Listed inside the update, after the manifest was read: the listing is never
            # older than the manifest it goes with (as in DbReader._register).
            found = wal.contiguous_tail(m.wal_id_last_compacted)
            tail = m.wal_id_last_compacted if found is None else found
            held, covered = next_id, tail
        else:
            # Checked in the same update that adds ours: it cannot expire in between.
            other = _find(m.without_expired_snapshots(now), of)
            if other is None:
                raise _missing(store, of)
            held, covered, tail = other.manifest_id, other.wal_id, m.wal_id_last_seen
        registered = Snapshot(
            checkpoint_id,
            held,
            _expiry(now, lifetime),
            kind="checkpoint",
            name=name or "",
            wal_id=covered,
            create_time_s=int(now),
        )
        m = m.without_expired_snapshots(now).with_snapshot(registered)
        return msgspec.structs.replace(m, wal_id_last_seen=max(m.wal_id_last_seen, tail))

    manifests.update(add)
    assert registered is not None
    return Checkpoint.of(registered)


def list_checkpoints(store: ObjectStore, settings: Settings) -> list[Checkpoint]:
    """The unexpired checkpoints of the newest manifest, oldest first."""
    stored = _load(_manifests(store, settings), store)
    now = time.time()
    found = [
        Checkpoint.of(s)
        for s in stored.manifest.snapshots
        if s.kind == "checkpoint" and not s.expired(now)
    ]
    return sorted(found, key=lambda c: (c.create_time, c.id))


def get_checkpoint(store: ObjectStore, settings: Settings, checkpoint_id: str) -> Checkpoint:
    """The unexpired checkpoint ``checkpoint_id``.

    Raises:
        NotFound: there is none (never created, deleted, or expired).
    """
    for checkpoint in list_checkpoints(store, settings):
        if checkpoint.id == checkpoint_id:
            return checkpoint
    raise _missing(store, checkpoint_id)


def refresh_checkpoint(
    store: ObjectStore, settings: Settings, checkpoint_id: str, lifetime: float | None
) -> Checkpoint:
    """Make ``checkpoint_id`` expire ``lifetime`` seconds from now (None: never).

    Raises:
        NotFound: no such unexpired checkpoint (an expired one may already have lost its
            SSTs to GC: create a new one).
        InvalidArgument: ``lifetime`` is not positive.
    """
    _check_lifetime(lifetime)
    refreshed: Snapshot | None = None

    def renew(m: Manifest, _: int) -> Manifest:
        nonlocal refreshed
        now = time.time()
        live = m.without_expired_snapshots(now)
        old = _find(live, checkpoint_id)
        if old is None:
            raise _missing(store, checkpoint_id)
        refreshed = msgspec.structs.replace(old, expire_time_s=_expiry(now, lifetime))
        return live.without_snapshot(checkpoint_id).with_snapshot(refreshed)

    _manifests(store, settings).update(renew)
    assert refreshed is not None
    return Checkpoint.of(refreshed)


def delete_checkpoint(store: ObjectStore, settings: Settings, checkpoint_id: str) -> None:
    """Remove ``checkpoint_id``; GC may then collect what only it held.

    Raises:
        NotFound: no such checkpoint (a mistyped id; or deleted, or expired, already).
    """

    def remove(m: Manifest, _: int) -> Manifest:
        if _find(m, checkpoint_id) is None:
            raise _missing(store, checkpoint_id)
        return m.without_snapshot(checkpoint_id)

    _manifests(store, settings).update(remove)


def _find(m: Manifest, checkpoint_id: str) -> Snapshot | None:
    return next((s for s in m.snapshots if s.id == checkpoint_id and s.kind == "checkpoint"), None)


def _manifests(store: ObjectStore, settings: Settings) -> ManifestStore:
    manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
    _load(manifests, store)
    return manifests


def _load(manifests: ManifestStore, store: ObjectStore) -> StoredManifest:
    stored = manifests.load()
    if stored is None:
        raise NotFound(f"no slatepy database at {store.url}", path="manifest/")
    return stored


def _missing(store: ObjectStore, checkpoint_id: str) -> NotFound:
    return NotFound(
        f"no checkpoint {checkpoint_id!r} in {store.url} (never created, deleted, or "
        "expired); `slatepy checkpoint list URL` shows the live ones",
        path="manifest/",
    )


def _check_lifetime(lifetime: float | None) -> None:
    if lifetime is not None and not lifetime > 0:
        raise InvalidArgument(
            f"checkpoint lifetime must be > 0 seconds (or None: no expiry), got {lifetime}"
        )


def _expiry(now: float, lifetime: float | None) -> int:
    return 0 if lifetime is None else int(now + lifetime) + 1


def _utc(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC)
