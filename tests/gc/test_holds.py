"""Why GC keeps what it keeps (RFC 0017): the pure holds, their summary and their words."""

from __future__ import annotations

import datetime as dt

from slatepy.gc.describe import describe_held, describe_hold, human_bytes
from slatepy.gc.holds import Hold, HoldSummary, explain_holds, manifest_holds, summarize
from slatepy.gc.rules import (
    Listing,
    active_manifest_ids,
    checkpoint_wal_limits,
    select_garbage,
)
from slatepy.manifest.record import Manifest, Snapshot, SstHandle
from slatepy.store.base import ObjectMeta
from tests.gc.test_rules import HOUR, NOW, manifest_path, meta, wal_path


def handle(sst_id: str) -> SstHandle:
    return SstHandle(sst_id, 100, b"a", b"z", 1)


def at(offset_s: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=offset_s)


def explain(
    listing: Listing, current_id: int, by_id: dict[int, Manifest], min_age: float = HOUR
) -> tuple[dict[str, Hold], set[str], set[str]]:
    """The pass the collector makes, pure: ``({path: hold}, live paths, deleted paths)``."""
    numbered = [(int(m.path[9:29]), m) for m in listing.manifests]
    current = by_id[current_id]
    active_ids = active_manifest_ids(current_id, current, numbered, now=NOW, min_age=min_age)
    active = {i: by_id[i] for i in active_ids}
    limits = checkpoint_wal_limits(current_id, current, numbered, now=NOW, min_age=min_age)
    deletions = select_garbage(
        listing, current_id, active, now=NOW, min_age=min_age, wal_limits=limits
    )
    holders = manifest_holds(current_id, current, numbered, now=NOW, min_age=min_age)
    holds, live = explain_holds(
        listing, current_id, active, holders, deletions, now=NOW, min_age=min_age, wal_limits=limits
    )
    return {h.path: h for h in holds}, {m.path for m in live}, {d.path for d in deletions}


def test_every_listed_object_is_deleted_held_or_live_and_held_ones_say_why() -> None:
    # Manifests: 1 (old, nobody needs it), 2 (a reader's snapshot), 3 (a checkpoint without
    # expiry), 4 (superseded by 5 ten minutes ago), 5 (current).
    snapshot_expiry = int(NOW.timestamp()) + 600
    current = Manifest(
        wal_id_last_compacted=8,
        l0=(handle("live"),),
        snapshots=(
            Snapshot("reader", 2, snapshot_expiry),
            Snapshot("cp", 3, 0, kind="checkpoint", name="nightly", wal_id=6),
        ),
    )
    by_id = {
        1: Manifest(wal_id_last_compacted=1),
        2: Manifest(wal_id_last_compacted=4, l0=(handle("snap"),)),
        3: Manifest(wal_id_last_compacted=6, l0=(handle("cp"),)),
        4: Manifest(wal_id_last_compacted=7, l0=(handle("recent"),)),
        5: current,
    }
    manifest_ages = {1: 10 * HOUR, 2: 9 * HOUR, 3: 8 * HOUR, 4: 2 * HOUR, 5: 600}
    listing = Listing(
        [meta(manifest_path(i), age) for i, age in manifest_ages.items()],
        [meta(wal_path(i), 10 * HOUR) for i in range(1, 11)] + [meta("wal/x.tmp", 30)],
        [
            meta(f"compacted/{name}.sst", 10 * HOUR, size=1000)
            for name in ("live", "snap", "cp", "recent", "dead")
        ]
        + [meta("compacted/young.sst", 60, size=500)],
    )
    holds, live, deleted = explain(listing, 5, by_id)

    assert deleted == {
        manifest_path(1),
        wal_path(1),
        wal_path(2),
        wal_path(3),
        "compacted/dead.sst",
    }
    assert live == {manifest_path(5), wal_path(9), wal_path(10), "compacted/live.sst"}
    # Nothing is counted twice or forgotten.
    every = {m.path for m in (*listing.manifests, *listing.wal, *listing.compacted)}
    assert set(holds) | live | deleted == every
    assert not set(holds) & (live | deleted)

    assert {p for p, h in holds.items() if h.reason == "snapshot"} == {
        manifest_path(2),
        wal_path(4),
        wal_path(5),
        "compacted/snap.sst",
    }
    assert holds["compacted/snap.sst"].collectable_at == at(600)
    assert holds["compacted/snap.sst"].detail == "reader"
    # The checkpoint covers WAL up to its wal_id (6): 7 is manifest 4's (gc_min_age).
    assert {p for p, h in holds.items() if h.reason == "checkpoint"} == {
        manifest_path(3),
        wal_path(6),
        "compacted/cp.sst",
    }
    assert holds["compacted/cp.sst"].collectable_at is None
    assert holds["compacted/cp.sst"].detail == "cp (nightly)"
    # Manifest 4 was superseded 600 s ago (when 5 was written): an hour after that.
    assert {p for p, h in holds.items() if h.reason == "min_age"} == {
        manifest_path(4),
        wal_path(7),
        "compacted/recent.sst",
        "compacted/young.sst",
    }
    assert holds[manifest_path(4)].collectable_at == at(HOUR - 600)
    assert holds["compacted/young.sst"].collectable_at == at(HOUR - 60)
    assert holds[wal_path(8)] == Hold(
        wal_path(8), 10, "kept", "WAL SST at wal_id_last_compacted", None
    )
    assert holds["wal/x.tmp"].reason == "kept"
    assert holds["wal/x.tmp"].collectable_at == at(HOUR - 30)


