"""Compaction outputs are cut at ``target_sst_bytes`` whatever the plan (RFC 0011).

A WalToL0 over a large WAL tail writes several L0 SSTs with disjoint key ranges instead of
one SST the size of the tail built in memory; reads and the next L0ToRun treat them like any
other L0 SSTs.
"""

from __future__ import annotations

from itertools import pairwise

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.compactor.planner import WalToL0
from slatepy.store import open_store

QUIET = Settings(flush_interval=60, block_size=512, compactor="off")
POLICY = CompactionPolicy(l0_trigger=100, max_wal_ssts=1000, target_sst_bytes=8 * 1024)


def write(db: Db, first: int, count: int, tag: bytes) -> None:
    batch = WriteBatch()
    for i in range(first, first + count):
        batch.put(b"k%05d" % i, tag * 20)
    db.write(batch)


def test_a_large_wal_to_l0_writes_several_disjoint_l0_ssts() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=QUIET) as db:
        for first in range(0, 2000, 200):  # older values everywhere
            write(db, first, 200, b"a")
        compactor = Compactor(store, settings=QUIET, policy=POLICY)
        assert isinstance(compactor.run_once(), WalToL0)
        old_l0 = compactor.last_published.manifest.l0
        assert len(old_l0) > 3
        for first in range(500, 1500, 250):  # newer values over the middle
            write(db, first, 250, b"b")
        assert isinstance(compactor.run_once(), WalToL0)
        l0 = compactor.last_published.manifest.l0
        new_l0 = l0[: len(l0) - len(old_l0)]
        assert l0[len(new_l0) :] == old_l0  # the newer outputs come first
        for ssts in (old_l0, new_l0):
            assert all(h.object_size < 2 * POLICY.target_sst_bytes for h in ssts)
            # Disjoint, increasing key ranges: a key is in at most one of one plan's outputs.
            assert all(a.last_key < b.first_key for a, b in pairwise(ssts))
        assert sum(h.entry_count for h in new_l0) == 1000

    def expected(i: int) -> bytes:
        return (b"b" if 500 <= i < 1500 else b"a") * 20

    with Db.open(store, settings=QUIET) as db:  # the reads come from the L0 SSTs now
        assert db.replayed_ssts == 0
        for i in range(0, 2000, 7):
            assert db.get(b"k%05d" % i) == expected(i)
        assert list(db.scan()) == [(b"k%05d" % i, expected(i)) for i in range(2000)]

    merge = Compactor(
        store, settings=QUIET, policy=CompactionPolicy(l0_trigger=2, target_sst_bytes=8 * 1024)
    )
    merge.run_until_idle()  # the reopen's fencing WAL SSTs, then all of L0 into a run
    manifest = merge.last_published.manifest
    assert manifest.l0 == () and len(manifest.sorted_runs) == 1
    with Db.open(store, settings=QUIET) as db:
        assert list(db.scan()) == [(b"k%05d" % i, expected(i)) for i in range(2000)]
        assert db.get(b"k00777") == expected(777) and db.get(b"k00100") == expected(100)
