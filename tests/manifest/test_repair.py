"""The doctor's pure repair planning and its two manifest transitions (RFC 0012)."""

from __future__ import annotations

import pytest

from slatepy.errors import FencedError
from slatepy.manifest.record import Manifest, Snapshot, SortedRun, SstHandle
from slatepy.manifest.repair import (
    Damage,
    Survey,
    Unrepairable,
    WalSst,
    claim,
    finish,
    plan_repair,
    replan_wal,
)
from slatepy.manifest.repair_report import losses


def wal(i: int, state: str = "ok", seq: int | None = None) -> WalSst:
    seq = i if seq is None else seq
    return WalSst(i, f"wal/{i}", state, epoch=1, entries=1, min_seq=seq, max_seq=seq)  # type: ignore[arg-type]


def handle(name: str, max_seq: int = 3) -> SstHandle:
    return SstHandle(name, 100, b"a", b"z", 5, max_seq)


BASE = Manifest(
    writer_epoch=4,
    compactor_epoch=2,
    wal_id_last_compacted=10,
    wal_id_last_seen=10,
    l0=(handle("l0a"),),
    sorted_runs=(SortedRun(1, (handle("r1"), handle("r2"))),),
)


def survey(
    *,
    damage: tuple[Damage, ...] = (),
    slots: tuple[WalSst, ...] = (),
    latest: int = 7,
    max_wal_epoch: int = 4,
) -> Survey:
    return Survey("memory://", tuple(range(5, latest + 1)), 7, BASE, damage, slots, max_wal_epoch)


def test_nothing_to_repair() -> None:
    assert plan_repair(survey(slots=(wal(11), wal(12)))) is None


def test_an_older_damaged_manifest_needs_no_repair() -> None:
    old = Damage("manifest", "manifest/5", "checksum mismatch", 5)
    assert plan_repair(survey(damage=(old,))) is None


def test_no_intact_manifest_is_unrepairable() -> None:
    bad = Damage("manifest", "manifest/1", "checksum mismatch", 1)
    with pytest.raises(Unrepairable):
        plan_repair(Survey("memory://", (1,), None, None, (bad,)))


def test_the_wal_is_cut_before_its_first_bad_sst() -> None:
    slots = (wal(11), wal(12), wal(13, "damaged"), wal(14), WalSst(15, "wal/15", "missing"))
    bad = Damage("wal", "wal/13", "checksum mismatch", 13)
    plan = plan_repair(survey(damage=(bad,), slots=slots))
    assert plan is not None
    assert plan.wal_cut == 13
    assert [w.id for w in plan.wal_kept] == [11, 12]
    assert [w.id for w in plan.wal_lost] == [13, 14, 15]
    assert plan.seq_floor == 14  # the given-up SSTs' sequence numbers are never reused
    text = "\n".join(losses(plan, survey(damage=(bad,), slots=slots)))
    assert "wal/13: 1 entry, seq 13..13" in text and "[checksum mismatch]" in text
    assert "wal/14: 1 entry" in text and "intact, but after the cut" in text


def test_a_pending_slot_is_not_a_cut() -> None:
    """A narrow gap may be a write in flight: the repair fills it, it does not cut there."""
    plan = plan_repair(survey(slots=(wal(11), WalSst(12, "wal/12", "pending"), wal(13))))
    assert plan is None


def test_epochs_clear_anything_the_lost_manifests_could_hold() -> None:
    """Manifests 8..10 are lost: each update raises an epoch by at most one, so they hold at
    most 4 + 3; a WAL SST shows a writer at 9 got as far as writing."""
    lost = tuple(Damage("manifest", f"manifest/{i}", "truncated", i) for i in (8, 9, 10))
    plan = plan_repair(survey(damage=lost, latest=10, max_wal_epoch=9))
    assert plan is not None
    assert plan.lost_manifests == (8, 9, 10)
    assert plan.writer_epoch == 9 + 3 + 1
    assert plan.compactor_epoch == 2 + 3 + 1
    assert plan.base_id == 7 and plan.latest_id == 10


def test_claim_then_finish_drops_damaged_ssts_and_moves_the_wal_past_the_cut() -> None:
    slots = (wal(11), wal(12, "damaged"))
    damage = (
        Damage("wal", "wal/12", "checksum mismatch", 12),
        Damage("compacted", "compacted/r1.sst", "missing", "r1", missing=True),
    )
    plan = plan_repair(survey(damage=damage, slots=slots))
    assert plan is not None
    snapshot = Snapshot("s", 8, 0)
    claimed = claim(BASE, plan, snapshot=snapshot, now_s=0)
    assert (claimed.writer_epoch, claimed.compactor_epoch) == (
        plan.writer_epoch,
        plan.compactor_epoch,
    )
    assert claimed.snapshots == (snapshot,)
    new = handle("new", max_seq=11)
    done = finish(claimed, plan, snapshot_id="s", new_l0=(new,), fence_end=14)
    assert [h.id for h in done.l0] == ["new", "l0a"]
    assert [[h.id for h in r.ssts] for r in done.sorted_runs] == [["r2"]]
    assert done.wal_id_last_compacted == 14 and done.wal_id_last_seen == 14
    assert done.snapshots == ()
    assert done.last_compacted_seq >= 12


def test_finish_refuses_when_someone_opened_meanwhile() -> None:
    slots = (wal(11, "damaged"),)
    plan = plan_repair(survey(damage=(Damage("wal", "wal/11", "bad", 11),), slots=slots))
    assert plan is not None
    claimed = claim(BASE, plan, snapshot=Snapshot("s", 8, 0), now_s=0)
    newer = claimed.with_writer_epoch(plan.writer_epoch + 1)
    with pytest.raises(FencedError):
        finish(newer, plan, snapshot_id="s", new_l0=(), fence_end=12)


def test_replan_counts_what_landed_before_the_fence() -> None:
    slots = (wal(11), wal(12, "damaged"))
    plan = plan_repair(survey(damage=(Damage("wal", "wal/12", "bad", 12),), slots=slots))
    assert plan is not None
    final = replan_wal(plan, (*slots, wal(13, seq=40)))
    assert [w.id for w in final.wal_lost] == [12, 13]
    assert final.seq_floor == 40
