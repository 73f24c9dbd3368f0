"""Writer fencing: the seed's timelines reproduced deterministically."""

from __future__ import annotations

import pytest

from slatepy import Db, FencedError
from slatepy.engine.fencing import Conflict, empty_sst, fence_wal, resolve_conflict, write_wal_sst
from slatepy.format.sst import SstBuilder, decode_sst
from slatepy.store import MetricsStore, ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend


def wal_epochs(store: ObjectStore) -> dict[int, int]:
    """WAL id -> writer epoch of the SST there."""
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    return {i: decode_sst(wal.read(i))[0].props.writer_epoch for i in wal.ids()}


def no_newer_writer(width: int) -> None:
    """A ``verify`` for ``fence_wal`` when the test has no newer writer in play."""


def once_before_wal_put(action):  # type: ignore[no-untyped-def]
    """A hook that runs ``action`` before the first WAL put it sees, then stays quiet."""
    fired = False

    def hook(path: str) -> None:
        nonlocal fired
        if path.startswith("wal/") and not fired:
            fired = True
            action()

    return hook


def test_outcome_decision() -> None:
    assert resolve_conflict(our_epoch=2, their_epoch=1) is Conflict.TRY_NEXT
    assert resolve_conflict(our_epoch=2, their_epoch=2) is Conflict.ILLEGAL
    assert resolve_conflict(our_epoch=2, their_epoch=3) is Conflict.FENCED


def test_new_writer_fences_the_old_one(backend: Backend) -> None:
    """Seed outcome 1: writer 2's fence lands; writer 1's next write loses and halts."""
    db1 = Db.open(backend.target(), settings=backend.settings)
    db1.put(b"a", b"1")
    db1.put(b"b", b"1")
    db2 = Db.open(backend.target(), settings=backend.settings)
    assert db2.epoch == db1.epoch + 1
    fence_id = db2.next_wal_id - 1
    with pytest.raises(FencedError):
        db1.put(b"c", b"from-zombie")
    with pytest.raises(FencedError):  # and every later write too
        db1.put(b"d", b"from-zombie", await_durable=False)
    db2.put(b"e", b"2")
    db2.close()
    db1.close()  # closing a fenced writer does not raise: nothing it acknowledged is lost
    epochs = wal_epochs(backend.store())
    assert epochs[fence_id] == db2.epoch
    assert all(epoch == db2.epoch for wal_id, epoch in epochs.items() if wal_id >= fence_id)
    with Db.open(backend.target(), settings=backend.settings) as db3:
        assert db3.get(b"a") == b"1" and db3.get(b"e") == b"2"
        assert db3.get(b"c") is None and db3.get(b"d") is None


def test_unawaited_writes_of_a_fenced_writer_are_reported_at_flush(backend: Backend) -> None:
    db1 = Db.open(backend.target(), settings=backend.settings)
    Db.open(backend.target(), settings=backend.settings).close()
    db1.put(b"k", b"v", await_durable=False)  # buffered: the fence is not known yet
    with pytest.raises(FencedError):
        db1.flush()
    with pytest.raises(FencedError):
        db1.put(b"k2", b"v")
    db1.close()


def test_older_writer_takes_the_fence_slot(backend: Backend) -> None:
    """Seed outcome 2: writer 1 writes the slot writer 2 wanted; writer 2 moves on."""
    db1 = Db.open(backend.target(), settings=backend.settings)
    db1.put(b"a", b"1")
    slot = db1.next_wal_id
    store = InterceptStore(
        backend.store(), once_before_wal_put(lambda: db1.put(b"late", b"from-writer-1"))
    )
    db2 = Db.open(store, settings=backend.settings)
    assert db2.next_wal_id - 1 == slot + 1  # fenced at the next id
    epochs = wal_epochs(backend.store())
    assert epochs[slot] == db1.epoch and epochs[slot + 1] == db2.epoch
    # Writer 1's write landed before the fence and was acknowledged, so writer 2 has it.
    assert db2.get(b"late") == b"from-writer-1"
    with pytest.raises(FencedError):
        db1.put(b"b", b"2")
    db1.close()
    db2.close()


def test_newer_writer_takes_the_fence_slot(backend: Backend) -> None:
    """Seed outcome 4: writer 3 fences first at the slot writer 2 wanted; writer 2 halts."""
    db1 = Db.open(backend.target(), settings=backend.settings)
    db1.put(b"a", b"1")
    slot = db1.next_wal_id
    opened: list[Db] = []
    store = InterceptStore(
        backend.store(),
        once_before_wal_put(
            lambda: opened.append(Db.open(backend.target(), settings=backend.settings))
        ),
    )
    with pytest.raises(FencedError, match="newer writer"):
        Db.open(store, settings=backend.settings)
    db3 = opened[0]
    epochs = wal_epochs(backend.store())
    assert epochs[slot] == db3.epoch == db1.epoch + 2
    with pytest.raises(FencedError):
        db1.put(b"b", b"2")
    db3.put(b"c", b"3")
    assert db3.get(b"a") == b"1"
    db1.close()
    db3.close()


def test_same_epoch_in_the_slot_is_illegal(backend: Backend) -> None:
    """Seed outcome 3: never happens with transactional epochs; if it does, halt."""
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)
    wal.create(1, SstBuilder(writer_epoch=5).add_all([(b"k", 1, b"v")]).finish().data)
    with pytest.raises(FencedError, match="same epoch"):
        fence_wal(wal, 1, 5, 1, verify=no_newer_writer)


def test_running_writer_does_not_skip_an_older_epoch(backend: Backend) -> None:
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)
    wal.create(1, empty_sst(1))
    with pytest.raises(FencedError):
        write_wal_sst(wal, 1, empty_sst(2), 2)
    assert fence_wal(wal, 1, 2, 1, verify=no_newer_writer) == range(2, 3)  # a new writer does


def test_retry_of_a_landed_write_is_success_not_a_conflict(backend: Backend) -> None:
    wal = NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX)
    data = empty_sst(4)
    assert write_wal_sst(wal, 1, data, 4) == 1
    assert write_wal_sst(wal, 1, data, 4) == 1  # our own bytes are already there


def test_fencing_catches_up_with_a_fast_old_writer(backend: Backend) -> None:
    """An old writer filling many slots while we fence costs one extra round, not one per slot."""
    db1 = Db.open(backend.target(), settings=backend.settings)
    slot = db1.next_wal_id

    def old_writer_races_ahead() -> None:
        for i in range(30):
            db1.put(b"old-%02d" % i, b"x")

    store = MetricsStore(
        InterceptStore(backend.store(), once_before_wal_put(old_writer_races_ahead))
    )
    db2 = Db.open(store, settings=backend.settings)
    assert db2.next_wal_id - 1 == slot + 30
    assert store.metrics.requests("put") - 2 <= 2  # two manifest writes, at most two fence tries
    assert db2.get(b"old-29") == b"x"
    db1.close()
    db2.close()
