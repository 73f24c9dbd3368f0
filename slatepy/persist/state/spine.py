"""The spine: which batches of the trace to merge, and the merge transitions (RFC 0015 §8.1).

A batch's level is ``floor(log8(updates))`` below 1,024 updates (levels 0 to 3: *small*
batches) and ``4 + floor(log2(updates / 1024))`` above. :func:`plan_merges` looks, newest
first, for the first adjacent pair of unclaimed batches ``(older, newer)`` with
``level(older) <= level(newer)``, extends it towards older batches while their level is at
most ``level(newer)``, and claims that span — if ``newer`` is large, or the span holds 8
non-empty batches. Repeated after every append and every applied merge, this keeps large
levels strictly decreasing from the oldest batch to the newest (a binary counter), and small
ones non-increasing with at most 7 batches per level (a base-8 counter): the trace holds at
most ``28 + O(log(updates / 1024))`` batches; a small update is rewritten about 3 times on
its way to 1,024 and ``O(log)`` times after, and small appends cause one merge per 7 of
them, not one each (each merge is a blob write and a state change).

A span with at most one non-empty batch needs no data rewritten: it is merged at once, in
the same transition, by extending that batch's description over its empty neighbours (a
*metadata merge*), and adjacent unclaimed empty batches are always merged so, even where
no span can be claimed. This is how progress-only appends (empty batches) stay out of the
trace, and why the spine never sends a compactor to rewrite a batch only to absorb an empty
one.

Claims give liveness only: :func:`apply_merge` is a compare-and-set on the exact input
batch ids, so an output never replaces batches it was not computed from, whoever holds the
claim. A claim older than its lease (by state walltime) is dropped by the next plan and may
be claimed again (takeover).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from slatepy.persist import frontier
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.state.gc_rules import gc_due
from slatepy.persist.state.outcome import (
    Change,
    Maintenance,
    MergeReq,
    Outcome,
    noop,
    refuse,
    successor,
    walltime_after,
)
from slatepy.persist.state.records import (
    Desc,
    HollowBatch,
    MergeClaim,
    Runs,
    State,
    runs_updates,
)

LARGE_UPDATES = 1024
"""Batches of this many updates and more are *large*: they merge in pairs."""

SMALL_FANOUT = 8
"""The default of ``PersistSettings.small_merge_batches``: small batches merge this many at
a time (each merge is a blob write and a state change: merging small appends in pairs
would cost about one of each per append)."""

SMALL_LEVELS = 4
"""Levels of small batches: ``floor(log8(updates))``, 0 to 3 below :data:`LARGE_UPDATES`."""


def level(updates: int) -> int:
    """The spine level of a batch of ``updates`` updates: ``floor(log8(updates))`` below
    :data:`LARGE_UPDATES` (0 to 3), then ``4 + floor(log2(updates / 1024))``."""
    if updates < LARGE_UPDATES:
        return max(updates.bit_length() - 1, 0) // 3
    return SMALL_LEVELS - 1 + (updates // LARGE_UPDATES).bit_length()


def find_merge(
    trace: Sequence[HollowBatch], claimed: set[int], small_fanout: int = SMALL_FANOUT
) -> tuple[int, int] | None:
    """The span ``trace[start:end]`` the spine rule merges next, or None.

    Newest first, the first adjacent unclaimed pair ``(older, newer)`` with
    ``level(older) <= level(newer)``, extended towards older unclaimed batches whose level
    is at most ``level(newer)`` — where a small ``newer`` (below :data:`LARGE_UPDATES`)
    needs ``small_fanout`` non-empty batches in the span, unless at most one is non-empty
    (a metadata merge, which costs no write).
    """
    for i in range(len(trace) - 2, -1, -1):
        older, newer = trace[i], trace[i + 1]
        if older.id in claimed or newer.id in claimed:
            continue
        top = level(newer.updates)
        if level(older.updates) <= top:
            start = i
            while (
                start > 0
                and trace[start - 1].id not in claimed
                and level(trace[start - 1].updates) <= top
            ):
                start -= 1
            full = sum(not batch.is_empty for batch in trace[start : i + 2])
            if top >= SMALL_LEVELS or full <= 1 or full >= small_fanout:
                return start, i + 2
    return None


def _metadata_merge(inputs: Sequence[HollowBatch], batch_id: int) -> HollowBatch:
    """``inputs`` (at most one of them non-empty) as one batch: the non-empty one's runs
    under a description spanning them all. Its parts' updates (and windows) lie in its own
    description, which the new one contains."""
    full = [batch for batch in inputs if not batch.is_empty]
    since = full[0].desc.since if full else max(batch.desc.since for batch in inputs)
    return HollowBatch(
        id=batch_id,
        desc=Desc(inputs[0].desc.lower, inputs[-1].desc.upper, since),
        runs=full[0].runs if full else (),
        updates=full[0].updates if full else 0,
    )


def _merge_empty_neighbours(
    trace: Sequence[HollowBatch], claimed: set[int], next_batch_id: int
) -> tuple[list[HollowBatch], int]:
    """``trace`` with each run of adjacent unclaimed empty batches merged into one, so that
    progress-only appends never grow the trace, even where the spine rule's spans cannot be
    claimed (compaction off here, or spans extending over data nobody merges yet)."""
    out: list[HollowBatch] = []
    for batch in trace:
        previous = out[-1] if out else None
        if (
            previous is not None
            and previous.is_empty
            and batch.is_empty
            and previous.id not in claimed
            and batch.id not in claimed
        ):
            out[-1] = _metadata_merge((previous, batch), next_batch_id)
            next_batch_id += 1
        else:
            out.append(batch)
    return out, next_batch_id


def plan_merges(
    state: State,
    *,
    claimant: str | None,
    walltime_ms: int,
    lease_ms: int,
    small_fanout: int = SMALL_FANOUT,
) -> tuple[State, tuple[MergeReq, ...]]:
    """Apply the spine rule to ``state`` until nothing is left to do.

    Drops claims expired at ``walltime_ms``, merges metadata-only spans at once, and claims
    the others for ``claimant`` (None: claims nothing, e.g. a client with compaction off).
    Returns the state at the same seqno (the caller makes the successor) and the new claims.
    """
    merges = {i: c for i, c in state.merges.items() if not c.expired(walltime_ms)}
    next_merge_id = state.next_merge_id
    trace, next_batch_id = _merge_empty_neighbours(
        state.trace, set().union(*(claim.inputs for claim in merges.values())), state.next_batch_id
    )
    skipped: set[int] = set()
    requests: list[MergeReq] = []
    while True:
        claimed = skipped.union(*(claim.inputs for claim in merges.values()))
        span = find_merge(trace, claimed, small_fanout)
        if span is None:
            break
        start, end = span
        inputs = tuple(trace[start:end])
        if sum(not batch.is_empty for batch in inputs) <= 1:
            trace[start:end] = [_metadata_merge(inputs, next_batch_id)]
            next_batch_id += 1
        elif claimant is None:
            skipped.update(batch.id for batch in inputs)
        else:
            ids = tuple(batch.id for batch in inputs)
            merges[next_merge_id] = MergeClaim(ids, claimant, walltime_ms, lease_ms)
            requests.append(MergeReq(next_merge_id, inputs))
            next_merge_id += 1
    if merges == state.merges and next_batch_id == state.next_batch_id:
        return state, ()
    new = msgspec.structs.replace(
        state,
        trace=tuple(trace),
        merges=merges,
        next_batch_id=next_batch_id,
        next_merge_id=next_merge_id,
    )
    return new, tuple(requests)


def plan_for(
    state: State, now_ms: int, settings: PersistSettings, claimant: str
) -> tuple[State, tuple[MergeReq, ...]]:
    """:func:`plan_merges` as run after an append or a merge by ``claimant``'s client:
    claims only when the client compacts (``settings.compaction``)."""
    return plan_merges(
        state,
        claimant=claimant if settings.compaction == "on" else None,
        walltime_ms=walltime_after(state, now_ms),
        lease_ms=settings.merge_lease_ms,
        small_fanout=settings.small_merge_batches,
    )


@dataclass(frozen=True, slots=True)
class ClaimMerges:
    """Args of :func:`claim_merges`."""

    claimant: str


def claim_merges(
    state: State, now_ms: int, settings: PersistSettings, args: ClaimMerges
) -> Outcome[tuple[MergeReq, ...]]:
    """Run the spine rule outside an append (a maintenance pass, or ``force-compaction``),
    claiming for ``args.claimant``.

    Rule: NoOp(()) when the plan changes nothing (nothing to merge, or all of it claimed).
    Keeps: the spine invariants of :func:`plan_merges`.
    """
    planned, requests = plan_merges(
        state,
        claimant=args.claimant,
        walltime_ms=walltime_after(state, now_ms),
        lease_ms=settings.merge_lease_ms,
        small_fanout=settings.small_merge_batches,
    )
    if planned is state:
        return noop(())
    new = successor(planned, now_ms)
    return Change(new, requests, Maintenance(gc=gc_due(new, settings), merges=requests))


@dataclass(frozen=True, slots=True)
class RenewMerge:
    """Args of :func:`renew_merge`."""

    merge_id: int
    claimant: str


def renew_merge(
    state: State, now_ms: int, settings: PersistSettings, args: RenewMerge
) -> Outcome[bool]:
    """Extend a claim a long merge still works on.

    Rule: NoOp(False) when the claim is gone or another claimant holds it (the merge may
    still be applied: safety is the exact-id check of :func:`apply_merge`); else stamp
    ``claimed_ms`` with the new walltime and answer True.
    Keeps: everything but the claim's stamp.
    """
    claim = state.merges.get(args.merge_id)
    if claim is None or claim.claimant != args.claimant:
        return noop(False)
    renewed = msgspec.structs.replace(claim, claimed_ms=walltime_after(state, now_ms))
    return Change(successor(state, now_ms, merges={**state.merges, args.merge_id: renewed}), True)


@dataclass(frozen=True, slots=True)
class ApplyMerge:
    """Args of :func:`apply_merge`: the merge of batches ``inputs`` (ids, oldest first),
    forwarded to ``since``, is ``runs`` (one run, or none when everything cancelled)."""

    merge_id: int
    inputs: tuple[int, ...]
    runs: Runs
    since: int
    claimant: str


@dataclass(frozen=True, slots=True)
class Applied:
    """The merge replaced its inputs with batch ``batch_id`` (which later metadata merges
    of the same transition may have extended under a new id)."""

    batch_id: int


@dataclass(frozen=True, slots=True)
class NotApplied:
    """The inputs are no longer exactly in the trace (merged by someone else, finalized):
    delete the outputs."""


def apply_merge(
    state: State, now_ms: int, settings: PersistSettings, args: ApplyMerge
) -> Outcome[Applied | NotApplied]:
    """Replace a merge's input batches with its output.

    Rules, in order: NoOp(NotApplied) unless every input id is in the trace, contiguous and
    in order (whether or not the claim still exists: a taken-over claim's first compactor
    may still win); ``UsageError`` when ``since`` is beyond the shard's since or the runs
    hold an empty run or part; else the output batch ``Desc(first.lower, last.upper,
    since)`` takes the inputs' place, every claim on an input is dropped, and the spine
    rule runs again for ``claimant``.
    Keeps: contiguous trace (the output spans exactly its inputs), since bound, claims only
    on present batches.
    """
    if not args.inputs:
        return refuse(UsageError("a merge needs input batches"))
    index = state.batch_index()
    positions = [index.get(batch_id, -1) for batch_id in args.inputs]
    start = positions[0]
    if start < 0 or positions != list(range(start, start + len(positions))):
        return noop(NotApplied())
    if not frontier.le(args.since, state.since):
        return refuse(
            UsageError(f"merge forwarded to {args.since}, beyond the shard's since {state.since}")
        )
    problem = runs_problem(args.runs)
    if problem:
        return refuse(UsageError(f"merge output: {problem}"))
    end = start + len(positions)
    first, last = state.trace[start], state.trace[end - 1]
    output = HollowBatch(
        id=state.next_batch_id,
        desc=Desc(first.desc.lower, last.desc.upper, args.since),
        runs=args.runs,
        updates=runs_updates(args.runs),
    )
    inputs = set(args.inputs)
    merged = msgspec.structs.replace(
        state,
        trace=(*state.trace[:start], output, *state.trace[end:]),
        merges={i: c for i, c in state.merges.items() if not inputs.intersection(c.inputs)},
        next_batch_id=state.next_batch_id + 1,
    )
    planned, requests = plan_for(merged, now_ms, settings, args.claimant)
    new = successor(planned, now_ms)
    return Change(new, Applied(output.id), Maintenance(gc=gc_due(new, settings), merges=requests))


def runs_problem(runs: Runs) -> str | None:
    """What is wrong with ``runs`` as a batch's runs (an empty run, a part without
    updates), or None."""
    for run in runs:
        if not run:
            return "a run without parts"
        if any(part.updates < 1 for part in run):
            return "a part without updates"
    return None
