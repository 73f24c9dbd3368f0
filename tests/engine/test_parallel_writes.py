"""Parallel WAL writes: the seed's two- and three-writer timelines, step by step, and a
writer keeping several PUTs in flight for real.

The seed numbers WAL slots from 0; ours start at 1, so seed slot ``n`` is our id ``n + 1``.
"""

from __future__ import annotations

import threading
import time

import pytest

from slatepy import Db, DbReader, FencedError, Settings
from slatepy.compactor import Compactor
from slatepy.engine.fencing import Fencing, first_open_after, write_wal_sst
from slatepy.format.sst import SstBuilder, decode_sst
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore, PutMode
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend
from tests.engine.test_fencing import wal_epochs


def slot(seed_slot: int) -> int:
    return seed_slot + 1


def data_sst(epoch: int, key: bytes, seq: int) -> bytes:
    builder = SstBuilder(writer_epoch=epoch)
    builder.add(key, seq, b"from-epoch-%d" % epoch)
    return builder.finish().data


def step(wal: NumberedObjects, state: Fencing) -> Fencing:
    """One fencing attempt of ``state`` against the real store (as ``fence_wal`` does it)."""
    existing = wal.create(state.slot, SstBuilder(writer_epoch=state.epoch).finish().data)
    if existing is None:
        return state.created()
    their = decode_sst(existing)[0].props.writer_epoch
    return state.taken(their, first_open_after(wal, state.slot))


def test_seed_timeline_two_writers(backend: Backend) -> None:
    store = backend.store()
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    w2 = Fencing(epoch=2, needed=2, slot=slot(2))
    write_wal_sst(wal, slot(0), data_sst(1, b"k0", 1), 1)  # time 0
    write_wal_sst(wal, slot(1), data_sst(1, b"k1", 2), 1)  # time 1
    w2 = step(wal, w2)  # time 2: writer 2 takes slot 2
    assert w2.run == 1
    write_wal_sst(wal, slot(3), data_sst(1, b"k3", 4), 1)  # time 3: a parallel write lands
    with pytest.raises(FencedError, match="newer writer"):  # time 4: writer 1 halts
        write_wal_sst(wal, slot(2), data_sst(1, b"k2", 3), 1)
    w2 = step(wal, w2)  # time 5: slot 3 is taken by writer 1; start again at 4
    assert (w2.slot, w2.run) == (slot(4), 0)
    w2 = step(wal, w2)  # time 6
    w2 = step(wal, w2)  # time 7
    assert w2.done and w2.fence_ids == range(slot(4), slot(6))
    assert wal_epochs(store) == {
        slot(0): 1,
        slot(1): 1,
        slot(2): 2,
        slot(3): 1,
        slot(4): 2,
        slot(5): 2,
    }

    # Readers and the compactor treat writer 1's SST 3 as valid; SST 2's put failed.
    ManifestStore(store).update(lambda m, _: Manifest(writer_epoch=2, max_parallel_writes=2))
    with DbReader.open(store, settings=Settings(reader_poll_interval=3600)) as reader:
        assert dict(reader.scan()) == {
            b"k0": b"from-epoch-1",
            b"k1": b"from-epoch-1",
            b"k3": b"from-epoch-1",
        }
    compactor = Compactor(store)
    compactor.run_until_idle()
    assert compactor.last_published.manifest.wal_id_last_compacted == slot(5)
    assert compactor.last_published.manifest.l0[0].entry_count == 3


def test_seed_timeline_three_writers(backend: Backend) -> None:
    store = backend.store()
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    w2 = Fencing(epoch=2, needed=2, slot=slot(3))
    w3 = Fencing(epoch=3, needed=2, slot=slot(2))
    write_wal_sst(wal, slot(0), data_sst(1, b"k0", 1), 1)  # time 0
    write_wal_sst(wal, slot(1), data_sst(1, b"k1", 2), 1)  # time 1
    w3 = step(wal, w3)  # time 2: success
    write_wal_sst(wal, slot(3), data_sst(1, b"k3", 4), 1)  # time 3: success
    with pytest.raises(FencedError):  # time 4: writer 1 halts
        write_wal_sst(wal, slot(2), data_sst(1, b"k2", 3), 1)
    w2 = step(wal, w2)  # time 5: failure (writer 1 won slot 3)
    w3 = step(wal, w3)  # time 6: failure (writer 1 won slot 3)
    assert (w2.slot, w2.run, w3.slot, w3.run) == (slot(4), 0, slot(4), 0)
    w2 = step(wal, w2)  # time 7: success
    w3 = step(wal, w3)  # time 8: failure (writer 2 won slot 4)
    assert (w3.slot, w3.run) == (slot(5), 0)
    w3 = step(wal, w3)  # time 9: success
    with pytest.raises(FencedError):  # time 10: writer 2 finds epoch 3 in slot 5 and halts
        step(wal, w2)
    w3 = step(wal, w3)  # time 11: success; writer 3 has fenced writers 1 and 2
    assert w3.done and w3.fence_ids == range(slot(5), slot(7))
    assert wal_epochs(store) == {
        slot(0): 1,
        slot(1): 1,
        slot(2): 3,
        slot(3): 1,
        slot(4): 2,
        slot(5): 3,
        slot(6): 3,
    }


class SlowWalPuts(InterceptStore):
    """Delays WAL PUTs and records how many were in flight at once."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._now = 0
        self.peak = 0

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        if not path.startswith("wal/"):
            return super().put(path, data, mode=mode)
        with self._lock:
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            time.sleep(0.02)
            return super().put(path, data, mode=mode)
        finally:
            with self._lock:
                self._now -= 1


def test_a_writer_keeps_several_puts_in_flight_and_a_new_writer_fences_them(
    backend: Backend,
) -> None:
    settings = Settings.from_dict(
        {f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}
        | {"max_parallel_writes": 4}
    )
    store = SlowWalPuts(backend.store())
    acked: list[bytes] = []
    with Db.open(store, settings=settings) as db:

        def writer(t: int) -> None:
            for i in range(10):
                key = b"t%d-%02d" % (t, i)
                db.put(key, b"v")
                acked.append(key)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert store.peak > 1  # PUTs really overlapped
    assert len(acked) == 80
    with Db.open(backend.target(), settings=backend.settings) as db:
        assert all(db.get(key) == b"v" for key in acked)
        stored = ManifestStore(backend.store()).load()
        assert stored is not None and stored.manifest.max_parallel_writes == 1
        # The old writer had 4 PUTs in flight: the new one fenced with 4 consecutive SSTs.
        epochs = wal_epochs(backend.store())
        ours = [i for i, e in epochs.items() if e == db.epoch]
        assert ours == list(range(db.next_wal_id - 4, db.next_wal_id))
        assert sorted(epochs) == list(range(1, db.next_wal_id))  # no gaps
