"""A read never shows what was not written (issue 29, RFC 0026): merges over ingestions,
torn batches, reads after a failed write, snapshots of a failed writer, one clock per
iterator view, fork, the failed writer's error, settings an external compactor follows."""

from __future__ import annotations

from slatepy import Db, DbReader, Settings
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
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
