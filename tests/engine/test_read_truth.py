"""A read never shows what was not written (issue 29, RFC 0026): merges over ingestions,
torn batches, reads after a failed write, snapshots of a failed writer, one clock per
iterator view, fork, the failed writer's error, settings an external compactor follows."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from slatepy import Db, DbReader, FencedError, Settings, WriteBatch
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.engine.memtable import Memtable, Version
from slatepy.errors import StoreUnavailable
from slatepy.format.envelope import seal
from slatepy.format.sst import decode_sst
from slatepy.manifest.record import MANIFEST_MAGIC, Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.testing.intercept import InterceptStore
from tests.manifest.test_manifest_versions import version_1_fields

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


def test_a_merge_made_before_the_writer_saw_an_ingestion_folds_over_it_once_seen() -> None:
    # The writer merged over "old" not knowing of the ingestion (published before the
    # merge, so older than it): once it adopts that view it reads what replay, compaction and
    # readers read. A second merge after the refresh stacks on the corrected fold.
    store = open_store("memory://")
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        db.put(b"k", b"old")
        db.flush()
        ingest(store, [(b"k", b"ING")])
        db.merge(b"k", b"x")
        with DbReader.open(store, merge_operator=concat) as reader:
            assert reader.get(b"k") == b"ING,x"
        db.refresh()
        assert db.get(b"k") == b"ING,x"
        db.merge(b"k", b"y")
        assert db.get(b"k") == b"ING,x,y" and dict(db.scan()) == {b"k": b"ING,x,y"}
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        assert db.get(b"k") == b"ING,x,y"
    wal_compact(store)
    with DbReader.open(store, merge_operator=concat) as reader:
        assert reader.get(b"k") == b"ING,x,y"


def test_merge_operands_older_than_an_ingestion_are_not_applied_over_it() -> None:
    # "a" is merged before the ingestion, "b" after it: the key reads ING,b everywhere
    # (the writer once it has seen the ingestion), never ING,a,b.
    store = open_store("memory://")
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        db.merge(b"k", b"a")
        ingest(store, [(b"k", b"ING")])
        db.merge(b"k", b"b")
        with DbReader.open(store, merge_operator=concat) as reader:
            assert reader.get(b"k") == b"ING,b"
        db.refresh()
        assert db.get(b"k") == b"ING,b" and dict(db.scan()) == {b"k": b"ING,b"}
    with Db.open(store, settings=OFF, merge_operator=concat) as db:
        assert db.get(b"k") == b"ING,b"
    wal_compact(store, CompactionPolicy(l0_trigger=100))  # WAL -> L0 only
    with DbReader.open(store, merge_operator=concat) as reader:
        assert reader._view.l0 and reader.get(b"k") == b"ING,b"


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


class DiskFull(InterceptStore):
    """A ``file://`` store whose disk is full while ``full`` is set: WAL PUTs fail as the
    local store reports ENOSPC (``StoreUnavailable`` over the ``OSError``)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner, self._maybe_fail)
        self.full = False

    def _maybe_fail(self, path: str) -> None:
        if self.full and path.startswith("wal/"):
            cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            error = StoreUnavailable(
                f"store request for {path} on {self.url} failed: {cause}",
                path=path,
                definite=False,
            )
            raise error from cause


def _every_read(db: Db) -> list[Callable[[], object]]:
    return [
        lambda: db.get(b"k"),
        lambda: db.get_many([b"k"]),
        lambda: db.get_key_value(b"k"),
        lambda: list(db.scan()),
        lambda: list(db.iter(reverse=True)),
        lambda: db.begin().get(b"k"),
        db.snapshot,
    ]


