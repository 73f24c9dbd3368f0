"""Optimistic transactions (RFC 0020): own writes visible, atomic durable commits, lost
updates and (serializable) write skew prevented, a concurrent bank keeps its total, and
misuse fails with typed errors."""

from __future__ import annotations

import random
import sys
import threading
import time

import msgspec
import pytest

from slatepy import (
    ClosedError,
    Db,
    DbReader,
    InvalidArgument,
    Settings,
    TransactionConflict,
    WriteBatch,
)
from slatepy.engine.memtable import Memtable
from slatepy.engine.txn import ConflictTracker, Transaction
from slatepy.store import open_store
from tests.conftest import Backend
from tests.engine.layered import TO_RUN, compact

OFF = Settings(compactor="off", flush_interval=0.01)


def test_reads_see_own_writes_over_the_snapshot() -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"a"], db[b"b"], db[b"c"] = b"1", b"2", b"3"
        with db.begin() as txn:
            txn.put(b"a", b"10")
            txn.delete(b"b")
            txn.put(b"d", b"4")
            assert txn.get(b"a") == b"10" and txn.get(b"b") is None
            assert txn.get(b"c") == b"3" and txn.get(b"zz", b"dflt") == b"dflt"
            assert list(txn.scan()) == [(b"a", b"10"), (b"c", b"3"), (b"d", b"4")]
            assert list(txn.scan(reverse=True, limit=2)) == [(b"d", b"4"), (b"c", b"3")]
            assert db.get(b"a") == b"1"  # nothing applied before the commit
        assert dict(db.scan()) == {b"a": b"10", b"c": b"3", b"d": b"4"}


def test_committed_transactions_are_durable_and_atomic(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        txn = db.begin()
        for i in range(20):
            txn.put(b"k%02d" % i, b"v")
        txn.commit()
        with pytest.raises(RuntimeError), db.begin() as failed:
            failed.put(b"never", b"x")
            raise RuntimeError("rolled back")
    with Db.open(backend.target(), settings=backend.settings) as db:
        assert len(list(db.scan())) == 20 and b"never" not in db


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_lost_update_is_prevented(isolation: str) -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"counter"] = b"0"
        t1, t2 = db.begin(isolation), db.begin(isolation)  # type: ignore[arg-type]
        for txn in (t1, t2):
            txn.put(b"counter", b"%d" % (int(txn.get(b"counter") or b"0") + 1))
        t1.commit()
        with pytest.raises(TransactionConflict, match="run the transaction again"):
            t2.commit()
        assert db[b"counter"] == b"1"
        # A blind write by a plain put after the snapshot conflicts too.
        t3 = db.begin(isolation)  # type: ignore[arg-type]
        db[b"counter"] = b"7"
        t3.put(b"counter", b"8")
        with pytest.raises(TransactionConflict):
            t3.commit()
        assert db[b"counter"] == b"7"


def write_skew(db: Db, isolation: str) -> None:
    """Two on-call doctors each go off call if the other is still on call."""
    db[b"alice"], db[b"bob"] = b"on", b"on"
    t1, t2 = db.begin(isolation), db.begin(isolation)  # type: ignore[arg-type]
    for txn, me in ((t1, b"alice"), (t2, b"bob")):
        on_call = [k for k, v in txn.scan() if v == b"on"]
        assert len(on_call) == 2
        txn.put(me, b"off")
    t1.commit()
    t2.commit()


def test_write_skew_is_allowed_under_snapshot_isolation() -> None:
    with Db.open("memory://", settings=OFF) as db:
        write_skew(db, "snapshot")
        assert db[b"alice"] == db[b"bob"] == b"off"


