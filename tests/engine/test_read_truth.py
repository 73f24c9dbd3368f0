"""A read never shows what was not written (issue 29, RFC 0026): merges over ingestions,
torn batches, reads after a failed write, snapshots of a failed writer, one clock per
iterator view, fork, the failed writer's error, settings an external compactor follows."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.engine.memtable import Memtable, Version
from slatepy.store import ObjectStore, open_store

OFF = Settings(flush_interval=60, compactor="off", memtable_retain_bytes=0)
ONE = CompactionPolicy(l0_trigger=1)


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join(([existing] if existing is not None else []) + operands)


def ingest(store: ObjectStore, pairs: list[tuple[bytes, bytes]]) -> None:
    publish_ingest(store, OFF, write_ingest_ssts(store, pairs, OFF, target_sst_bytes=1 << 20))


def wal_compact(store: ObjectStore, policy: CompactionPolicy = ONE) -> None:
    Compactor(store, settings=OFF, policy=policy, merge_operator=concat).run_until_idle()


def test_a_merge_after_an_ingestion_folds_over_the_ingested_value() -> None:
    # Live (memtable stacking), after reopen (WAL replay), after the WAL compaction, and in
    # a reader (its own replay); the key the ingestion did not hold keeps its own base.
    store = open_store("memory://")
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        db.put(b"k", b"old")
        db.put(b"other", b"mine")
        db.flush()
        ingest(store, [(b"k", b"ING")])
        db.refresh()
        db.merge(b"k", b"x")
        db.merge(b"other", b"y")
        assert db.get(b"k") == b"ING,x" and db.get(b"other") == b"mine,y"
        assert dict(db.scan()) == {b"k": b"ING,x", b"other": b"mine,y"}
    with DbReader.open(store, merge_operator=concat) as reader:
        assert reader.get(b"k") == b"ING,x" and reader.get(b"other") == b"mine,y"
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        assert db.get(b"k") == b"ING,x" and db.get(b"other") == b"mine,y"
    wal_compact(store, CompactionPolicy(l0_trigger=100))  # WAL -> L0 only
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        assert db._view.l0 and db.get(b"k") == b"ING,x" and db.get(b"other") == b"mine,y"
    wal_compact(store)
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        assert dict(db.scan()) == {b"k": b"ING,x", b"other": b"mine,y"}


def _pause_after_get(memtable: Memtable, between: Callable[[], None]) -> None:
    """Make ``memtable``'s next :meth:`Memtable.get` run ``between`` once it has read the
    version, before its caller goes on: what another thread's write at that moment does."""
    armed = [True]

    class Paused(Memtable):
        __slots__ = ()

        def get(self, key: bytes) -> Version | None:
            version = super().get(key)
            if armed.pop() if armed else False:
                between()
            return version

    memtable.__class__ = Paused


def _batch() -> WriteBatch:
    batch = WriteBatch()
    batch.delete_range(b"a", b"z")
    batch.put(b"k", b"new")
    return batch


def _write_now_or_after(db: Db, threads: list[threading.Thread]) -> Callable[[], None]:
    """A write of the batch in another thread; waited for unless the read holds the
    writer's lock (then it lands after the read, which is the point of the lock)."""

    def between() -> None:
        held = db._lock.locked()
        thread = threading.Thread(target=db.write, args=(_batch(),))
        thread.start()
        threads.append(thread)
        if not held:
            thread.join()

    return between


@pytest.mark.parametrize("read", ["get", "get_key_value"])
def test_a_point_read_never_sees_half_a_batch(read: str) -> None:
    # k has a value before the batch [delete_range(a, z), put(k, new)] and after it: a read
    # that took k's version before the batch and the range tombstones after it read None
    # (get), or the batch's value with the seq of the write before it (get_key_value).
    with Db.open("memory://", settings=OFF) as db:
        db.put(b"k", b"old")
        before = db.get_key_value(b"k")
        threads: list[threading.Thread] = []
        _pause_after_get(db._memtable, _write_now_or_after(db, threads))
        if read == "get":
            assert db.get(b"k") in (b"old", b"new")
        else:
            found = db.get_key_value(b"k")
            assert found is not None and (found.value, found.seq) in (
                (b"old", before and before.seq),
                (b"new", db._seq),
            )
        for thread in threads:
            thread.join()
        assert db.get(b"k") == b"new"


def test_a_reader_point_read_never_sees_half_a_batch() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=OFF) as db, DbReader.open(store) as reader:
        db.put(b"k", b"old")
        reader.refresh()
        db.write(_batch())  # durable, not yet applied by the reader
        _pause_after_get(reader._memtable, reader.refresh)
        assert reader.get(b"k") in (b"old", b"new")
        assert reader.get(b"k") == b"new"
