"""An outsider's attack on the engine's read truth (RFC 0026, addendum): features that are
tested alone, met together. Each test here failed on the code before its fix, or records an
attack that found nothing (named in the RFC's addendum)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import pytest

from slatepy import Db, DbReader, InvalidArgument, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.engine.wal_reader import WalReader
from slatepy.errors import StoreUnavailable, WriteStalled
from slatepy.store.url import open_store
from slatepy.testing.intercept import InterceptStore
from tests.attack_engine.model_run import SETTINGS, TO_L0, Clock, concat, run
from tests.conftest import make_backend


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_transaction_judges_expiry_as_of_its_start(isolation: str) -> None:
    """A transaction reads its snapshot: a TTL'd value live when it began stays live for
    its gets and its scans, as for ``db.snapshot()`` (RFC 0026 §5: one view, one clock);
    it read the value, then None, in one transaction that then committed."""
    clock = Clock()
    with Db.open("memory://", settings=SETTINGS, clock=clock, merge_operator=concat) as db:
        db.put(b"t", b"live", ttl=5)
        db.put(b"u", b"plain")
        txn = db.begin(isolation)  # type: ignore[arg-type]
        assert txn.get(b"t") == b"live"
        clock.now += 10  # expires for the database, not for the transaction
        assert db.get(b"t") is None
        assert txn.get(b"t") == b"live"
        assert list(txn.scan()) == [(b"t", b"live"), (b"u", b"plain")]
        assert list(txn.scan(reverse=True)) == [(b"u", b"plain"), (b"t", b"live")]
        txn.put(b"u", b"seen " + (txn.get(b"t") or b"nothing"))
        txn.commit()
        assert db.get(b"u") == b"seen live" and db.get(b"t") is None
        later = db.begin(isolation)  # type: ignore[arg-type]
        assert later.get(b"t") is None and list(later.scan()) == [(b"u", b"seen live")]
        later.rollback()


@pytest.mark.parametrize(
    ("name", "seed"), [("file", 3), ("file", 11), pytest.param("s3", 5, marks=pytest.mark.s3)]
)
def test_every_read_form_agrees_with_a_model_through_kinds_and_maintenance(
    request: pytest.FixtureRequest, tmp_path: Path, name: str, seed: int
) -> None:
    """Random puts, TTL'd puts, deletes, range deletes, merges and mixed batches between
    ticks, flushes, compactions, reopens and GC passes; get, get_many, bounded scans both
    ways with limits, prefix scans, iterators with seek, snapshots, checkpoints,
    transactions, a reader and an iterator held across compaction and GC all agree with a
    dict model at every step (tests/attack_engine/model_run.py). Found nothing on its own
    (60 seeds x 300 steps were run once while writing it); kept as a guard."""
    backend = make_backend(name, request, tmp_path)
    settings = msgspec.structs.replace(backend.settings, flush_interval=60, gc_min_age=3600)
    assert run(backend.url, seed, steps=120, seconds=6, settings=settings) > 0


def refusing(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    """A merge operator with a bug: it raises on one operand and returns an int on another."""
    if b"bad" in operands:
        raise ValueError("this operator refuses b'bad'")
    if b"int" in operands:
        return len(operands)  # type: ignore[return-value]
    return b",".join([existing, *operands] if existing is not None else operands)


@pytest.mark.parametrize("buffered", [False, True], ids=["base-flushed", "base-in-wal-buffer"])
def test_a_write_whose_merge_operator_fails_is_not_made(tmp_path: Path, buffered: bool) -> None:
    """A merge the operator fails on (it raises, or returns no bytes) fails its write whole:
    not visible, not in the WAL. It was in the WAL (a write reported failed became durable,
    and the next ``Db.open`` replayed it into the operator and failed, for good), and the
    batch's other writes stayed visible (half a batch). ``buffered``: the base is still in
    the WAL's open generation, which then calls the operator too."""
    url = tmp_path.as_uri()
    with Db.open(url, settings=SETTINGS, merge_operator=refusing) as db:
        db.put(b"k", b"base", await_durable=not buffered)
        db.put(b"j", b"base", await_durable=not buffered)
        with pytest.raises(ValueError, match="refuses"):
            db.merge(b"k", b"bad", await_durable=not buffered)
        with pytest.raises(InvalidArgument, match="must return bytes"):
            db.merge(b"j", b"int", await_durable=not buffered)
        batch = WriteBatch().put(b"a", b"1").merge(b"k", b"ok").merge(b"k", b"bad")
        with pytest.raises(ValueError, match="refuses"):
            db.write(batch, await_durable=not buffered)
        batch = WriteBatch().delete_range(b"j", b"k").put(b"b", b"2").merge(b"k", b"bad")
        with pytest.raises(ValueError, match="refuses"):
            db.write(batch, await_durable=not buffered)
        want = {b"j": b"base", b"k": b"base"}
        assert dict(db.scan()) == want and db.get_many([b"a", b"b", b"j"]) == [None, None, b"base"]
        db.merge(b"k", b"fine")  # the writer goes on
        db.put(b"z", b"after")
        want = {b"j": b"base", b"k": b"base,fine", b"z": b"after"}
        assert dict(db.scan()) == want
    with Db.open(url, settings=SETTINGS, merge_operator=refusing) as db:
        assert dict(db.scan()) == want