def test_write_skew_is_prevented_under_serializable() -> None:
    with Db.open("memory://", settings=OFF) as db:
        with pytest.raises(TransactionConflict, match="scanned"):
            write_skew(db, "serializable")
        assert sorted([db[b"alice"], db[b"bob"]]) == [b"off", b"on"]
        # The same with point reads instead of a scan.
        db[b"alice"] = db[b"bob"] = b"on"
        t1, t2 = db.begin("serializable"), db.begin("serializable")
        for txn, me, other in ((t1, b"alice", b"bob"), (t2, b"bob", b"alice")):
            assert txn.get(other) == b"on"
            txn.put(me, b"off")
        t1.commit()
        with pytest.raises(TransactionConflict, match="read"):
            t2.commit()


def test_a_read_of_a_key_changed_after_the_snapshot_conflicts_at_once() -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"k"] = b"1"
        txn = db.begin()
        db[b"k"] = b"2"
        with pytest.raises(TransactionConflict, match="after the transaction began"):
            txn.get(b"k")
        txn.rollback()
        txn2 = db.begin()
        db.delete(b"k")
        with pytest.raises(TransactionConflict):
            list(txn2.scan())


def test_bank_transfers_from_threads_keep_the_total(backend: Backend) -> None:
    accounts = [b"acct%02d" % i for i in range(8)]
    with Db.open(backend.target(), settings=backend.settings) as db:
        with db.write_batch() as batch:
            for a in accounts:
                batch.put(a, b"100")
        conflicts = [0]
        errors: list[BaseException] = []
        deadline = time.monotonic() + 60

        def transfer(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(50):
                    src, dst = rng.sample(accounts, 2)
                    for _attempt in range(500):  # bounded retries
                        assert time.monotonic() < deadline
                        try:
                            with db.begin("serializable") as txn:
                                a, b = int(txn.get(src) or 0), int(txn.get(dst) or 0)
                                amount = rng.randint(0, min(a, 10))
                                txn.put(src, b"%d" % (a - amount))
                                txn.put(dst, b"%d" % (b + amount))
                            break
                        except TransactionConflict:
                            conflicts[0] += 1
                    else:
                        pytest.fail("a transfer never committed")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=transfer, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not errors, errors
        total = sum(int(v) for _, v in db.scan())
        assert total == 100 * len(accounts)
        assert all(int(v) >= 0 for _, v in db.scan())
        assert not db._txns.open  # every transaction ended: nothing tracked
        assert db._txns._last == {}


def test_a_transaction_begun_during_a_write_starts_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``begin()`` skips the writer's lock while no write holds it. A write caught holding
    it (its seq taken, its values not yet in the memtable) is waited for, so the snapshot
    has its values: a start taken at once would read the old value, and a commit over it
    would not conflict (a lost update)."""
    entered, release = threading.Event(), threading.Event()
    apply = Memtable.apply_versions

    def paused(
        self: Memtable, versions: dict[bytes, tuple[int, bytes | None]], payload: int | None
    ) -> None:
        entered.set()
        assert release.wait(10)
        apply(self, versions, payload)

    with Db.open("memory://") as db:
        db.put(b"k", b"old")
        monkeypatch.setattr(Memtable, "apply_versions", paused)
        batch = WriteBatch().put(b"k", b"new").put(b"j", b"1")
        writer = threading.Thread(target=db.write, args=(batch,))
        writer.start()
        assert entered.wait(10)
        begun: list[Transaction] = []
        starter = threading.Thread(target=lambda: begun.append(db.begin()))
        starter.start()
        starter.join(0.2)
        waited = starter.is_alive()
        release.set()
        writer.join(10)
        starter.join(10)
        assert waited, "begin() returned while a write held the lock"
        txn = begun[0]
        assert txn.get(b"k") == b"new"
        txn.put(b"k", b"mine")
        txn.commit()
        assert db.get(b"k") == b"mine"


def test_a_write_after_a_lock_free_begin_conflicts() -> None:
    """With no write in flight ``begin()`` takes no lock; a write that lands right after
    is still tracked against the transaction."""
    with Db.open("memory://") as db:
        db.put(b"k", b"old")
        txn = db.begin()
        db.put(b"k", b"theirs")
        txn.put(b"k", b"mine")
        with pytest.raises(TransactionConflict):
            txn.commit()
        assert db.get(b"k") == b"theirs"


def test_misuse_is_typed() -> None:
    db = Db.open("memory://", settings=OFF)
    txn = db.begin()
    txn.put(b"a", b"1")
    txn.commit()
    with pytest.raises(InvalidArgument, match="was committed; start a new one"):
        txn.commit()
    with pytest.raises(InvalidArgument, match="was committed"):
        txn.put(b"b", b"2")
    with pytest.raises(InvalidArgument, match="cannot be rolled back"):
        txn.rollback()
    rolled = db.begin()
    rolled.rollback()
    rolled.rollback()
    with pytest.raises(InvalidArgument, match="rolled back"):
        rolled.get(b"a")
    with pytest.raises(InvalidArgument, match="isolation"):
        db.begin("read-committed")  # type: ignore[arg-type]
    open_txn = db.begin()
    db.close()
    with pytest.raises(ClosedError):
        open_txn.get(b"a")
    with pytest.raises(ClosedError):
        db.begin()


def test_the_tracker_is_bounded_and_forgets_when_idle() -> None:
    tracker = ConflictTracker(max_keys=10)
    old = tracker.begin(0)
    young = tracker.begin(100)
    for seq in range(2, 60, 2):
        tracker.record([(b"k%d" % seq, b"v")], seq)
    assert len(tracker._last) <= 10 and tracker.horizon > 0  # old records dropped
    tracker.end(old)
    assert all(s > 100 for s in tracker._last.values())  # only what `young` needs
    tracker.end(young)
    assert not tracker.open and tracker._last == {} and tracker.horizon == 0


def test_a_transaction_older_than_the_horizon_conflicts() -> None:
    with Db.open("memory://", settings=OFF) as db:
        db._txns = ConflictTracker(max_keys=4)
        txn = db.begin()
        txn.put(b"mine", b"1")
        for i in range(10):
            db.put(b"k%d" % i, b"v", await_durable=False)
        with pytest.raises(TransactionConflict, match="too many keys"):
            txn.commit()


def test_a_delete_compacted_away_after_the_snapshot_still_conflicts() -> None:
    store = open_store("memory://")
    released = Settings(compactor="off", flush_interval=0.01, memtable_retain_bytes=0)
    with Db.open(store, settings=released) as db:  # nothing compacted kept in memory
        db[b"k"] = b"1"
        compact(store, OFF, TO_RUN, db)
        txn = db.begin()
        del db[b"k"]
        compact(store, OFF, TO_RUN, db)  # the bottom run drops the tombstone
        assert db._version(b"k") is None  # no version left to show the delete
        with pytest.raises(TransactionConflict):
            txn.get(b"k")


def test_an_unawaited_commit_is_visible_at_once_and_durable_at_the_flush(
    backend: Backend,
) -> None:
    idle = msgspec.structs.replace(backend.settings, flush_interval=60)  # no tick flushes it
    with Db.open(backend.target(), settings=idle) as db:
        db[b"a"] = b"1"
        puts = db.metrics.requests("put")
        with db.begin() as txn:
            txn.put(b"a", b"%d" % (int(txn.get(b"a") or b"0") + 1))
            for i in range(10):
                txn.put(b"k%d" % i, b"v")
            txn.commit(await_durable=False)
        assert db[b"a"] == b"2" and len(list(db.scan(b"k"))) == 10  # visible at once
        assert db.metrics.requests("put") == puts  # nothing written yet
        with DbReader.open(backend.target(), settings=idle) as reader:
            assert reader.get(b"a") == b"1"  # other processes see only the WAL
        db.flush()
        assert db.metrics.requests("put") == puts + 1  # the whole transaction in one WAL SST
        db._crash()
    with Db.open(backend.target(), settings=idle) as db:
        assert db[b"a"] == b"2" and len(list(db.scan(b"k"))) == 10
        db.begin().commit(await_durable=False)  # no writes: nothing to do
        txn = db.begin()
        txn.put(b"b", b"3")
        txn.commit(await_durable=False)
    with Db.open(backend.target(), settings=idle) as db:  # close() flushed it
        assert db[b"b"] == b"3"


def test_a_crash_before_the_flush_loses_the_unawaited_transaction_whole() -> None:
    store = open_store("memory://")
    idle = Settings(compactor="off", flush_interval=60)
    db = Db.open(store, settings=idle)
    db[b"durable"] = b"1"
    txn = db.begin()
    for i in range(10):
        txn.put(b"k%d" % i, b"v")
    txn.commit(await_durable=False)
    db._crash()
    with Db.open(store, settings=idle) as db:
        assert db[b"durable"] == b"1" and list(db.scan(b"k")) == []


def test_crashes_at_any_moment_keep_each_unawaited_transaction_whole() -> None:
    """Unawaited commits while another thread seals WAL generations as fast as it can (the
    GIL switching every microsecond), then a crash: after recovery each transaction is all
    there or not at all. A commit reaching the WAL as several generations shows up here."""
    rng = random.Random(16)
    idle = Settings(compactor="off", flush_interval=60)  # only the flusher thread seals
    deadline = time.monotonic() + 20
    partial: list[int] = []
    survived = lost = 0
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _round in range(4):
            store = open_store("memory://")
            db = Db.open(store, settings=idle)
            stop = threading.Event()

            def flusher(db: Db = db, stop: threading.Event = stop) -> None:
                while not stop.is_set() and time.monotonic() < deadline:
                    db.flush()

            thread = threading.Thread(target=flusher)
            thread.start()
            crash_after = rng.randint(50, 150)
            for t in range(crash_after):
                txn = db.begin()
                txn.put(b"last", b"%d" % t)
                for j in range(8):
                    txn.put(b"t%04d/%d" % (t, j), b"%d" % t)
                txn.commit(await_durable=False)
            stop.set()
            thread.join(timeout=10)
            for t in range(crash_after, crash_after + 5):  # these stay in the buffer
                txn = db.begin()
                txn.put(b"t%04d/0" % t, b"lost")
                txn.put(b"t%04d/1" % t, b"lost")
                txn.commit(await_durable=False)
            db._crash()
            with Db.open(store, settings=idle) as db:
                rows = dict(db.scan(b"t"))
                last = db.get(b"last")
                for t in range(crash_after):
                    present = sum(b"t%04d/%d" % (t, j) in rows for j in range(8))
                    if present not in (0, 8):
                        partial.append(t)
                    survived += present == 8
                lost += sum(
                    b"lost" not in (rows.get(b"t%04d/0" % t), rows.get(b"t%04d/1" % t))
                    for t in range(crash_after, crash_after + 5)
                )
                if last is not None:  # the newest surviving transaction is whole
                    assert all(b"t%04d/%d" % (int(last), j) in rows for j in range(8))
    finally:
        sys.setswitchinterval(switch)
    assert partial == []
    assert survived > 0 and lost == 20  # flushed ones came back, the buffered ones did not


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_unawaited_commits_still_conflict(isolation: str) -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"counter"] = b"0"
        t1, t2 = db.begin(isolation), db.begin(isolation)  # type: ignore[arg-type]
        for txn in (t1, t2):
            txn.put(b"counter", b"%d" % (int(txn.get(b"counter") or b"0") + 1))
        t1.commit(await_durable=False)
        with pytest.raises(TransactionConflict, match="run the transaction again"):
            t2.commit(await_durable=False)
        assert db[b"counter"] == b"1"
        t3 = db.begin(isolation)  # type: ignore[arg-type]
        t3.put(b"counter", b"9")
        t4 = db.begin(isolation)  # type: ignore[arg-type]
        t4.put(b"other", b"x")
        t4.commit(await_durable=False)  # disjoint keys: no conflict
        t3.commit(await_durable=False)
        assert db[b"counter"] == b"9" and db[b"other"] == b"x"
