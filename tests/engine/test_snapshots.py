"""Snapshots (RFC 0020): a consistent view that later writes, compaction and GC leave as it
was until released, pinned in the manifest the way readers pin theirs."""

from __future__ import annotations

import time

import pytest

from slatepy import ClosedError, Db, DbReader, NotFound, Settings
from slatepy.engine.view import compacted_ids
from slatepy.gc import GarbageCollector
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path
from tests.conftest import Backend
from tests.engine.layered import TO_RUN, compact

KEYS = [b"k%03d" % i for i in range(200)]


def test_a_snapshot_survives_writes_compaction_and_gc(backend: Backend) -> None:
    store = backend.store()
    target = backend.target() if backend.name == "memory" else store
    with Db.open(target, settings=backend.settings) as db:
        with db.write_batch() as batch:
            for key in KEYS:
                batch.put(key, b"old")
        compact(store, backend.settings, TO_RUN, db)
        db[b"mem"] = b"in the memtable"
        before = dict(db.scan())
        snap = db.snapshot()
        assert snap.snapshot_id in {s.id for s in db._manifests.load().manifest.snapshots}
        old_ids = compacted_ids(snap.manifest)

        with db.write_batch() as batch:
            for key in KEYS[::2]:
                batch.put(key, b"new")
            for key in KEYS[1::4]:
                batch.delete(key)
        del db[b"mem"]
        compact(store, backend.settings, TO_RUN, db)
        assert not old_ids & compacted_ids(db._view)  # the old run was replaced
        GarbageCollector(store, settings=backend.settings, min_age=0).collect()
        for sst in old_ids:  # protected by the snapshot
            store.head(compacted_path(sst))

        assert dict(snap.scan()) == before
        assert list(snap.scan(reverse=True)) == sorted(before.items(), reverse=True)
        assert [r for b in snap.scan_batches(batch_size=16) for r in b] == sorted(before.items())
        it = snap.iter()
        it.seek(b"k100")
        assert next(it) == (b"k100", b"old")
        assert snap.get(b"k001") == b"old" and snap[b"mem"] == b"in the memtable"
        assert snap.get_many([b"k000", b"k005", b"nope"]) == [b"old", b"old", None]
        kv = snap.get_key_value(b"k000")
        assert kv is not None and kv.value == b"old" and kv.seq <= snap.seq
        assert db.get(b"k000") == b"new" and db.get(b"k001") is None and b"mem" not in db

        snap.close()
        snap.close()  # idempotent
        with pytest.raises(ClosedError, match="snapshot was released"):
            snap.get(b"k000")
        assert snap.snapshot_id not in {s.id for s in db._manifests.load().manifest.snapshots}
        GarbageCollector(store, settings=backend.settings, min_age=0).collect()
        for sst in old_ids:  # unprotected now: collected
            with pytest.raises((FileNotFoundError, NotFound)):
                store.head(compacted_path(sst))


def test_snapshot_as_context_manager_and_after_close() -> None:
    with Db.open("memory://") as db:
        db[b"a"] = b"1"
        with db.snapshot() as snap:
            db[b"a"] = b"2"
            assert snap[b"a"] == b"1"
            assert "seq=" in repr(snap)
        assert "released" in repr(snap)
        with pytest.raises(ClosedError):
            list(snap.scan())
    with pytest.raises(ClosedError):
        db.snapshot()


def test_reader_snapshot_is_fixed_while_the_reader_moves_on(backend: Backend) -> None:
    target = backend.target()
    with Db.open(target, settings=backend.settings) as db:
        db[b"k"] = b"1"
        with (
            DbReader.open(target, settings=backend.settings) as reader,
            reader.snapshot() as snap,
        ):
            db[b"k"] = b"2"
            db[b"other"] = b"x"
            reader.refresh()
            assert reader[b"k"] == b"2"
            assert snap[b"k"] == b"1" and b"other" not in snap
            assert list(snap.scan()) == [(b"k", b"1")]
            ids = {s.id for s in ManifestStore(backend.store()).load().manifest.snapshots}
            assert snap.snapshot_id in ids


def test_reads_renew_the_pin_before_it_expires() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=Settings(compactor="off", reader_snapshot_ttl=30)) as db:
        db[b"k"] = b"v"
        with db.snapshot() as snap:
            manifests = ManifestStore(store)

            def expiry() -> int:
                (record,) = [
                    s for s in manifests.load().manifest.snapshots if s.id == snap.snapshot_id
                ]
                return record.expire_time_s

            first = expiry()
            assert snap[b"k"] == b"v"
            assert expiry() == first  # young: no manifest write per read
            assert snap._pin is not None
            snap._pin.renewed_at -= 11  # over a third of the ttl ago
            time.sleep(1.1)  # expiries are whole seconds
            assert snap[b"k"] == b"v"
            assert expiry() > first


def test_a_read_only_readers_snapshot_writes_nothing() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=Settings(compactor="off")) as db:
        db[b"k"] = b"1"
        with DbReader.open(store, read_only=True) as reader:
            before = ManifestStore(store).latest_id()
            with reader.snapshot() as snap:
                db[b"k"] = b"2"
                reader.refresh()
                assert snap.snapshot_id == "" and snap[b"k"] == b"1" and reader[b"k"] == b"2"
            assert ManifestStore(store).latest_id() == before
