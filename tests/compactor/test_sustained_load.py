"""Compaction keeps up with a sustained write load: the L0 count stays bounded (issue 33).

Sustained means the compactor finds new WAL every time it plans: here a writer's batch lands
before each compaction, deterministically (the in-process compactor's timing would make it
a matter of luck). Planning the WAL first alone would never merge L0 then.
"""

from __future__ import annotations

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.manifest import ManifestStore
from slatepy.store import open_store

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
