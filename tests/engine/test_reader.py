"""``DbReader`` in-process over every backend: the seed's reader protocol step by step."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from slatepy import Db, DbReader, NotFound, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.format.sst import SstBuilder
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from tests.conftest import Backend

SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=4, target_sst_bytes=2000)


def reader_settings(backend: Backend, **overrides: object) -> Settings:
    fields = {f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}
    return Settings.from_dict({**fields, "reader_poll_interval": 3600, **overrides})


def current_manifest(backend: Backend) -> tuple[int, Manifest]:
    stored = ManifestStore(backend.store()).load()
    assert stored is not None
    return stored.id, stored.manifest


def test_reader_sees_compacted_and_wal_data_and_registers_a_snapshot(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        for i in range(30):
            db.put(b"k%02d" % i, b"old%d" % i)
        Compactor(backend.store(), settings=backend.settings).run_until_idle()
        for i in range(0, 30, 3):
            db.put(b"k%02d" % i, b"new%d" % i)
        db.delete(b"k01")
        expected = dict(db.scan())
        wal_end = db.next_wal_id - 1
    with DbReader.open(backend.target(), settings=reader_settings(backend)) as reader:
        assert dict(reader.scan()) == expected
        assert reader.get(b"k03") == b"new3" and reader.get(b"k04") == b"old4"
        assert reader.get(b"k01") is None
        assert list(reader.scan(b"k10", b"k13")) == [
            (k, expected[k]) for k in (b"k10", b"k11", b"k12")
        ]
        manifest_id, manifest = current_manifest(backend)
        assert manifest_id == reader.manifest_id
        (snapshot,) = manifest.snapshots
        assert (snapshot.id, snapshot.manifest_id) == (reader.snapshot_id, reader.manifest_id)
        assert snapshot.expire_time_s > time.time()
        assert manifest.wal_id_last_seen == reader.wal_id == wal_end
    _, manifest = current_manifest(backend)
    assert manifest.snapshots == ()


def test_reader_on_a_missing_database_creates_nothing(backend: Backend) -> None:
    with pytest.raises(NotFound):
        DbReader.open(backend.target(), settings=reader_settings(backend))
    assert backend.store().list("") == []


def test_reader_picks_up_new_writes_and_compactions(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"a", b"1")
        reader = DbReader.open(backend.target(), settings=reader_settings(backend))
        try:
            db.write(WriteBatch().put(b"b", b"2").put(b"c", b"3"))
            assert reader.get(b"b") is None  # not polled yet
            reader.refresh()
            assert dict(reader.scan()) == {b"a": b"1", b"b": b"2", b"c": b"3"}
            first_snapshot = reader.snapshot_id

            Compactor(backend.store(), settings=backend.settings).run_until_idle()
            db.put(b"d", b"4")
            reader.refresh()
            assert reader.snapshot_id != first_snapshot  # re-snapshotted the compacted state
            assert reader.view.wal_id_last_compacted > 0
            assert len(reader._memtable) == 1  # only b"d" is not compacted
            assert dict(reader.scan()) == {b"a": b"1", b"b": b"2", b"c": b"3", b"d": b"4"}
            _, manifest = current_manifest(backend)
            assert [s.id for s in manifest.snapshots] == [reader.snapshot_id]
        finally:
            reader.close()


def test_reader_waits_for_a_wal_gap_to_fill(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"a", b"1")
        epoch, next_id = db.epoch, db.next_wal_id
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)

    def sst(key: bytes, seq: int) -> bytes:
        builder = SstBuilder(writer_epoch=epoch)
        builder.add(key, seq, b"v")
        return builder.finish().data

    with DbReader.open(backend.target(), settings=reader_settings(backend)) as reader:
        assert wal.create(next_id + 1, sst(b"later", 1001)) is None  # a parallel write landed
        reader.refresh()
        assert reader.get(b"later") is None and reader.wal_id == next_id - 1
        assert wal.create(next_id, sst(b"earlier", 1000)) is None  # the gap fills
        reader.refresh()
        assert reader.get(b"earlier") == b"v" and reader.get(b"later") == b"v"
        assert reader.wal_id == next_id + 1


def test_idle_readers_do_not_write_manifests(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"a", b"1")
    settings = reader_settings(backend)
    with (
        DbReader.open(backend.target(), settings=settings) as one,
        DbReader.open(backend.target(), settings=settings) as two,
    ):
        settled, _ = current_manifest(backend)
        for _ in range(3):
            one.refresh()
            two.refresh()
        assert current_manifest(backend)[0] == settled  # no snapshot ping-pong


def test_reader_renews_its_snapshot_before_it_expires(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"a", b"1")
    with DbReader.open(
        backend.target(), settings=reader_settings(backend, reader_snapshot_ttl=30)
    ) as reader:
        _, before = current_manifest(backend)
        reader._registered_at -= 11  # a third of the ttl has passed
        reader.refresh()
        _, after = current_manifest(backend)
        (old,), (new,) = before.snapshots, after.snapshots
        assert new.id == reader.snapshot_id != old.id
        assert new.expire_time_s >= old.expire_time_s
        assert reader.get(b"a") == b"1"


def test_poller_applies_writes_on_its_own(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"a", b"1")
        settings = reader_settings(backend, reader_poll_interval=0.02)
        with DbReader.open(backend.target(), settings=settings) as reader:
            db.put(b"b", b"2")
            acked = time.monotonic()
            for _ in range(500):  # bounded: 500 x 10 ms
                if reader.get(b"b") == b"2":
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the reader never saw the acknowledged write")
            assert time.monotonic() - acked < 5.0


def test_a_reader_whose_snapshot_lapsed_catches_up_fully_on_refresh(backend: Backend) -> None:
    """Regression (found by the torture soak): a refresh that found its next WAL SST already
    collected re-registered and returned *behind* the acknowledged writes."""
    store = backend.store()
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"k", b"1")
        with DbReader.open(backend.target(), settings=reader_settings(backend)) as reader:
            for i in range(2, 6):
                db.put(b"k", b"%d" % i)
            Compactor(store, settings=backend.settings).run_until_idle()
            db.put(b"k", b"6")
            # The reader stalled past its snapshot's expiry: GC takes the WAL it has not read.
            later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3600)
            GarbageCollector(store, min_age=0, clock=lambda: later).collect()
            assert reader.get(b"k") == b"1"
            reader.refresh()
            assert reader.get(b"k") == b"6"
