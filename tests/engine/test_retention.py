"""The writer keeps compacted writes in its memtable up to ``memtable_retain_bytes`` (RFC 0011,
"Retention"): reads of recent data stay in memory, the oldest go first, and nothing a
compaction deleted or folded comes back from what is kept."""

from __future__ import annotations

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.engine.memtable import Memtable, entry_cost
from slatepy.errors import InvalidArgument
from slatepy.store import ObjectStore, open_store

RETAIN = Settings(flush_interval=60, compactor="off", memtable_retain_bytes=1 << 20)
SMALL = CompactionPolicy(l0_trigger=1)
VALUE = b"v" * 100


def opened(settings: Settings = RETAIN, **kwargs: object) -> tuple[ObjectStore, Db]:
    store = open_store("memory://")
    return store, Db.open(store, settings=settings, **kwargs)  # type: ignore[arg-type]


def compact(store: ObjectStore, db: Db, **kwargs: object) -> None:
    Compactor(store, settings=RETAIN, policy=SMALL, **kwargs).run_until_idle()  # type: ignore[arg-type]
    db.refresh()


def test_compacted_writes_stay_readable_from_memory() -> None:
    store, db = opened()
    with db:
        for i in range(100):
            db.put(b"k%03d" % i, VALUE)
        compact(store, db)
        assert db._view.wal_id_last_compacted > 0
        assert len(db._memtable) == 100  # kept: every one is compacted, and all fit
        assert db.metrics is not None
        before = {k: v.requests for k, v in db.metrics.snapshot().items()}
        assert all(db.get(b"k%03d" % i) == VALUE for i in range(100))
        assert {k: v.requests for k, v in db.metrics.snapshot().items()} == before  # no reads
        assert [k for k, _ in db.scan()] == [b"k%03d" % i for i in range(100)]


def test_the_oldest_go_first_and_memory_stays_bounded() -> None:
    cost = entry_cost(b"k%05d" % 0, VALUE)
    retain = 200 * cost
    settings = Settings(flush_interval=60, compactor="off", memtable_retain_bytes=retain)
    store, db = opened(settings)
    with db:
        for i in range(1000):
            db.put(b"k%05d" % i, VALUE)
        compact(store, db)
        held = db._memtable.size_bytes
        assert held <= retain
        assert held >= retain // 2  # about three quarters are kept, not none
        kept = sorted(db._memtable._data)
        assert kept == [b"k%05d" % i for i in range(1000 - len(kept), 1000)]  # the newest
        assert all(db.get(b"k%05d" % i) == VALUE for i in range(0, 1000, 7))


def test_no_retention_releases_everything_compacted() -> None:
    settings = Settings(flush_interval=60, compactor="off", memtable_retain_bytes=0)
    store, db = opened(settings)
    with db:
        for i in range(50):
            db.put(b"k%03d" % i, VALUE)
        compact(store, db)
        assert len(db._memtable) == 0 and db.get(b"k010") == VALUE


def test_a_compacted_range_delete_releases_what_it_covers() -> None:
    # Compaction at the bottom drops the range tombstone together with the keys under it: a
    # kept version under the tombstone would come back.
    store, db = opened()
    with db:
        for i in range(20):
            db.put(b"k%02d" % i, VALUE)
        compact(store, db)
        assert len(db._memtable) == 20
        db.delete_range(b"k05", b"k15")
        compact(store, db)
        stored = db._view
        assert not any(h.range_tombstones for h in stored.l0)  # gone from the SSTs
        assert all(db.get(b"k%02d" % i) is None for i in range(5, 15))
        assert [k for k, _ in db.scan()] == [b"k%02d" % i for i in (*range(5), *range(15, 20))]
        assert len(db._memtable) == 0


