"""The spine: levels, which spans merge, claims and their takeover, and merge application
(RFC 0015 §8.1)."""

from __future__ import annotations

import itertools
import math

import pytest

from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.state.append import CompareAndAppend, compare_and_append
from slatepy.persist.state.outcome import MergeReq
from slatepy.persist.state.records import Desc, HollowBatch, State
from slatepy.persist.state.spine import (
    SMALL_FANOUT,
    SMALL_LEVELS,
    Applied,
    ApplyMerge,
    ClaimMerges,
    NotApplied,
    RenewMerge,
    apply_merge,
    claim_merges,
    find_merge,
    level,
    renew_merge,
)
from slatepy.persist.state.transitions import (
    CompareAndDowngradeSince,
    Finalize,
    RegisterCriticalReader,
    compare_and_downgrade_since,
    finalize,
    register_critical_reader,
)
from tests.persist.state_kit import (
    SETTINGS,
    append,
    commit,
    hollow_runs,
    initial,
    noop,
    refused,
    with_writer,
)


@pytest.mark.parametrize(
    ("updates", "expected"),
    [
        (0, 0),
        (1, 0),
        (7, 0),
        (8, 1),
        (63, 1),
        (64, 2),
        (511, 2),
        (512, 3),
        (1023, 3),
        (1024, 4),
        (2047, 4),
        (2048, 5),
        (4096, 6),
        (1 << 30, 24),
    ],
)
def test_level(updates: int, expected: int) -> None:
    assert level(updates) == expected


