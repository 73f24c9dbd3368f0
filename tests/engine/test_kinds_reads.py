"""Every read form (RFC 0020) honours every entry kind (RFC 0019): reverse, limited, prefix
and batched scans, iterators with seek, snapshots and transactions see TTL'd values expire,
range tombstones delete and merge operands fold, over the memtable and compacted SSTs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slatepy import Db, Settings
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.store.base import ObjectStore
from slatepy.store.url import open_store

FAST = Settings(flush_interval=60, compactor="off")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join([existing, *operands] if existing is not None else operands)


EXPECTED = [
    (b"a1", b"plain"),
    (b"m1", b"base,x,y"),
    (b"m2", b"p,q"),
    (b"z1", b"after"),
]


@pytest.fixture(params=["memtable", "compacted", "mixed"])
def db(request: pytest.FixtureRequest) -> Iterator[tuple[Db, Clock, ObjectStore]]:
    """A database holding every kind, all in the memtable, all compacted, or spread over
    both (the versions of one key in several sources)."""
    store = open_store("memory://")
    clock = Clock()

    def compact() -> None:
        db.flush()
        Compactor(
            store,
            settings=FAST,
            policy=CompactionPolicy(l0_trigger=1),
            merge_operator=concat,
            expiry_clock=clock,
        ).run_until_idle()
        db.refresh()  # adopt the compacted state: reads now go to the SSTs

    db = Db.open(store, settings=FAST, clock=clock, merge_operator=concat)
    db.put(b"a1", b"plain")
    db.put(b"d1", b"deleted by range")
    db.put(b"d2", b"deleted by range")
    db.put(b"t1", b"expires", ttl=10)
    db.put(b"m1", b"base")
    if request.param == "mixed":
        compact()
    db.merge(b"m1", b"x")
    db.merge(b"m2", b"p")
    db.delete_range(b"d0", b"d9")
    if request.param == "mixed":
        compact()
    db.merge(b"m1", b"y")
    db.merge(b"m2", b"q")
    db.put(b"z1", b"after")
    db.put(b"t2", b"lives", ttl=1000)
    if request.param == "compacted":
        compact()
    clock.now += 20  # t1 has expired, t2 has not
    try:
        yield db, clock, store
    finally:
        db.close()


def test_scans_iterators_and_batches_agree(db: tuple[Db, Clock, ObjectStore]) -> None:
    handle, _, _ = db
    want = sorted([*EXPECTED, (b"t2", b"lives")])
    assert list(handle.scan()) == want
    assert list(handle.scan(reverse=True)) == want[::-1]
    assert list(handle.scan(limit=2)) == want[:2]
    assert list(handle.scan_prefix(b"m")) == [r for r in want if r[0].startswith(b"m")]
    assert [r for b in handle.scan_batches(batch_size=2) for r in b] == want
    it = handle.iter(reverse=True)
    it.seek(b"n")
    assert list(it) == [r for r in want[::-1] if r[0] <= b"n"]
    assert handle.get_key_value(b"d1") is None and b"t1" not in handle
    assert handle[b"m1"] == b"base,x,y"


def test_a_snapshot_keeps_its_moment(db: tuple[Db, Clock, ObjectStore]) -> None:
    handle, clock, _ = db
    with handle.snapshot() as snapshot:
        before = list(snapshot.scan())
        handle.delete_range(b"a", b"b")
        handle.merge(b"m2", b"r")
        clock.now += 2000  # t2 expires for the database, not for the snapshot
        assert list(snapshot.scan()) == before
        assert list(snapshot.scan(reverse=True)) == before[::-1]
        assert snapshot.get(b"t2") == b"lives" and snapshot.get_many([b"m2", b"d1"]) == [
            b"p,q",
            None,
        ]
    assert handle.get(b"a1") is None and handle.get(b"t2") is None
    assert handle.get(b"m2") == b"p,q,r"


def test_a_transaction_reads_and_scans_through_the_kinds(db: tuple[Db, Clock, ObjectStore]) -> None:
    handle, _, _ = db
    with handle.begin("serializable") as txn:
        assert txn.get(b"d2") is None and txn.get(b"t1") is None
        assert txn.get(b"m1") == b"base,x,y"
        rows = list(txn.scan(b"a", b"n"))
        assert rows == [r for r in EXPECTED if r[0] < b"n"]
        txn.put(b"a2", b"new")
    assert handle.get(b"a2") == b"new"


def test_a_range_delete_conflicts_with_transactions_that_wrote_or_read_under_it() -> None:
    from slatepy.errors import TransactionConflict

    with Db.open("memory://", settings=FAST) as handle:
        handle.put(b"k1", b"v")
        writer = handle.begin("snapshot")
        writer.put(b"k1", b"mine")
        reader = handle.begin("serializable")
        assert reader.get(b"k2") is None
        reader.put(b"other", b"x")
        scanner = handle.begin("serializable")
        assert list(scanner.scan(b"j", b"l")) == [(b"k1", b"v")]
        scanner.put(b"other2", b"x")
        untouched = handle.begin("serializable")
        assert untouched.get(b"z") is None
        untouched.put(b"z", b"x")
        handle.delete_range(b"k", b"l")  # after all four began
        for txn in (writer, reader, scanner):
            with pytest.raises(TransactionConflict):
                txn.commit()
        untouched.commit()
        assert handle.get(b"k1") is None and handle.get(b"z") == b"x"