def test_a_write_that_failed_on_a_full_disk_is_never_read_back(tmp_path: Path) -> None:
    settings = Settings(flush_interval=60, compactor="off", wal_write_attempts=1)
    store = DiskFull(open_store(tmp_path.as_uri()))
    db = Db.open(store, settings=settings)
    db.put(b"kept", b"1")
    store.full = True
    with pytest.raises(StoreUnavailable, match="No space left"):
        db.put(b"k", b"lost")
    store.full = False  # space freed: the handle is still dead, and says so, not ENOSPC
    for read in _every_read(db):
        with pytest.raises(StoreUnavailable, match="can no longer write") as caught:
            read()
        assert "open the database again" in str(caught.value)
    with pytest.raises(StoreUnavailable, match=r"^this writer of .* can no longer write"):
        db.put(b"k2", b"v")
    db.close()
    with Db.open(tmp_path.as_uri(), settings=settings) as reopened:
        assert reopened.get(b"k") is None and reopened.get(b"kept") == b"1"


def test_a_fenced_writer_never_reads_back_what_it_could_not_write() -> None:
    store = open_store("memory://")
    db = Db.open(store, settings=OFF)
    db.put(b"k", b"first")
    with Db.open(store, settings=OFF) as newer:
        newer.put(b"k", b"newer")
        with pytest.raises(FencedError):
            db.put(b"k", b"fenced")
        for read in _every_read(db):
            with pytest.raises(FencedError, match="open the database again"):
                read()
        assert newer.get(b"k") == b"newer"
    db.close()


def test_a_snapshot_of_a_writer_whose_wal_write_failed_raises() -> None:
    # The unawaited write is in the memtable, never in the WAL: a replica seeded from a
    # snapshot holding it would diverge from the database.
    store = DiskFull(open_store("memory://"))
    db = Db.open(store, settings=Settings(flush_interval=60, compactor="off", wal_write_attempts=1))
    db.put(b"k", b"v", await_durable=False)
    store.full = True
    with pytest.raises(StoreUnavailable):
        db.flush()
    with pytest.raises(StoreUnavailable, match="can no longer write"):
        db.snapshot()
    db.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "scan",
    ["iter", "iter_reverse", "scan_reverse", "scan_limit", "scan_prefix", "batches", "txn"],
)
def test_an_iterator_judges_expiry_with_one_clock(scan: str) -> None:
    # Taken before k1 expires, read after: every row is as of when the view was taken.
    clock = Clock()
    with Db.open("memory://", settings=OFF, clock=clock) as db:
        for i in range(3):
            db.put(b"k%d" % i, b"v", ttl=10)
        views: dict[str, Callable[[], object]] = {
            "iter": db.iter,
            "iter_reverse": lambda: db.iter(reverse=True),
            "scan_reverse": lambda: db.scan(reverse=True),
            "scan_limit": lambda: db.scan(limit=10),
            "scan_prefix": lambda: db.scan_prefix(b"k"),
            "batches": lambda: db.scan_batches(batch_size=1),
            "txn": lambda: db.begin().scan(),
        }
        rows = views[scan]()
        clock.now += 60
        got = [r for batch in rows for r in batch] if scan == "batches" else list(rows)  # type: ignore[attr-defined]
        assert sorted(got) == [(b"k%d" % i, b"v") for i in range(3)]


