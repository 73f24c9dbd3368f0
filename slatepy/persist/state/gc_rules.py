"""The pure part of garbage collection and rollups (RFC 0015 §4.3, §10).

GC works on references, as RFC 0003 does for the engine: a blob may go when no state a
reader can still load references it and it is older than ``batch_lease`` (so a batch or
rollup written but not yet registered is never taken). Which states a reader can still
load is ``seqno_since``: every leased reader holds the oldest seqno it may read, and
consensus entries (and rollups) below the newest rollup at or before ``seqno_since`` are
needed by nobody. A pass is fenced by its claim (:func:`claim_gc`): every CAS computed from
a state older than the claim loses to it and re-checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.ids import rollup_seqno
from slatepy.persist.state.outcome import Change, Outcome, noop, refuse, successor, walltime_after
from slatepy.persist.state.records import GcClaim, HollowBatch, State

GC_CLAIM_MERGE_LEASES = 5
"""A GC claim younger than this many merge leases keeps other GC passes away."""


def seqno_since(state: State) -> int:
    """The oldest seqno any leased reader may still read (the state's own when none).
    Critical readers hold a since, never a seqno: they do not read."""
    return min([state.seqno, *(reader.seqno for reader in state.leased_readers.values())])


def gc_due(state: State, settings: PersistSettings) -> bool:
    """Whether ``seqno_since`` moved ``gc_min_versions`` past the last GC."""
    return seqno_since(state) - state.last_gc_seqno >= settings.gc_min_versions


def rollup_due(
    latest_rollup_size: int, diff_bytes: int, diffs: int, settings: PersistSettings
) -> bool:
    """Whether the committer of a change writes a rollup, having written or replayed
    ``diffs`` diffs of ``diff_bytes`` bytes since the latest rollup (of
    ``latest_rollup_size`` bytes; 0 when there is none).

    Rolling up when the diff bytes reach the rollup's size bounds the bytes written per
    change at twice the diff, however large the state (RFC §4.3).
    """
    return diffs >= settings.rollup_min_diffs and diff_bytes >= max(
        latest_rollup_size, settings.rollup_min_bytes
    )


def truncation_seqno(state: State, *, not_after: int | None = None) -> int | None:
    """The seqno consensus may be truncated to (entries below it deleted): the newest
    rollup at or before ``seqno_since(state)`` and ``not_after`` (the object-store
    consensus passes the newest seqno whose successor is older than
    ``consensus_min_age``). None when no rollup qualifies: nothing may be truncated.
    The rollup at that seqno is what keeps the earliest retained entry loadable."""
    limit = seqno_since(state) if not_after is None else min(seqno_since(state), not_after)
    eligible = [seqno for seqno in state.rollups if seqno <= limit]
    return max(eligible) if eligible else None


def live_part_keys(states: Iterable[State]) -> set[str]:
    """Every blob part key some state of ``states`` references: pass the states
    ``[seqno_since, F]`` of a GC pass fenced at ``F``."""
    keys: set[str] = set()
    # Consecutive states share the records of the batches they both hold: each record is
    # read once (kept referenced here, so that an id is never reused within the pass).
    seen: dict[int, HollowBatch] = {}
    for state in states:
        for batch in state.trace:
            if id(batch) not in seen:
                seen[id(batch)] = batch
                keys.update(batch.part_keys())
    return keys


def deletable_parts(
    listed: Iterable[tuple[str, int]], live: Set[str], now_ms: int, settings: PersistSettings
) -> list[str]:
    """The listed parts (``(key, last_modified_ms)``, keys relative to the shard) that are
    not live and older than ``batch_lease``: no loadable state references them, and none
    can start to (a batch is applied only within half its lease of being written)."""
    cutoff = now_ms - settings.batch_lease_ms
    return [key for key, modified in listed if key not in live and modified < cutoff]


def deletable_rollups(
    state: State,
    listed: Iterable[tuple[str, int]],
    truncated_to: int | None,
    now_ms: int,
    settings: PersistSettings,
) -> list[str]:
    """The listed rollup blobs (``(key, last_modified_ms)``) a GC pass fenced at ``state``
    deletes once consensus is truncated to ``truncated_to``: those of seqnos below it, and
    those ``state`` does not reference that are older than ``batch_lease`` (written but
    never added, or a duplicate). Keys that are not rollup keys are left alone."""
    referenced = {ref.key for ref in state.rollups.values()}
    cutoff = now_ms - settings.batch_lease_ms
    out = []
    for key, modified in listed:
        seqno = rollup_seqno(key)
        if seqno is None:
            continue
        if (truncated_to is not None and seqno < truncated_to) or (
            key not in referenced and modified < cutoff
        ):
            out.append(key)
    return out


@dataclass(frozen=True, slots=True)
class ClaimGc:
    """Args of :func:`claim_gc`."""

    claimant: str


def claim_gc(state: State, now_ms: int, settings: PersistSettings, args: ClaimGc) -> Outcome[int]:
    """Start a GC pass: the claim is the pass's fence.

    Rule: NoOp(0) while another claim is younger than ``5 * merge_lease`` (by state
    walltime); else ``active_gc = GcClaim(claimant, F, walltime)`` where ``F`` is the new
    seqno, answered: the pass computes everything from the state at ``F``.
    Keeps: one live claim at a time.
    """
    now = walltime_after(state, now_ms)
    active = state.active_gc
    if active is not None and now - active.started_ms < GC_CLAIM_MERGE_LEASES * (
        settings.merge_lease_ms
    ):
        return noop(0)
    fence = state.seqno + 1
    return Change(successor(state, now_ms, active_gc=GcClaim(args.claimant, fence, now)), fence)


@dataclass(frozen=True, slots=True)
class CompleteGc:
    """Args of :func:`complete_gc`: the pass computed ``seqno_since`` at its fence and
    truncated consensus to ``truncated_to`` (None: not at all)."""

    claimant: str
    seqno_since: int
    truncated_to: int | None


def complete_gc(
    state: State, now_ms: int, settings: PersistSettings, args: CompleteGc
) -> Outcome[None]:
    """Finish a GC pass: forget the rollups below the truncation point (their blobs are
    deleted), record ``last_gc_seqno`` and clear our claim.

    Rules: ``UsageError`` when ``seqno_since`` is from the future, ``truncated_to`` is
    beyond it, or no registered rollup is at or after ``truncated_to`` (the earliest
    retained entry must stay loadable); NoOp(None) when nothing would change; else drop
    rollups below ``truncated_to``, ``last_gc_seqno = max(old, seqno_since)``, and clear
    ``active_gc`` if it is ours (a pass that was taken over leaves the newer claim).
    Keeps: a rollup at the earliest retained seqno; ``last_gc_seqno`` never regresses.
    """
    truncated_to = args.truncated_to
    if args.seqno_since > state.seqno or (
        truncated_to is not None and truncated_to > args.seqno_since
    ):
        return refuse(UsageError("GC completion names seqnos beyond its seqno_since or state"))
    rollups = state.rollups
    if truncated_to is not None:
        if not any(seqno >= truncated_to for seqno in rollups):
            return refuse(UsageError(f"no rollup at or after truncation point {truncated_to}"))
        rollups = {seqno: ref for seqno, ref in rollups.items() if seqno >= truncated_to}
    active = state.active_gc
    changes = {
        "rollups": rollups,
        "last_gc_seqno": max(state.last_gc_seqno, args.seqno_since),
        "active_gc": None if active is not None and active.claimant == args.claimant else active,
    }
    if all(getattr(state, name) == value for name, value in changes.items()):
        return noop(None)
    return Change(successor(state, now_ms, **changes), None)
