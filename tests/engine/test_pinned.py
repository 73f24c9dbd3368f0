"""Pinned snapshots (``slatepy.engine.pinned``): one view for many readers of its parts."""

from __future__ import annotations

import datetime as dt
import itertools
import pickle
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.pinned import pin_snapshot, release_snapshot, scan_pinned, split_points
from slatepy.errors import InvalidArgument, NotFound
from slatepy.gc import GarbageCollector
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store

OFF = Settings(compactor="off")


def fill(db: Db, first: int, n: int, value: bytes) -> None:
    batch = WriteBatch()
    for i in range(first, first + n):
        batch.put(b"k%06d" % i, value)
    db.write(batch)


def test_a_pinned_view_stays_the_same_through_writes_compaction_and_gc(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    policy = CompactionPolicy(l0_trigger=1, target_sst_bytes=32 * 1024)
    with Db.open(url, settings=OFF) as db:
        store = open_store(url)
        fill(db, 0, 3000, b"old" * 10)
        Compactor(store, settings=OFF, policy=policy).run_until_idle()
        fill(db, 2000, 2000, b"wal")  # overwrites and new keys, still in the WAL
        db.delete(b"k000001")
        pinned, manifest = pin_snapshot(store, OFF, ttl=600)
        expected = list(db.scan())
        pinned = pickle.loads(pickle.dumps(pinned))  # what a task receives
        # Afterwards: more writes, a compaction that replaces every SST, a GC far in the future
        # of everything but the snapshot's expiry.
        fill(db, 0, 4000, b"new")
        Compactor(store, settings=OFF, policy=policy).run_until_idle()
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=300)
        report = GarbageCollector(store, min_age=0, clock=lambda: later).collect()
        assert report.deletions  # the newer state's garbage went; the pinned view's did not
    assert list(scan_pinned(store, OFF, pinned)) == expected
    cuts = split_points(manifest, b"", None, max_parts=4)
    assert 1 <= len(cuts) <= 3
    bounds = [b"", *cuts, None]
    parts = [
        list(scan_pinned(store, OFF, pinned, lo or b"", hi))
        for lo, hi in itertools.pairwise(bounds)
    ]
    assert [pair for part in parts for pair in part] == expected
    # Released (or expired), the view is no longer protected: GC may take it.
    release_snapshot(store, OFF, pinned)
    stored = ManifestStore(store).load()
    assert stored is not None and all(s.id != pinned.snapshot_id for s in stored.manifest.snapshots)
    GarbageCollector(store, min_age=0, clock=lambda: later).collect()
    with pytest.raises(NotFound, match=r"pinned view of manifest .* was collected"):
        list(scan_pinned(store, OFF, pinned))


def test_split_points_follow_sst_first_keys_inside_the_range(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        fill(db, 0, 3000, b"x" * 30)
    Compactor(
        open_store(url),
        settings=OFF,
        policy=CompactionPolicy(l0_trigger=1, target_sst_bytes=16 * 1024),
    ).run_until_idle()
    stored = ManifestStore(open_store(url)).load()
    assert stored is not None
    firsts = sorted(h.first_key for h in stored.manifest.sorted_runs[0].ssts)
    assert len(firsts) >= 4
    assert split_points(stored.manifest, b"", None, max_parts=1000) == firsts[1:]
    inside = split_points(stored.manifest, firsts[1], firsts[3], max_parts=1000)
    assert inside == [firsts[2]]
    assert len(split_points(stored.manifest, b"", None, max_parts=2)) == 1
    with pytest.raises(InvalidArgument):
        split_points(stored.manifest, b"", None, max_parts=0)
    with pytest.raises(InvalidArgument):
        pin_snapshot(open_store(url), OFF, ttl=0)