def batches(*sizes: int) -> list[HollowBatch]:
    return [
        HollowBatch(i + 1, Desc(i, i + 1), hollow_runs(f"part/w/{i}.sst", n) if n else (), n)
        for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize(
    ("sizes", "claimed", "span"),
    [
        ((5000, 2000, 100), set(), None),  # levels 6, 4, 2: strictly decreasing
        ((5000, 1500, 1500), set(), (1, 3)),  # the newest equal pair of large batches
        ((100, 5000), set(), (0, 2)),  # older level below the newer
        ((2000, 100, 100, 3000), set(), (0, 4)),  # extends over levels <= the newer's
        ((9000, 100, 100, 3000), set(), (1, 4)),  # ... but not over a higher one
        ((1500, 1500, 1500), {3}, (0, 2)),  # claimed batches are skipped
        ((1500, 1500, 1500), {2}, None),
        ((100,), set(), None),
        ((5000, 100, 100), set(), None),  # small batches wait for 8 of a level
        ((5000, *[1] * 7), set(), None),
        ((5000, *[1] * 8), set(), (1, 9)),
        ((60, *[1] * 8), set(), (1, 9)),  # 8 level-0 batches, not the level-1 one
        ((*[9] * 7, 1), set(), None),  # one level 0 batch behind seven of level 1
        ((*[9] * 7, 9), set(), (0, 8)),
        ((0, 100, 0), set(), (0, 2)),  # a metadata merge needs no 8 (one non-empty)
    ],
)
def test_find_merge(
    sizes: tuple[int, ...], claimed: set[int], span: tuple[int, int] | None
) -> None:
    assert find_merge(batches(*sizes), claimed) == span


def run_compactor(state: State, requests: tuple[MergeReq, ...], claimant: str) -> State:
    """Apply every request as a compactor would, outputs as big as their inputs; keep
    applying what the applications claim."""
    pending = list(requests)
    while pending:
        request = pending.pop(0)
        total = sum(batch.updates for batch in request.inputs)
        args = ApplyMerge(
            merge_id=request.merge_id,
            inputs=tuple(batch.id for batch in request.inputs),
            runs=hollow_runs(f"part/{claimant}/c{request.merge_id}.sst", total) if total else (),
            since=0,
            claimant=claimant,
        )
        change = commit(state, apply_merge, args)
        assert isinstance(change.result, Applied)
        state = change.state
        pending.extend(change.maintenance.merges)
    return state


def test_large_levels_strictly_decrease_and_the_trace_stays_logarithmic() -> None:
    state = with_writer(initial())
    total = 0
    for t in range(200):
        size = 300 + 37 * (t % 11)
        total += size
        args = CompareAndAppend("w1", f"t{t}", t, t + 1, hollow_runs(f"part/w1/{t}.sst", size))
        change = commit(state, compare_and_append, args)
        state = run_compactor(change.state, change.maintenance.merges, "w1")
        assert not state.merges
        levels = [level(batch.updates) for batch in state.trace]
        large = [n for n in levels if n >= SMALL_LEVELS]
        assert all(a > b for a, b in itertools.pairwise(large)), levels
        assert len(levels) - len(large) < SMALL_FANOUT * SMALL_LEVELS, levels
    assert sum(batch.updates for batch in state.trace) == total
    assert len(state.trace) <= math.log2(total / 1024) + 2 + SMALL_FANOUT * SMALL_LEVELS


def test_small_appends_merge_eight_at_a_time_and_the_trace_stays_short() -> None:
    """Single-update appends: one merge per 7 appends or so (not one each), about 3
    rewrites per update up to 1,024, at most 7 small batches per level."""
    state = with_writer(initial())
    merges = rewritten = 0
    for t in range(3000):
        args = CompareAndAppend("w1", f"t{t}", t, t + 1, hollow_runs(f"part/w1/{t}.sst", 1))
        change = commit(state, compare_and_append, args)
        pending = change.maintenance.merges
        merges += len(pending)
        rewritten += sum(b.updates for r in pending for b in r.inputs)
        state = run_compactor(change.state, pending, "w1")
        levels = [level(batch.updates) for batch in state.trace]
        assert all(levels.count(n) < SMALL_FANOUT for n in range(SMALL_LEVELS)), levels
        assert len(state.trace) <= 4 * (SMALL_FANOUT - 1) + 2
    assert merges < 3000 / 5
    assert rewritten / 3000 < 8


def test_append_claims_merges_for_its_writer() -> None:
    state = append(with_writer(initial()), 0, 1, runs=hollow_runs("part/w1/a.sst", 2000))
    args = CompareAndAppend("w1", "t2", 1, 2, hollow_runs("part/w1/b.sst", 2000))
    change = commit(state, compare_and_append, args, now=4242)
    [request] = change.maintenance.merges
    claim = change.state.merges[request.merge_id]
    assert claim.inputs == tuple(batch.id for batch in request.inputs) == (1, 2)
    assert (claim.claimant, claim.claimed_ms, claim.lease_ms) == (
        "w1",
        4242,
        SETTINGS.merge_lease_ms,
    )


def test_compaction_off_claims_nothing_but_still_merges_metadata() -> None:
    settings = PersistSettings(compaction="off")
    state = with_writer(initial())
    state = append(state, 0, 1, runs=hollow_runs("part/w1/a.sst", 10), settings=settings)
    state = append(state, 1, 2, runs=hollow_runs("part/w1/b.sst", 10), settings=settings)
    state = append(state, 2, 3, settings=settings)
    state = append(state, 3, 4, settings=settings)
    state = append(state, 4, 5, settings=settings)
    assert not state.merges
    assert [(b.desc.lower, b.desc.upper) for b in state.trace] == [(0, 1), (1, 2), (2, 5)]


def two_claimed(now: int = 1000) -> tuple[State, int]:
    state = append(with_writer(initial()), 0, 1, runs=hollow_runs("part/w1/a.sst", 2000), now=now)
    args = CompareAndAppend("w1", "t2", 1, 2, hollow_runs("part/w1/b.sst", 2000))
    change = commit(state, compare_and_append, args, now=now + 1)
    return change.state, change.maintenance.merges[0].merge_id


def merge_args(merge_id: int, claimant: str = "w1", since: int = 0) -> ApplyMerge:
    return ApplyMerge(
        merge_id, (1, 2), hollow_runs(f"part/{claimant}/c.sst", 4000), since, claimant
    )


def test_claim_takeover_after_the_lease() -> None:
    state, first = two_claimed(now=1000)
    state = with_writer(state, "w2", now=1002)
    # Within the lease, nothing to claim.
    assert noop(state, claim_merges, ClaimMerges("w2"), now=1001 + SETTINGS.merge_lease_ms) == ()
    change = commit(state, claim_merges, ClaimMerges("w2"), now=1002 + SETTINGS.merge_lease_ms)
    [request] = change.result
    assert first not in change.state.merges
    assert change.state.merges[request.merge_id].claimant == "w2"
    assert change.state.merges[request.merge_id].inputs == (1, 2)


def test_apply_merge_after_takeover_applies_once() -> None:
    state, first = two_claimed(now=1000)
    state = with_writer(state, "w2", now=1002)
    takeover = commit(state, claim_merges, ClaimMerges("w2"), now=1002 + SETTINGS.merge_lease_ms)
    second = takeover.result[0].merge_id
    # The first compactor (claim taken over) finishes first: its output replaces the inputs.
    applied = commit(takeover.state, apply_merge, merge_args(first))
    assert isinstance(applied.result, Applied)
    assert not applied.state.merges  # the second claim's inputs are gone: dropped
    batch = applied.state.trace[0]
    assert (batch.desc.lower, batch.desc.upper, batch.updates) == (0, 2, 4000)
    # The second one cannot apply any more.
    assert noop(applied.state, apply_merge, merge_args(second, "w2")) == NotApplied()


def test_apply_merge_not_applied_when_inputs_are_not_exactly_present() -> None:
    state, merge_id = two_claimed()
    for inputs in [(2, 1), (1, 3), (7, 8)]:
        args = ApplyMerge(merge_id, inputs, (), 0, "w1")
        assert noop(state, apply_merge, args) == NotApplied()


def test_apply_merge_after_finalize_is_not_applied() -> None:
    state, merge_id = two_claimed()
    state = append(state, 2, None)
    state = commit(state, register_critical_reader, RegisterCriticalReader("c")).state
    args = CompareAndDowngradeSince("c", b"", b"", None)
    state = commit(state, compare_and_downgrade_since, args).state
    state = commit(state, finalize, Finalize()).state
    assert noop(state, apply_merge, merge_args(merge_id)) == NotApplied()


def test_apply_merge_refuses_a_since_beyond_the_shards() -> None:
    state, merge_id = two_claimed()
    assert isinstance(refused(state, apply_merge, merge_args(merge_id, since=1)), UsageError)


def test_apply_merge_of_cancelled_updates_leaves_an_empty_batch() -> None:
    state, merge_id = two_claimed()
    change = commit(state, apply_merge, ApplyMerge(merge_id, (1, 2), (), 0, "w1"))
    assert [(b.desc.lower, b.desc.upper, b.is_empty) for b in change.state.trace] == [(0, 2, True)]


def test_renew_merge_by_its_claimant_only() -> None:
    state, merge_id = two_claimed(now=1000)
    change = commit(state, renew_merge, RenewMerge(merge_id, "w1"), now=50_000)
    assert change.result is True and change.state.merges[merge_id].claimed_ms == 50_000
    assert noop(state, renew_merge, RenewMerge(merge_id, "w2")) is False
    assert noop(state, renew_merge, RenewMerge(merge_id + 1, "w1")) is False