def test_a_merge_operator_failing_in_compaction_fails_clearly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Operands with no base are stacked without calling the operator; a bottom compaction
    then applies them to nothing, and this operator raises. The in-process compactor's
    thread died of it (an uncaught ValueError: compaction and GC stopped for good), and a
    writer past ``max_unflushed_bytes`` then stalled for ``write_stall_timeout`` to fail with
    "is a compactor running?". Now the loop survives (logged, retried), a read of the key
    raises ``InvalidArgument`` naming it, and the failing L0 merge does not hold the WAL:
    writes go on (RFC 0006, stop 41)."""
    settings = Settings(
        flush_interval=0.05,
        compaction_interval=0.05,
        flush_bytes=20_000,
        max_unflushed_bytes=40_000,
        write_stall_timeout=10,
        gc_min_age=3600,
    )
    with Db.open(tmp_path, settings=settings, merge_operator=refusing) as db:
        db.merge(b"k", b"bad")  # over nothing: stacked, the operator not called
        with pytest.raises(InvalidArgument, match=r"raised ValueError for key b'k'") as read:
            db.get(b"k")
        assert isinstance(read.value.__cause__, ValueError)
        for i in range(3_000):  # 30 times max_unflushed_bytes: the WAL must be compacted
            db.put(b"x%05d" % i, b"v" * 100, await_durable=False)
        db.flush()
        deadline = time.monotonic() + 20
        while "merge operator raised ValueError for key b'k'" not in caplog.text:
            assert time.monotonic() < deadline, "no L0 merge failed"
            time.sleep(0.05)
        compactor = db._compactor
        assert compactor is not None and compactor._thread.is_alive()
        assert db.get(b"x02999") == b"v" * 100


def test_a_writer_stalled_on_failing_compaction_says_what_fails(tmp_path: Path) -> None:
    """A writer past ``max_unflushed_bytes`` whose in-process compactor's passes fail (here
    every read of a WAL SST) stalls, then fails saying what the passes fail with, the error
    its cause, where it used to ask "is a compactor running?"."""
    failing = threading.Event()

    def before_read(path: str) -> None:
        if failing.is_set() and path.startswith("wal/"):
            raise StoreUnavailable(f"injected: read of {path} refused", path=path, definite=True)

    store = InterceptStore(open_store(tmp_path.as_uri()), before_read=before_read)
    settings = Settings(
        flush_interval=0.05,
        compaction_interval=0.05,
        flush_bytes=20_000,
        max_unflushed_bytes=40_000,
        write_stall_timeout=1.5,
        request_attempts=1,
    )
    with Db.open(store, settings=settings) as db:
        failing.set()
        deadline = time.monotonic() + 20
        with pytest.raises(WriteStalled, match=r"passes fail: .*injected: read of wal/") as stall:
            for i in range(10_000):
                assert time.monotonic() < deadline, "the writer neither stalled nor compacted"
                db.put(b"x%05d" % i, b"v" * 100, await_durable=False)
        assert isinstance(stall.value.__cause__, StoreUnavailable)
        failing.clear()


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_write_that_failed_conflicts_with_no_transaction(isolation: str) -> None:
    """A write its merge operator failed was recorded for the open transactions before it
    failed: a transaction that read or wrote its key conflicted with a write never made."""
    with Db.open("memory://", settings=SETTINGS, merge_operator=refusing) as db:
        db.put(b"k", b"base")
        txn = db.begin(isolation)  # type: ignore[arg-type]
        assert txn.get(b"k") == b"base"
        with pytest.raises(InvalidArgument):
            db.merge(b"k", b"bad")
        with pytest.raises(InvalidArgument):
            db.write(WriteBatch().put(b"k", b"other").merge(b"k", b"bad"))
        txn.put(b"k", b"mine")
        txn.commit()
        assert db.get(b"k") == b"mine"


def test_a_view_judges_a_merge_base_expiry_by_its_own_clock() -> None:
    """Operands over a TTL'd base fold at read time; whether the base is live was judged by
    the database's running clock, not the view's stopped one, so a held snapshot (writer's
    or reader's), an iterator and a transaction read ``base,x`` and, once the base expired,
    ``x``: a view that changed with no write (RFC 0026 §5, one view, one clock)."""
    store = open_store("memory://")
    clock = Clock()
    with Db.open(store, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.put(b"k", b"base", ttl=5)
        db.flush()
        Compactor(
            store, settings=SETTINGS, policy=TO_L0, merge_operator=concat, expiry_clock=clock
        ).run_until_idle()
        db.refresh()  # the base in an SST, the operand in the memtable: folded when read
        db.merge(b"k", b"x")
        reader = DbReader.open(store, settings=SETTINGS, merge_operator=concat, clock=clock)
        held = [db.snapshot(), reader.snapshot()]
        iterator, reverse = db.iter(), db.iter(reverse=True)
        txn = db.begin("serializable")
        assert txn.get(b"k") == b"base,x" and db.get(b"k") == b"base,x"
        clock.now += 10  # the base expires: for the database, not for the views
        assert db.get(b"k") == b"x"
        for snapshot in held:
            assert snapshot.get(b"k") == b"base,x"
            assert snapshot.get_many([b"k"]) == [b"base,x"]
            assert list(snapshot.scan()) == [(b"k", b"base,x")]
            assert list(snapshot.scan(reverse=True, limit=1)) == [(b"k", b"base,x")]
            snapshot.close()
        assert list(iterator) == [(b"k", b"base,x")] == list(reverse)
        assert txn.get(b"k") == b"base,x" and list(txn.scan()) == [(b"k", b"base,x")]
        txn.rollback()
        reader.close()


def test_a_replica_seeded_from_a_snapshot_keeps_its_ttls(tmp_path: Path) -> None:
    """docs/engine.md starts a replica by copying a snapshot, then following the change feed
    from ``snapshot.seq + 1``. A copy made from ``scan()`` loses the TTLs (a scan yields the
    values alone), so the replica kept values the source had expired: it showed what the
    database no longer held. ``items_with_expiry()`` gives each value's expiry, so the copy
    keeps it."""
    url = tmp_path.as_uri()
    clock = Clock()
    with (
        Db.open(url, settings=SETTINGS, clock=clock, merge_operator=concat) as db,
        Db.open("memory://", settings=SETTINGS, clock=clock, merge_operator=concat) as replica,
    ):
        db.put(b"a", b"short", ttl=5)
        db.put(b"b", b"plain")
        db.put(b"c", b"long", ttl=50)
        db.merge(b"m", b"x")
        db.put(b"z", b"gone", ttl=1)
        clock.now += 2  # z has expired: it is not copied
        with db.snapshot() as snapshot:
            copied = list(snapshot.items_with_expiry())
            assert [(k, v) for k, v, _ in copied] == list(snapshot.scan())
            batch = WriteBatch()
            now_ms = int(clock() * 1000)
            for key, value, expire_at_ms in copied:
                ttl = None if expire_at_ms is None else (expire_at_ms - now_ms - 0.5) / 1000
                batch.put(key, value, ttl=ttl)
            replica.write(batch)
            seq = snapshot.seq
        taken = db.items_with_expiry()  # its view is taken here, as scan()'s
        db.put(b"d", b"after", ttl=10)
        db.merge(b"m", b"y")
        assert [row[:2] for row in taken] == [(k, v) for k, v, _ in copied]
        for records in WalReader(url, settings=SETTINGS).iter_ssts(seq + 1):
            batch = WriteBatch()
            for record in records:
                record.add_to(batch, now_ms=int(clock() * 1000))
            replica.write(batch)
        for step in (0, 4, 10, 60):
            clock.now += step
            assert list(replica.scan()) == list(db.scan()), f"{step} s later"
        assert list(replica.scan()) == [(b"b", b"plain"), (b"m", b"x,y")]
        assert list(db.items_with_expiry()) == [(b"b", b"plain", None), (b"m", b"x,y", None)]
