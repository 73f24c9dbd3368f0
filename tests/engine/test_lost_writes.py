"""Regression tests: acknowledged writes that were lost and databases that wedged.

One test per defect of the engine's write path, fencing, sequence numbers, batches and
lifecycle; each failed on the code before its fix. Races are made deterministic with
``InterceptStore`` hooks that pause or fail a chosen request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from slatepy import CorruptionError, Db, DbReader, FencedError, Settings, WriteBatch, WritesLost
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.memtable import Memtable
from slatepy.engine.snapshot import Snapshot
from slatepy.errors import StoreUnavailable
from slatepy.format.sst import decode_sst
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend

WAIT = 10.0  # seconds any paused step may wait before the test fails instead of hanging


def with_settings(backend: Backend, **overrides: Any) -> Settings:
    fields = {f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}
    return Settings.from_dict({**fields, **overrides})


def wal_epochs(store: ObjectStore) -> dict[int, int]:
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    return {i: decode_sst(wal.read(i))[0].props.writer_epoch for i in wal.ids()}


def run_in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Start ``fn`` in a thread; the list receives its result or the exception it raised."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


class WalGate:
    """An ``InterceptStore`` hook that, once armed, holds every WAL PUT until released."""

    def __init__(self) -> None:
        self.armed = False
        self.release = threading.Event()
        self._arrived = threading.Semaphore(0)

    def __call__(self, path: str) -> None:
        if self.armed and path.startswith("wal/"):
            self._arrived.release()
            assert self.release.wait(WAIT), "a paused WAL PUT was never released"

    def wait_for(self, count: int) -> None:
        for _ in range(count):
            assert self._arrived.acquire(timeout=WAIT), "expected WAL PUTs never started"


# 1. A writer that dies during start-up must not narrow the next writer's fence.
def test_a_writer_dying_before_its_fence_does_not_narrow_the_next_fence(
    backend: Backend,
) -> None:
    gate = WalGate()
    a = Db.open(
        InterceptStore(backend.store(), gate),
        settings=with_settings(backend, max_parallel_writes=8, flush_interval=60),
    )
    gate.armed = True
    writers = [
        run_in_thread(lambda i=i: a.put(b"a%d" % i, b"from-a")) for i in range(3)
    ]  # three WAL PUTs of A in flight at once
    gate.wait_for(3)

    def die_before_fencing(path: str) -> None:
        if path.startswith("wal/"):
            raise RuntimeError("B crashes before its first fencing SST")

    with pytest.raises(RuntimeError, match="B crashes"):
        Db.open(InterceptStore(backend.store(), die_before_fencing), settings=backend.settings)
    c = Db.open(backend.target(), settings=backend.settings)  # width 1, like B
    gate.release.set()
    acknowledged = []
    for i, (thread, outcome) in enumerate(writers):
        thread.join(WAIT)
        assert outcome, "a write of A never returned"
        if outcome[0] is None:
            acknowledged.append(b"a%d" % i)
        else:
            assert isinstance(outcome[0], FencedError)
    # A's PUTs landing past a one-slot fence were acknowledged and then lost.
    for key in acknowledged:
        assert c.get(key) == b"from-a", f"acknowledged {key!r} lost"
    c.put(b"c", b"1")  # C is a working writer: no older SST sits past its fence
    c.close()
    a._crash()
    with Db.open(backend.target(), settings=backend.settings) as d:
        for key in acknowledged:
            assert d.get(key) == b"from-a"


# 2. A starting writer checks every slot it passes: three racing openers.
def test_an_older_opener_never_completes_after_a_newer_one_fenced(backend: Backend) -> None:
    w1 = Db.open(backend.target(), settings=backend.settings)
    w1.put(b"k", b"w1")
    calls = 0
    w3: list[Db] = []

    def race(path: str) -> None:
        nonlocal calls
        if not path.startswith("wal/"):
            return
        calls += 1
        if calls == 1:
            w1.put(b"x1", b"w1")  # W1 takes W2's first slot
        elif calls == 2:
            for i in range(3):  # W1 races ahead: W2 aims past it, skipping free slots
                w1.put(b"y%d" % i, b"w1")
        elif calls == 3:
            # W3 starts while W2 still has free slots behind its aim.
            w3.append(Db.open(backend.target(), settings=backend.settings))

    with pytest.raises(FencedError):
        Db.open(InterceptStore(backend.store(), race), settings=backend.settings)
    assert len(w3) == 1
    newest = w3[0]
    epochs = wal_epochs(backend.store())
    fence = min(i for i, e in epochs.items() if e == newest.epoch)
    assert all(e == newest.epoch for i, e in epochs.items() if i > fence), epochs
    assert list(epochs.values()) == sorted(epochs.values()), "epochs decrease along the WAL"
    newest.put(b"k", b"w3")  # the newest writer was not broken by an older one's SST
    with pytest.raises(FencedError):
        w1.put(b"k", b"late")
    for key, value in [(b"x1", b"w1"), (b"y2", b"w1"), (b"k", b"w3")]:
        assert newest.get(key) == value
    newest.close()
    w1._crash()


# 3. Dropping tombstones must not lower the sequence numbers a new writer starts from.
def test_a_new_writer_never_reuses_the_sequence_number_of_a_dropped_tombstone(
    backend: Backend,
) -> None:
    a = Db.open(backend.target(), settings=backend.settings)
    a.put(b"a", b"1")
    a.delete(b"b")  # the newest sequence number is a tombstone's
    reader_store_hook: list[Callable[[], None]] = []

    def before_list(prefix: str) -> None:
        if prefix.startswith("wal/") and reader_store_hook:
            reader_store_hook.pop()()

    reader = DbReader.open(
        InterceptStore(backend.store(), before_list=before_list),
        settings=with_settings(backend, reader_poll_interval=3600),
    )
    b: list[Db] = []

    def meanwhile() -> None:
        # Between the reader's manifest check and its WAL listing: compaction drops the
        # tombstone, A goes, B opens and writes.
        Compactor(
            backend.store(), settings=backend.settings, policy=CompactionPolicy(l0_trigger=1)
        ).run_until_idle()
        a.close()
        b.append(Db.open(backend.target(), settings=backend.settings))
        b[0].put(b"x", b"acknowledged")

    reader_store_hook.append(meanwhile)
    reader.refresh()  # applies B's write
    assert reader.get(b"x") == b"acknowledged"
    reader.refresh()  # adopts the compaction and prunes what it covers
    assert reader.get(b"x") == b"acknowledged", "an acknowledged write vanished"
    reader.close()
    b[0].close()


# 4. A batch is all or nothing to every reader of the writer's memtable.
def test_get_never_sees_half_a_batch(backend: Backend) -> None:
    db = Db.open(backend.target(), settings=backend.settings)
    db.write(WriteBatch().put(b"k1", b"old").put(b"k2", b"old"))
    paused, resume = threading.Event(), threading.Event()

    class PausingMemtable(Memtable):
        """Stops between the batch's two keys."""

        __slots__ = ()

        def put(
            self,
            key: bytes,
            seq: int,
            value: bytes | None,
            bases: dict[bytes, tuple[int, bytes | None]] | None = None,
        ) -> None:
            super().put(key, seq, value, bases)
            if key == b"k1" and value == b"new":
                paused.set()
                assert resume.wait(WAIT)

    db._memtable.__class__ = PausingMemtable
    # The delete keeps the batch on the entry-by-entry path (Memtable.apply) this pauses;
    # a batch of puts alone is one dict.update under the same lock (Memtable.apply_versions).
    batch = WriteBatch().put(b"k1", b"new").put(b"k2", b"new").delete(b"k3")
    writer, _ = run_in_thread(lambda: db.write(batch))
    assert paused.wait(WAIT)
    getter, seen = run_in_thread(lambda: (db.get(b"k1"), db.get(b"k2")))
    getter.join(0.5)  # with the fix the getter waits for the batch; before, it returned
    resume.set()
    writer.join(WAIT)
    getter.join(WAIT)
    assert seen[0] in [(b"old", b"old"), (b"new", b"new")], f"half a batch: {seen[0]}"
    db.close()


