"""The pure steps of releasing a clone's source (``slatepy.gc.shared``, RFC 0017)."""

from __future__ import annotations

from slatepy.gc.shared import drop_released, needed_shared, shrink_shared, to_release
from slatepy.manifest.record import ExternalDb, Manifest, Snapshot, SortedRun, SstHandle

SRC, OTHER = "file:///src", "file:///other"


def handle(sst_id: str) -> SstHandle:
    return SstHandle(sst_id, 10, b"a", b"z", 1)


def manifest(*ids: str, snapshots: tuple[Snapshot, ...] = ()) -> Manifest:
    return Manifest(
        l0=tuple(handle(i) for i in ids if i.startswith("l0")),
        sorted_runs=(SortedRun(1, tuple(handle(i) for i in ids if not i.startswith("l0"))),),
        snapshots=snapshots,
        external_dbs=(
            ExternalDb(SRC, "cp-src", 3, ("l0-a", "r-b", "r-c")),
            ExternalDb(OTHER, "cp-other", 7, ("r-d",)),
        ),
    )


def test_only_ids_an_active_manifest_references_are_needed() -> None:
    active = {4: manifest("r-b", "mine"), 6: manifest("l0-x", "mine")}
    assert needed_shared(active) == {"r-b"}
    assert to_release(active[6], needed_shared(active)) == [(OTHER, "cp-other")]


def test_shrinking_keeps_what_is_needed_or_latest_references_and_leaves_empty_records() -> None:
    latest = manifest("r-c", "mine")
    shrunk = shrink_shared(latest, {"r-b"}, decided_on=5, checked={5}, now_s=0)
    assert shrunk is not None
    assert [(e.url, e.sst_ids) for e in shrunk.external_dbs] == [(SRC, ("r-b", "r-c")), (OTHER, ())]
    assert shrink_shared(shrunk, {"r-b"}, decided_on=5, checked={5}, now_s=0) is None
    released = drop_released(shrunk, {(OTHER, "cp-other"), (SRC, "cp-src")})
    assert released is not None  # a record that still has ids is never dropped
    assert [e.url for e in released.external_dbs] == [SRC]
    assert drop_released(released, {(OTHER, "cp-other")}) is None


def test_a_snapshot_of_a_manifest_the_pass_did_not_check_stops_the_shrinking() -> None:
    held = Snapshot("s", 2, 0, kind="checkpoint")
    latest = manifest("mine", snapshots=(held,))
    assert shrink_shared(latest, set(), decided_on=5, checked={5}, now_s=0) is None
    assert shrink_shared(latest, set(), decided_on=5, checked={2, 5}, now_s=0) is not None
    expired = Snapshot("s", 2, 100)
    latest = manifest("mine", snapshots=(expired,))
    assert shrink_shared(latest, set(), decided_on=5, checked={5}, now_s=200) is not None