def test_a_seek_answers_as_the_iterator_did_and_both_directions_agree() -> None:
    clock = Clock()
    with Db.open("memory://", settings=OFF, clock=clock) as db:
        db.put(b"a", b"1", ttl=10)
        db.put(b"b", b"2")
        forward, backward = db.iter(), db.iter(reverse=True)
        assert next(forward) == (b"a", b"1")
        clock.now += 60
        assert list(backward) == [(b"b", b"2"), (b"a", b"1")]
        forward.seek(b"a")
        assert list(forward) == [(b"a", b"1"), (b"b", b"2")]
        assert list(db.iter()) == [(b"b", b"2")]  # a new view: expired now


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_database_opened_before_a_fork_raises_in_the_child(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Db.open(url, settings=Settings(compactor="off")) as db, DbReader.open(url) as reader:
        db.put(b"k", b"parent")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what a put and gets do, never run pytest's exit
            try:
                outcome = []
                calls = (
                    lambda: db.put(b"k", b"child"),
                    lambda: db.get(b"k"),
                    lambda: reader.get(b"k"),
                )
                for call in calls:
                    try:
                        call()
                        outcome.append("returned")
                    except Exception as exc:
                        outcome.append(f"{type(exc).__name__}: {exc}")
                db.close()
                reader.close()  # not the parent's snapshot: the parent's reader goes on
                os.write(write, "\n".join(outcome).encode())
            finally:
                os._exit(0)
        os.close(write)
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the child hung on a database opened before the fork")
            time.sleep(0.02)
        with os.fdopen(read) as pipe:
            lines = pipe.read().splitlines()
        assert len(lines) == 3
        for line in lines:
            assert line.startswith("ClosedError: ") and "before os.fork()" in line
            assert "after the fork" in line
        db.put(b"k2", b"v")  # the parent's handles are unaffected
        assert db.get(b"k") == b"parent"
        reader.refresh()
        assert reader.get(b"k2") == b"v"


def _compressions(store: ObjectStore) -> set[str]:
    """The compression of every compacted SST's blocks."""
    return {
        decode_sst(store.get(entry.path))[0].props.compression for entry in store.list("compacted/")
    }


def test_slatepy_compact_follows_the_writers_compression(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Db.open(url, settings=Settings(compactor="off", compression="zstd")) as db:
        for i in range(200):
            db.put(b"k%04d" % i, b"compressible " * 20)
    assert main(["compact", url]) == 0  # this process's settings: compression "none"
    store = open_store(url)
    assert _compressions(store) == {"zstd"}
    with Db.open(url, settings=Settings(compactor="off", compression="zstd")) as db:
        assert db.get(b"k0007") == b"compressible " * 20
        db.put(b"more", b"compressible " * 20)
    told = Compactor(store, settings=Settings(), sst_options="settings")  # told otherwise
    told.run_until_idle()
    assert "none" in _compressions(store)


def test_a_manifest_without_sst_options_reads_and_compacts_by_settings() -> None:
    # A manifest written before the field existed (older slatepy): decodes with None, and a
    # compactor then builds by its own settings, as it always did.
    store = open_store("memory://")
    with Db.open(store, settings=Settings(compactor="off", compression="zstd")) as db:
        db.put(b"k", b"v" * 1000)
    manifests = ManifestStore(store)
    stored = manifests.load()
    assert stored is not None and stored.manifest.sst_options is not None
    fields = version_1_fields(stored.manifest)  # as the older slatepy wrote it
    del fields["sst_options"]
    old = seal(MANIFEST_MAGIC, 1, msgspec.msgpack.encode(fields))
    decoded = Manifest.decode(old)
    assert decoded.sst_options is None and decoded.writer_epoch == stored.manifest.writer_epoch
    compactor = Compactor(store, settings=Settings(compression="lz4"))
    assert compactor.sst_options(decoded)["compression"] == "lz4"
    assert compactor.sst_options(stored.manifest)["compression"] == "zstd"


def test_a_snapshot_taken_while_an_earlier_wal_write_is_in_flight_waits_for_it() -> None:
    # The unawaited write's SST is in flight when the snapshot copies the memtable; it then
    # fails: the snapshot must not come back holding the write the database lost.
    held, release = threading.Event(), threading.Event()

    def fail_first_wal_put(path: str) -> None:
        if path.startswith("wal/") and not held.is_set():
            held.set()
            assert release.wait(10)
            raise StoreUnavailable(f"injected: {path} failed", path=path, definite=True)

    store = InterceptStore(open_store("memory://"))
    settings = Settings(
        flush_interval=60, compactor="off", max_parallel_writes=2, wal_write_attempts=1
    )
    db = Db.open(store, settings=settings)
    store.before_put = fail_first_wal_put
    db.put(b"lost", b"v", await_durable=False)
    outcomes: dict[str, object] = {}

    def run(name: str, call: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                outcomes[name] = call()
            except Exception as exc:
                outcomes[name] = exc

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    flushing = run("flush", db.flush)
    assert held.wait(10)
    snapshotting = run("snapshot", db.snapshot)
    snapshotting.join(0.3)  # before the fix it returned here, holding b"lost"
    release.set()
    flushing.join(10)
    snapshotting.join(10)
    assert isinstance(outcomes["flush"], StoreUnavailable)
    assert isinstance(outcomes["snapshot"], StoreUnavailable), outcomes["snapshot"]
    db.close()