# 5. A reader checks a whole WAL SST before applying any of it.
def test_a_reader_applies_nothing_of_a_damaged_wal_sst(backend: Backend) -> None:
    settings = with_settings(backend, block_size=512, reader_poll_interval=3600)
    db = Db.open(backend.target(), settings=settings)
    db.put(b"before", b"1")
    reader = DbReader.open(backend.target(), settings=settings)
    batch = WriteBatch()
    for i in range(3000):  # WAL SSTs have blocks of at least 64 KiB (WAL_BLOCK_BYTES)
        batch.put(b"key%04d" % i, b"v" * 100)
    db.write(batch)
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)
    wal_id = db.next_wal_id - 1
    data = bytearray(wal.read(wal_id))
    meta, _ = decode_sst(bytes(data))
    assert len(meta.blocks) > 2
    last = meta.blocks[-1]
    data[last.offset + last.length // 2] ^= 0xFF  # damage the batch's last block
    backend.store().put(wal.path(wal_id), bytes(data))
    with pytest.raises(CorruptionError) as caught:
        reader.refresh()
    assert reader.get(b"key0000") is None, "the first blocks of a torn batch were applied"
    assert caught.value.path == wal.path(wal_id)
    assert reader.get(b"before") == b"1"
    reader.close()
    db._crash()


class FailingWal(InterceptStore):
    """Raises ``error`` on the first WAL PUT after ``armed`` is set."""

    def __init__(self, inner: ObjectStore, error: BaseException) -> None:
        super().__init__(inner, self._maybe_fail)
        self.error = error
        self.armed = False

    def _maybe_fail(self, path: str) -> None:
        if self.armed and path.startswith("wal/"):
            self.armed = False
            raise self.error


# 8. Any exception in a WAL PUT fails the pending writes instead of hanging the writer.
def test_an_unexpected_exception_in_a_wal_put_fails_writes_instead_of_hanging(
    backend: Backend,
) -> None:
    store = FailingWal(backend.store(), TypeError("a bug in the client"))
    db = Db.open(store, settings=backend.settings)
    store.armed = True
    thread, first = run_in_thread(lambda: db.put(b"k", b"v"))
    thread.join(WAIT)
    thread, second = run_in_thread(lambda: db.put(b"k2", b"v"))
    thread.join(WAIT)
    assert first and second, "a put hung after an unexpected exception in a WAL PUT"
    assert isinstance(first[0], StoreUnavailable) and not first[0].definite
    assert isinstance(first[0].__cause__, TypeError)
    assert isinstance(second[0], StoreUnavailable)  # the failure surfaces on the next call
    thread, outcome = run_in_thread(db.close)
    thread.join(WAIT)
    assert outcome, "close() hung"


# 9. close() after a failure names the unawaited writes it could not write.
def test_close_after_a_failure_reports_buffered_unawaited_writes(backend: Backend) -> None:
    gate = WalGate()
    db = Db.open(
        InterceptStore(backend.store(), gate), settings=with_settings(backend, flush_interval=60)
    )
    gate.armed = True
    thread, outcome = run_in_thread(lambda: db.put(b"awaited", b"v"))
    gate.wait_for(1)
    db.put(b"u1", b"v", await_durable=False)  # buffered behind the in-flight PUT
    db.put(b"u2", b"v", await_durable=False)
    # Fence the writer so the in-flight PUT loses its slot.
    newer = Db.open(backend.target(), settings=backend.settings)
    gate.armed = False
    gate.release.set()
    thread.join(WAIT)
    assert outcome and isinstance(outcome[0], FencedError)
    with pytest.raises(WritesLost) as caught:
        db.close()
    assert caught.value.count == 2
    assert isinstance(caught.value.__cause__, FencedError)
    assert newer.get(b"u1") is None
    newer.close()


# 12. A WAL SST missing below later ones is corruption, for writers and readers.
def test_a_missing_wal_sst_in_the_middle_is_reported(backend: Backend) -> None:
    settings = with_settings(backend, reader_poll_interval=3600, reader_gap_timeout=0)
    db = Db.open(backend.target(), settings=settings)
    db.put(b"k0", b"v")
    reader = DbReader.open(backend.target(), settings=settings)
    for i in range(1, 6):
        db.put(b"k%d" % i, b"v")
    db.close()
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)
    missing = wal.ids()[-3]
    backend.store().delete(wal.path(missing))
    manifests_before = ManifestStore(backend.store()).latest_id()
    with pytest.raises(CorruptionError, match=wal.path(missing)) as caught:
        Db.open(backend.target(), settings=settings)
    assert caught.value.path == wal.path(missing)
    assert ManifestStore(backend.store()).latest_id() == manifests_before, "open changed state"
    with pytest.raises(CorruptionError, match=wal.path(missing)):
        reader.refresh()
    fresh = DbReader.open(backend.target(), settings=settings)
    with pytest.raises(CorruptionError, match=wal.path(missing)):
        fresh.refresh()
    fresh.close()