def test_compacted_merge_operands_are_not_folded_twice() -> None:
    def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
        return b",".join([*([existing] if existing is not None else []), *operands])

    store, db = opened(merge_operator=concat)
    with db:
        db.put(b"m", b"a")
        db.merge(b"m", b"b")
        db.write(WriteBatch().merge(b"n", b"x").merge(b"n", b"y"))
        compact(store, db, merge_operator=concat)
        db.merge(b"n", b"z")
        assert db.get(b"m") == b"a,b" and db.get(b"n") == b"x,y,z"
        compact(store, db, merge_operator=concat)
        assert db.get(b"m") == b"a,b" and db.get(b"n") == b"x,y,z"
        assert dict(db.scan()) == {b"m": b"a,b", b"n": b"x,y,z"}


def test_kept_versions_expire() -> None:
    now = [1_700_000_000.0]
    store, db = opened(clock=lambda: now[0])
    with db:
        db.put(b"t", VALUE, ttl=5)
        db.put(b"p", VALUE)
        compact(store, db, expiry_clock=lambda: now[0])
        assert len(db._memtable) == 2
        now[0] += 10
        assert db.get(b"t") is None and dict(db.scan()) == {b"p": VALUE}


def test_prune_keeps_only_plain_versions_above_the_floor() -> None:
    table = Memtable()
    for seq in range(1, 11):
        table.put(b"k%02d" % seq, seq, b"v")
    assert table.prune(10, retain_bytes=1 << 20, floor_seq=4) == 4
    assert sorted(table._data) == [b"k%02d" % s for s in range(5, 11)]
    assert table.prune(10, retain_bytes=1 << 20, floor_seq=4) == 0  # no pass: nothing new
    assert table.prune(10, retain_bytes=1 << 20, floor_seq=7) == 3  # the floor rose
    assert table.prune(10) == 3  # no retention: all compacted go
    assert len(table) == 0 and table.size_bytes == 0


def test_retention_is_bounded_by_half_the_unflushed_budget() -> None:
    with pytest.raises(InvalidArgument, match="memtable_retain_bytes"):
        Settings(max_unflushed_bytes=8 << 20, memtable_retain_bytes=8 << 20)


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join([*([existing] if existing is not None else []), *operands])


def test_a_merge_after_an_ingestion_folds_over_the_ingested_value() -> None:
    # The kept compacted "a" is not the newest version once an ingestion published "X".
    store, db = opened(merge_operator=concat)
    with db:
        db.put(b"m", b"a")
        compact(store, db, merge_operator=concat)
        assert len(db._memtable) == 1
        ssts = write_ingest_ssts(store, [(b"m", b"X")], RETAIN, target_sst_bytes=1 << 20)
        publish_ingest(store, RETAIN, ssts)
        db.refresh()
        assert db.get(b"m") == b"X"
        db.merge(b"m", b"b")
        assert db.get(b"m") == b"X,b" and dict(db.scan()) == {b"m": b"X,b"}
    with Db.open(store, settings=RETAIN, merge_operator=concat) as reopened:
        assert reopened.get(b"m") == b"X,b"


def test_a_merge_over_an_uncompacted_write_older_than_an_ingestion() -> None:
    store, db = opened(merge_operator=concat)
    with db:
        db.put(b"m", b"a")
        db.flush()
        ssts = write_ingest_ssts(store, [(b"m", b"X")], RETAIN, target_sst_bytes=1 << 20)
        publish_ingest(store, RETAIN, ssts)
        db.refresh()
        db.merge(b"m", b"b")
        assert db.get(b"m") == b"X,b"
    with Db.open(store, settings=RETAIN, merge_operator=concat) as reopened:
        assert reopened.get(b"m") == b"X,b"
        compact(store, reopened, merge_operator=concat)
        assert reopened.get(b"m") == b"X,b"


def test_a_fenced_writer_keeps_nothing_compacted() -> None:
    store, old = opened()
    with old:
        old.put(b"k", b"a")
        old.put(b"x", b"1")
        compact(store, old)
        assert len(old._memtable) == 2
        with Db.open(store, settings=RETAIN) as new:
            new.put(b"k", b"b")
            new.delete(b"x")
            compact(store, new)
        old.refresh()
        assert old.get(b"k") == b"b" and old.get(b"x") is None
