"""The pure GC and rollup rules (RFC 0015 §4.3, §10)."""

from __future__ import annotations

import msgspec
import pytest

from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.state.gc_rules import (
    ClaimGc,
    CompleteGc,
    claim_gc,
    complete_gc,
    deletable_parts,
    deletable_rollups,
    gc_due,
    live_part_keys,
    rollup_due,
    seqno_since,
    truncation_seqno,
)
from slatepy.persist.state.records import CriticalReader, LeasedReader, State
from tests.persist.state_kit import (
    SETTINGS,
    append,
    commit,
    hollow_runs,
    initial,
    noop,
    refused,
    rollup_ref,
    with_writer,
)

HOUR = 3_600_000


def at(seqno: int, **changes: object) -> State:
    return msgspec.structs.replace(initial(), seqno=seqno, walltime_ms=seqno, **changes)


def test_seqno_since_is_the_oldest_leased_reader_seqno() -> None:
    assert seqno_since(at(40)) == 40
    readers = {"a": LeasedReader(12, 0, 0, 1), "b": LeasedReader(30, 0, 0, 1)}
    critical = {"c": CriticalReader(0)}
    assert seqno_since(at(40, leased_readers=readers, critical_readers=critical)) == 12


def test_gc_due_after_gc_min_versions() -> None:
    settings = PersistSettings(gc_min_versions=10)
    assert not gc_due(at(19, last_gc_seqno=10), settings)
    assert gc_due(at(20, last_gc_seqno=10), settings)


def test_rollup_due_when_diff_bytes_reach_the_rollup_size() -> None:
    settings = PersistSettings(rollup_min_diffs=16, rollup_min_bytes=4096)
    assert not rollup_due(0, 10_000, 15, settings)  # too few diffs
    assert not rollup_due(0, 4095, 16, settings)  # too few bytes
    assert rollup_due(0, 4096, 16, settings)
    assert not rollup_due(50_000, 40_000, 100, settings)  # a large state rolls up less often
    assert rollup_due(50_000, 50_000, 100, settings)


def test_truncation_point_is_the_newest_rollup_a_reader_no_longer_needs() -> None:
    rollups = {s: rollup_ref(s) for s in (3, 9, 20)}
    readers = {"r": LeasedReader(15, 0, 0, 1)}
    state = at(30, rollups=rollups, leased_readers=readers)
    assert truncation_seqno(state) == 9
    assert truncation_seqno(state, not_after=8) == 3
    assert truncation_seqno(state, not_after=2) is None
    assert truncation_seqno(at(30)) is None


def test_live_parts_are_those_of_every_retained_state() -> None:
    one = append(with_writer(initial()), 0, 1, runs=hollow_runs("part/w1/a.sst", 5000))
    two = append(one, 1, 2, runs=hollow_runs("part/w1/b.sst", 3000))
    assert live_part_keys([one]) == {"part/w1/a.sst"}
    assert live_part_keys([one, two]) == {"part/w1/a.sst", "part/w1/b.sst"}


def test_deletable_parts_are_unreferenced_and_older_than_the_batch_lease() -> None:
    now = 10 * HOUR
    listed = [
        ("part/w/live.sst", 0),
        ("part/w/old.sst", now - HOUR - 1),
        ("part/w/young.sst", now - HOUR + 1),
    ]
    assert deletable_parts(listed, {"part/w/live.sst"}, now, SETTINGS) == ["part/w/old.sst"]


def test_deletable_rollups() -> None:
    now = 10 * HOUR
    state = at(50, rollups={10: rollup_ref(10), 20: rollup_ref(20)})
    stray_old = msgspec.structs.replace(rollup_ref(30), key=rollup_ref(30).key.replace("0", "1"))
    listed = [
        (rollup_ref(5).key, now),  # below the truncation point
        (rollup_ref(10).key, now),  # referenced, below the truncation point
        (rollup_ref(20).key, 0),  # referenced, kept
        (rollup_ref(30).key, now),  # unreferenced but young: an add_rollup in flight
        (stray_old.key, now - HOUR - 1),  # unreferenced and old
        ("rollup/junk", 0),  # not a rollup key
    ]
    assert deletable_rollups(state, listed, 20, now, SETTINGS) == [
        rollup_ref(5).key,
        rollup_ref(10).key,
        stray_old.key,
    ]
    assert deletable_rollups(state, listed, None, now, SETTINGS) == [stray_old.key]


def test_claim_gc_fences_at_the_new_seqno() -> None:
    state = with_writer(initial())
    change = commit(state, claim_gc, ClaimGc("w1"), now=5000)
    assert change.result == state.seqno + 1 == change.state.seqno
    claim = change.state.active_gc
    assert claim is not None and (claim.claimant, claim.seqno, claim.started_ms) == (
        "w1",
        change.result,
        5000,
    )


def test_claim_gc_waits_for_a_young_claim_then_takes_it_over() -> None:
    state = commit(with_writer(initial()), claim_gc, ClaimGc("w1"), now=5000).state
    young = 5000 + 5 * SETTINGS.merge_lease_ms - 1
    assert noop(state, claim_gc, ClaimGc("w2"), now=young) == 0
    change = commit(state, claim_gc, ClaimGc("w2"), now=young + 1)
    assert change.state.active_gc is not None and change.state.active_gc.claimant == "w2"


def gc_state() -> State:
    state = with_writer(initial())
    return msgspec.structs.replace(
        state,
        seqno=40,
        walltime_ms=40,
        rollups={s: rollup_ref(s) for s in (3, 9, 20)},
    )


def test_complete_gc_forgets_rollups_below_the_truncation_point() -> None:
    state = commit(gc_state(), claim_gc, ClaimGc("w1")).state
    change = commit(state, complete_gc, CompleteGc("w1", 35, 9))
    assert sorted(change.state.rollups) == [9, 20]
    assert change.state.last_gc_seqno == 35 and change.state.active_gc is None


def test_complete_gc_leaves_a_claim_that_took_over() -> None:
    state = commit(gc_state(), claim_gc, ClaimGc("w2")).state
    change = commit(state, complete_gc, CompleteGc("w1", 35, None))
    assert change.state.active_gc == state.active_gc and change.state.last_gc_seqno == 35


def test_complete_gc_with_nothing_to_change_is_a_no_op() -> None:
    state = commit(gc_state(), complete_gc, CompleteGc("w1", 35, 9)).state
    assert noop(state, complete_gc, CompleteGc("w1", 30, 9)) is None


@pytest.mark.parametrize(
    ("seqno_since", "truncated_to"),
    [(99, None), (10, 20), (35, 21)],
    ids=["since-from-the-future", "beyond-seqno-since", "no-rollup-at-or-after"],
)
def test_complete_gc_refuses(seqno_since: int, truncated_to: int | None) -> None:
    state = msgspec.structs.replace(gc_state(), rollups={3: rollup_ref(3), 9: rollup_ref(9)})
    error = refused(state, complete_gc, CompleteGc("w1", seqno_since, truncated_to))
    assert isinstance(error, UsageError)
