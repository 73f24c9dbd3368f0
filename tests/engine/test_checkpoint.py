"""Checkpoints (RFC 0017): what they hold survives compaction and GC until they expire or are
deleted, a reader opened at one reads exactly it, and the record stays readable by older code."""

from __future__ import annotations

import datetime as dt
import time

import msgspec
import pytest

from slatepy import Db, DbReader, InvalidArgument, NotFound
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import Manifest, Snapshot
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore
from tests.conftest import Backend

SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=4, target_sst_bytes=2000)


def fill(db: Db, tag: bytes, keys: int = 40) -> dict[bytes, bytes]:
    model = {b"key%03d" % i: tag + b"-%d" % i * 5 for i in range(keys)}
    for key, value in model.items():
        db.put(key, value, await_durable=False)
    return model


def compact_and_collect(store: ObjectStore, backend: Backend, *, later: float = 0) -> None:
    """Compact everything, then two GC passes with gc_min_age 0 (the second collects the
    manifest the first decided on), with the clock ``later`` seconds ahead."""
    Compactor(store, settings=backend.settings, policy=SMALL).run_until_idle()
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=later)
    gc = GarbageCollector(store, settings=backend.settings, min_age=0, clock=lambda: at)
    gc.collect()
    gc.collect()


def test_a_checkpoint_survives_compaction_and_gc_and_a_reader_at_it_reads_it(
    backend: Backend,
) -> None:
    store = backend.store()
    with Db.open(backend.target(), settings=backend.settings) as db:
        old = fill(db, b"old")
        db.flush()
        Compactor(store, settings=backend.settings, policy=SMALL).run_until_idle()
        old |= fill(db, b"wal", keys=5)  # unawaited: the checkpoint flushes them first
        checkpoint = db.create_checkpoint(name="before")
        assert checkpoint.name == "before" and checkpoint.expire_time is None
        assert db.list_checkpoints() == [checkpoint]
        new = fill(db, b"new")
        db.delete(b"key000")
        db.flush()
        compact_and_collect(store, backend)
        assert dict(db.scan()) == {k: v for k, v in new.items() if k != b"key000"}
        with DbReader.open(
            backend.target(), settings=backend.settings, checkpoint=checkpoint.id
        ) as r:
            assert r.manifest_id == checkpoint.manifest_id and r.wal_id == checkpoint.wal_id
            # It holds compacted SSTs (rewritten since) and WAL (compacted since).
            assert r.view.l0 or r.view.sorted_runs
            assert checkpoint.wal_id > r.view.wal_id_last_compacted
            assert dict(r.scan()) == old
            assert r.get(b"key000") == old[b"key000"]
            assert r.get_many([b"key001", b"nope"]) == [old[b"key001"], None]
            db.put(b"key001", b"after")  # a checkpoint reader never moves
            r.refresh()
            assert r.get(b"key001") == old[b"key001"]
        db.delete_checkpoint(checkpoint.id)
        assert db.list_checkpoints() == []
        compact_and_collect(store, backend)
        # Deleted: what only it held is gone, and it can no longer be opened.
        with pytest.raises(NotFound, match="no checkpoint"):
            DbReader.open(backend.target(), settings=backend.settings, checkpoint=checkpoint.id)
        with pytest.raises(NotFound):
            store.head(ManifestStore(store).path(checkpoint.manifest_id))


def test_an_expired_checkpoint_stops_protecting(backend: Backend) -> None:
    store = backend.store()
    with Db.open(backend.target(), settings=backend.settings) as db:
        fill(db, b"old")
        checkpoint = db.create_checkpoint(lifetime=60)
        assert checkpoint.expire_time is not None
        fill(db, b"new")
        db.flush()
        compact_and_collect(store, backend)  # now: the checkpoint protects its manifest
        store.head(ManifestStore(store).path(checkpoint.manifest_id))
        compact_and_collect(store, backend, later=120)  # two minutes on: it has expired
        with pytest.raises(NotFound):
            store.head(ManifestStore(store).path(checkpoint.manifest_id))


def test_a_reader_at_a_deleted_checkpoint_says_so_when_its_ssts_are_gone(
    backend: Backend,
) -> None:
    store = backend.store()
    with Db.open(backend.target(), settings=backend.settings) as db:
        fill(db, b"old")
        db.flush()
        Compactor(store, settings=backend.settings, policy=SMALL).run_until_idle()
        checkpoint = db.create_checkpoint()  # compacted SSTs only: the WAL is all compacted
        fill(db, b"new")
        db.flush()
        with DbReader.open(
            backend.target(), settings=backend.settings, checkpoint=checkpoint.id
        ) as reader:
            assert reader.view.l0 or reader.view.sorted_runs
            db.delete_checkpoint(checkpoint.id)
            compact_and_collect(store, backend)
            with pytest.raises(NotFound, match="expired or was deleted"):
                reader.get(b"key001")


def test_refresh_moves_the_expiry_and_refuses_what_is_gone(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        checkpoint = db.create_checkpoint(lifetime=30)
        assert checkpoint.expire_time is not None
        longer = db.refresh_checkpoint(checkpoint.id, 3600)
        assert longer.expire_time is not None and longer.expire_time > checkpoint.expire_time
        forever = db.refresh_checkpoint(checkpoint.id, None)
        assert forever.expire_time is None and db.list_checkpoints() == [forever]
        with pytest.raises(InvalidArgument, match="lifetime"):
            db.refresh_checkpoint(checkpoint.id, 0)
        with pytest.raises(NotFound, match="no checkpoint"):
            db.refresh_checkpoint("missing", 10)
        with pytest.raises(NotFound, match="no checkpoint"):
            db.delete_checkpoint("missing")


class OldSnapshot(msgspec.Struct, frozen=True):
    """``Snapshot`` as slatepy wrote it before checkpoints."""

    id: str
    manifest_id: int
    expire_time_s: int


class OldManifest(msgspec.Struct, frozen=True, kw_only=True):
    snapshots: tuple[OldSnapshot, ...] = ()
    wal_id_last_compacted: int = 0


def test_checkpoints_are_snapshots_to_older_code_and_old_snapshots_decode() -> None:
    checkpoint = Snapshot("cp", 3, 0, kind="checkpoint", name="n", wal_id=9, create_time_s=5)
    payload = msgspec.msgpack.encode(Manifest(snapshots=(checkpoint,)))
    # Older slatepy (no such fields) reads it as a snapshot that never expires: still kept.
    old = msgspec.msgpack.decode(payload, type=OldManifest)
    assert old.snapshots == (OldSnapshot("cp", 3, 0),)
    # And a manifest written by older slatepy decodes with plain snapshots.
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Manifest)
    assert back.snapshots == (Snapshot("cp", 3, 0),)
    assert back.snapshots[0].kind == "snapshot"


def test_a_checkpoint_lifetime_must_be_positive(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        with pytest.raises(InvalidArgument, match="lifetime"):
            db.create_checkpoint(lifetime=-1)
        started = time.monotonic()
        db.create_checkpoint(lifetime=1e9)
        assert time.monotonic() - started < 5
