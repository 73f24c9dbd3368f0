"""Compaction keeps up with a sustained write load: the L0 count stays bounded (issue 33).

Sustained means the compactor finds new WAL every time it plans: here a writer's batch lands
before each compaction, deterministically (the in-process compactor's timing would make it
a matter of luck). Planning the WAL first alone would never merge L0 then.
"""

from __future__ import annotations

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.compactor.planner import WalToL0
from slatepy.errors import CorruptionError
from slatepy.manifest import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path

ROUNDS = 40


def test_the_l0_count_stays_bounded_while_writes_keep_coming() -> None:
    store = open_store("memory://")
    policy = CompactionPolicy()
    with Db.open(store, settings=Settings(compactor="off")) as db:
        compactor = Compactor(store, policy=policy)
        manifests = ManifestStore(store)
        counts = []
        for round_ in range(ROUNDS):
            batch = WriteBatch()
            for i in range(100):
                batch.put(b"key%06d" % (i * ROUNDS + round_), b"v%d" % round_)
            db.write(batch)  # one WAL SST: there is always new WAL when the compactor plans
            assert compactor.run_once() is not None
            stored = manifests.load()
            assert stored is not None
            counts.append(len(stored.manifest.l0))
        # A WalToL0 of one small WAL SST adds one L0 SST.
        assert max(counts) <= policy.l0_max
        assert any(c < counts[i] for i, c in enumerate(counts[1:])), counts  # L0 was merged
    with Db.open(store, settings=Settings(compactor="off")) as db:
        for round_ in range(ROUNDS):
            assert db.get(b"key%06d" % (7 * ROUNDS + round_)) == b"v%d" % round_


def test_an_l0_merge_that_keeps_failing_does_not_hold_the_wal() -> None:
    """At ``l0_max`` the L0 merge comes before the WAL; one that fails (here a damaged L0
    SST) must not hold the WAL, and with it every write (the memtable stalls at
    ``max_unflushed_bytes`` until the WAL is compacted): after the k-th failed merge in a row
    the WAL goes first for 2^(k-1) plans, then the merge is tried again, and fails again,
    naming the object."""
    store = open_store("memory://")
    policy = CompactionPolicy(l0_trigger=2, l0_max=2)
    manifests = ManifestStore(store)
    with Db.open(store, settings=Settings(compactor="off")) as db:
        compactor = Compactor(store, policy=policy)
        for round_ in range(2):  # two L0 SSTs: L0 at l0_max
            db.put(b"key%d" % round_, b"v" * 100)
            assert isinstance(compactor.run_once(), WalToL0)
        stored = manifests.load()
        assert stored is not None and len(stored.manifest.l0) == 2
        damaged = compacted_path(stored.manifest.l0[0].id)
        data = bytearray(store.get(damaged))
        data[10] ^= 0xFF  # inside the first data block: its checksum fails
        store.delete(damaged)
        store.put(damaged, bytes(data))
        for failures in range(1, 5):
            db.put(b"later%d" % failures, b"w")  # new WAL every time the compactor plans
            with pytest.raises(CorruptionError) as caught:
                compactor.run_once()  # the L0 merge
            assert damaged in str(caught.value)
            for _ in range(2 ** (failures - 1)):  # then the WAL: 1, 2, 4, 8 times
                db.put(b"more", b"w")
                before = manifests.load()
                assert before is not None
                assert isinstance(compactor.run_once(), WalToL0)
                after = manifests.load()
                assert after is not None
                assert after.manifest.wal_id_last_compacted > before.manifest.wal_id_last_compacted
        assert db.get(b"later4") == b"w"