# 13. A snapshot's WAL seal waits for a write slot: fencing counts on max_parallel_writes.
def test_a_snapshot_does_not_put_more_wal_ssts_in_flight_than_allowed(
    backend: Backend,
) -> None:
    """``Db.snapshot()`` seals the buffered WAL writes into their own SST. It wrote that SST
    at once, even with ``max_parallel_writes`` PUTs in flight already: a newer writer that
    fenced that many slots could then see an acknowledged write land past its fence."""
    gate = WalGate()
    settings = with_settings(backend, max_parallel_writes=1, flush_interval=60)
    db = Db.open(InterceptStore(backend.store(), gate), settings=settings)
    gate.armed = True
    db.put(b"first", b"1", await_durable=False)
    flushing, flushed = run_in_thread(db.flush)
    gate.wait_for(1)  # the one slot is in flight
    db.put(b"second", b"2", await_durable=False)
    snapshotting, snapshot = run_in_thread(db.snapshot)
    assert not gate._arrived.acquire(timeout=0.5), "a second WAL PUT went in flight"
    gate.release.set()
    gate.wait_for(1)  # the snapshot's seal, once the slot was free
    for thread in (flushing, snapshotting):
        thread.join(WAIT)
    assert flushed == [None]
    (snap,) = snapshot
    assert isinstance(snap, Snapshot), snap
    with snap:
        assert snap.get(b"second") == b"2"
    db.put(b"third", b"3")
    db.close()


def test_a_snapshot_whose_wal_seal_fails_raises_and_unpins(backend: Backend) -> None:
    """The seal's SST failing leaves no boundary (and a failed writer): the snapshot raises
    the failure instead of returning, and takes its pin out of the manifest again."""
    store = FailingWal(backend.store(), TypeError("a bug in the client"))
    db = Db.open(store, settings=with_settings(backend, flush_interval=60))
    db.put(b"k", b"v", await_durable=False)
    store.armed = True
    with pytest.raises(StoreUnavailable):
        db.snapshot()
    stored = ManifestStore(backend.store()).load()
    assert stored is not None and not stored.manifest.snapshots
    with pytest.raises(WritesLost):
        db.close()
