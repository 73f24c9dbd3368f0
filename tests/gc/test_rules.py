"""The GC selection rules, one protocol rule per test (pure: no store involved)."""

from __future__ import annotations

import datetime as dt

from slatepy.gc.rules import Listing, active_manifest_ids, select_garbage, spare_published
from slatepy.manifest.record import Manifest, Snapshot, SortedRun, SstHandle
from slatepy.manifest.store import MANIFEST_DIR, MANIFEST_SUFFIX
from slatepy.store.base import ObjectMeta
from slatepy.store.numbered import ID_DIGITS
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOUR = 3600.0


def manifest_path(i: int) -> str:
    return f"{MANIFEST_DIR}/{i:0{ID_DIGITS}d}{MANIFEST_SUFFIX}"


def wal_path(i: int) -> str:
    return f"{WAL_DIR}/{i:0{ID_DIGITS}d}{WAL_SUFFIX}"


def meta(path: str, age_s: float, size: int = 10) -> ObjectMeta:
    return ObjectMeta(path, size, NOW - dt.timedelta(seconds=age_s), None)


def handle(sst_id: str) -> SstHandle:
    return SstHandle(sst_id, 100, b"a", b"z", 1)


def garbage(
    listing: Listing, current_id: int, active: dict[int, Manifest], min_age: float = HOUR
) -> set[str]:
    deletions = select_garbage(
        listing,
        current_id,
        active,
        now=NOW,
        min_age=min_age,
    )
    return {d.path for d in deletions}


def test_inactive_manifests_go_current_and_newer_ones_stay() -> None:
    listing = Listing(
        [meta(manifest_path(i), 10 * HOUR) for i in (1, 2, 3, 4)], wal=[], compacted=[]
    )
    assert garbage(listing, 3, {3: Manifest()}) == {manifest_path(1), manifest_path(2)}


def test_snapshots_keep_their_manifest_until_they_expire() -> None:
    current = Manifest(
        snapshots=(
            Snapshot("live", 1, int(NOW.timestamp()) + 60),
            Snapshot("forever", 2, 0),
            Snapshot("expired", 3, int(NOW.timestamp()) - 60),
        )
    )
    listed = [(i, meta(manifest_path(i), 10 * HOUR)) for i in (1, 2, 3, 4, 5)]
    assert active_manifest_ids(5, current, listed, now=NOW, min_age=HOUR) == {1, 2, 5}


def test_recently_superseded_manifests_stay_active() -> None:
    # Manifest 3 was superseded by 4 ten seconds ago; 2 by 3 long ago.
    listed = [
        (2, meta(manifest_path(2), 5 * HOUR)),
        (3, meta(manifest_path(3), 2 * HOUR)),
        (4, meta(manifest_path(4), 10)),
    ]
    assert active_manifest_ids(4, Manifest(), listed, now=NOW, min_age=HOUR) == {3, 4}
    assert active_manifest_ids(4, Manifest(), listed, now=NOW, min_age=0) == {4}


def test_wal_below_the_lowest_active_compaction_point_goes_but_never_the_one_at_it() -> None:
    listing = Listing([], [meta(wal_path(i), 10 * HOUR) for i in range(1, 9)], [])
    active = {7: Manifest(wal_id_last_compacted=6), 5: Manifest(wal_id_last_compacted=4)}
    assert garbage(listing, 7, active) == {wal_path(1), wal_path(2), wal_path(3)}


def test_compacted_ssts_go_only_when_unreferenced_and_old_enough() -> None:
    listing = Listing(
        [],
        [],
        [
            meta("compacted/l0.sst", 10 * HOUR),
            meta("compacted/run.sst", 10 * HOUR),
            meta("compacted/snap.sst", 10 * HOUR),
            meta("compacted/dead.sst", 10 * HOUR),
            meta("compacted/in-flight.sst", 60),
        ],
    )
    current = Manifest(l0=(handle("l0"),), sorted_runs=(SortedRun(1, (handle("run"),)),))
    snapshotted = Manifest(l0=(handle("snap"),))
    assert garbage(listing, 9, {9: current, 4: snapshotted}) == {"compacted/dead.sst"}


def test_temporaries_go_once_older_than_min_age() -> None:
    listing = Listing(
        [meta("manifest/00000000000000000001.manifest.tmp", 2 * HOUR)],
        [meta("wal/x#1", 2 * HOUR), meta("wal/y#2", 30)],
        [meta("compacted/partial", 2 * HOUR)],
    )
    assert garbage(listing, 1, {1: Manifest()}) == {
        "manifest/00000000000000000001.manifest.tmp",
        "wal/x#1",
        "compacted/partial",
    }


def test_a_fence_spares_what_manifests_after_the_decision_publish() -> None:
    listing = Listing(
        [], [], [meta(f"compacted/{name}.sst", 2 * HOUR) for name in ("old", "published")]
    )
    deletions = select_garbage(listing, 3, {3: Manifest()}, now=NOW, min_age=HOUR)
    assert {d.kind for d in deletions} == {"compacted"}
    newer = Manifest(l0=(handle("published"),))  # landed while the collector was deciding
    assert [d.path for d in spare_published(deletions, [newer])] == ["compacted/old.sst"]
    assert spare_published(deletions, []) == deletions