def test_a_manifest_held_for_two_reasons_is_held_by_the_longer() -> None:
    # Manifest 1 was superseded a minute ago and a snapshot holds it for ten more seconds:
    # gc_min_age holds it longer.
    listed = [(1, meta(manifest_path(1), 2 * HOUR)), (2, meta(manifest_path(2), 60))]
    short = Manifest(snapshots=(Snapshot("s", 1, int(NOW.timestamp()) + 10),))
    holders = manifest_holds(2, short, listed, now=NOW, min_age=HOUR)
    assert holders[1].reason == "min_age" and holders[1].until == at(HOUR - 60)
    forever = Manifest(snapshots=(Snapshot("c", 1, 0, kind="checkpoint"),))
    holders = manifest_holds(2, forever, listed, now=NOW, min_age=HOUR)
    assert holders[1].reason == "checkpoint" and holders[1].until is None


def test_expired_snapshots_and_gc_min_age_zero_hold_nothing() -> None:
    current = Manifest(
        wal_id_last_compacted=2, snapshots=(Snapshot("gone", 1, int(NOW.timestamp()) - 1),)
    )
    listing = Listing(
        [meta(manifest_path(1), 10), meta(manifest_path(2), 5)],
        [meta(wal_path(1), 10), meta(wal_path(2), 10)],
        [meta("compacted/young.sst", 1)],
    )
    holds, live, deleted = explain(listing, 2, {1: Manifest(), 2: current}, min_age=0)
    assert list(holds) == [wal_path(2)]  # only the epoch-carrying WAL SST, deliberately
    assert deleted == {manifest_path(1), wal_path(1), "compacted/young.sst"}
    assert live == {manifest_path(2)}


def test_summary_counts_bytes_and_the_collectable_span_per_reason_and_holder() -> None:
    holds = [
        Hold("a", 100, "min_age", "superseded manifest", at(60)),
        Hold("b", 200, "min_age", "compacted WAL SST", at(600)),
        Hold("c", 300, "snapshot", "r1", at(30)),
        Hold("d", 400, "snapshot", "r2", at(90)),
        Hold("e", 500, "checkpoint", "cp", None),
        Hold("f", 600, "kept", "WAL SST at wal_id_last_compacted", None),
    ]
    assert summarize(reversed(holds)) == (
        HoldSummary("min_age", "", 2, 300, at(60), at(600)),
        HoldSummary("snapshot", "r1", 1, 300, at(30), at(30)),
        HoldSummary("snapshot", "r2", 1, 400, at(90), at(90)),
        HoldSummary("checkpoint", "cp", 1, 500, None, None, forever=1),
        HoldSummary("kept", "WAL SST at wal_id_last_compacted", 1, 600, None, None, forever=1),
    )
    assert summarize([]) == ()


def test_the_held_line_says_reason_size_and_when() -> None:
    now = dt.datetime(2026, 1, 1, 10, 0, 0, tzinfo=dt.UTC)
    soon = now + dt.timedelta(seconds=30)
    summaries = (
        HoldSummary(
            "min_age",
            "",
            24,
            24_100_000,
            now + dt.timedelta(minutes=32, seconds=5),
            now + dt.timedelta(minutes=59, seconds=40),
        ),
        HoldSummary("snapshot", "abc", 3, 3000, soon, soon),
        HoldSummary("checkpoint", "cp (nightly)", 2, 10, None, None, forever=2),
    )
    assert describe_held(summaries, now=now) == (
        "held back: 24 objects, 24.1 MB by gc_min_age (collectable from 10:32:05 UTC "
        "(in 32 min), all by 10:59:40 UTC (in 60 min)); 3 objects, 3.0 kB by snapshot abc "
        "(expires 10:00:30 UTC (in 30 s)); 2 objects, 10 B by checkpoint cp (nightly) "
        "(no expiry: delete it to release)"
    )
    assert describe_held((), now=now) == "held back: nothing"
    hold = Hold("wal/1.sst", 2048, "min_age", "compacted WAL SST", now + dt.timedelta(days=3))
    assert describe_hold(hold, now=now) == (
        "wal/1.sst  (2.0 kB, gc_min_age: compacted WAL SST, "
        "collectable 2026-01-04 10:00:00 UTC (in 3.0 days))"
    )
    assert [human_bytes(n) for n in (0, 999, 1000, 1_500_000, 7 * 10**12)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.5 MB",
        "7.0 TB",
    ]


def test_objects_spared_by_the_fence_are_kept_as_just_published() -> None:
    listing = Listing([meta(manifest_path(1), 10)], [], [meta("compacted/pub.sst", 2 * HOUR)])
    holders = manifest_holds(1, Manifest(), [(1, listing.manifests[0])], now=NOW, min_age=HOUR)
    # The pass decided to delete pub.sst, then its fence found it published: not deleted.
    holds, live = explain_holds(listing, 1, {1: Manifest()}, holders, [], now=NOW, min_age=HOUR)
    assert [(h.path, h.reason, h.detail) for h in holds] == [
        ("compacted/pub.sst", "kept", "published during the pass")
    ]
    assert [m.path for m in live] == [manifest_path(1)]
    assert isinstance(live[0], ObjectMeta)


def test_a_checkpoint_keeps_the_wal_up_to_its_own_wal_id_only() -> None:
    # Manifest 2 (wal_id_last_compacted 3) is held by a checkpoint covering WAL 3..5 only; a
    # reader's snapshot of the same view would read the WAL on, so it keeps everything.
    checkpoint = Snapshot("cp", 2, 0, kind="checkpoint", wal_id=5)
    by_id = {2: Manifest(wal_id_last_compacted=3), 4: Manifest(wal_id_last_compacted=9)}
    listing = Listing(
        [meta(manifest_path(i), age * HOUR) for i, age in ((2, 5), (3, 4), (4, 3))],
        [meta(wal_path(i), 5 * HOUR) for i in range(1, 11)],
        [],
    )
    by_id[4] = Manifest(wal_id_last_compacted=9, snapshots=(checkpoint,))
    holds, _, deleted = explain(listing, 4, by_id)
    assert deleted == {manifest_path(3), *(wal_path(i) for i in (1, 2, 6, 7, 8))}
    assert {p for p, h in holds.items() if h.reason == "checkpoint"} == {
        manifest_path(2),
        *(wal_path(i) for i in (3, 4, 5)),
    }
    reader = Snapshot("reader", 2, int(NOW.timestamp()) + 60)
    by_id[4] = Manifest(wal_id_last_compacted=9, snapshots=(checkpoint, reader))
    _, _, deleted = explain(listing, 4, by_id)
    assert deleted == {manifest_path(3), wal_path(1), wal_path(2)}


def test_an_sst_held_by_a_short_snapshot_is_collectable_only_once_old_enough() -> None:
    # Manifest 1 (its snapshot expires in 60 s) references an SST written 10 s ago: once the
    # snapshot is gone the SST is unreferenced, and still needs gc_min_age of age.
    current = Manifest(snapshots=(Snapshot("r", 1, int(NOW.timestamp()) + 60),))
    by_id = {1: Manifest(l0=(handle("fresh"),)), 2: current}
    listing = Listing(
        [meta(manifest_path(1), 5 * HOUR), meta(manifest_path(2), 2 * HOUR)],
        [],
        [meta("compacted/fresh.sst", 10)],
    )
    holds, _, _ = explain(listing, 2, by_id)
    assert holds[manifest_path(1)].collectable_at == at(60)
    assert holds["compacted/fresh.sst"].reason == "snapshot"
    assert holds["compacted/fresh.sst"].collectable_at == at(HOUR - 10)
