"""Garbage collection of one shard: parts, rollups and consensus entries nobody can need
(RFC 0015 §10; the pure rules are ``state/gc_rules.py``).

A pass, fenced by its claim (``claim_gc`` commits at seqno ``F``):

1. Replay the states ``[seqno_since(F), F]`` from the rollup at or below the oldest seqno a
   reader may hold, and collect every part key they reference (``live_part_keys``).
2. LIST ``shards/{shard}/part/`` and delete each part that is not live **and** older than
   ``batch_lease`` (``deletable_parts``).
3. Truncate consensus below ``T``, the newest rollup at or below ``seqno_since(F)``
   (``truncation_seqno``): the entry and rollup at ``T`` keep the earliest retained state
   loadable.
4. Delete rollup blobs below ``T`` and unreferenced ones older than ``batch_lease``
   (``deletable_rollups``).
5. ``complete_gc``: forget the rollups below ``T``, record ``last_gc_seqno``, clear the claim.
   Rollup references go last, so a pass that crashes resumes from what the state still says.

**Why no deletion can hurt.** A leased reader holds a seqno ``>= seqno_since``, and it only
reads states at or after its seqno: states up to ``F`` are replayed, so their parts are live.
A state after ``F`` was computed from a state ``>= F`` (compare-and-set on a contiguous log),
so every part it adds is either new (compaction outputs, fresh batches) or a shipped batch
applied within ``batch_lease / 2`` of being written; either way younger than ``batch_lease``
when it is applied. The age cutoff is taken from the clock *before* the fence, so a pass that
stalls after its fence still never takes a part applied after it. A compare-and-set in
flight from a state below ``F`` loses to the fence and reruns, re-checking its batch's age
(RFC 0003's fence, the consensus seqno as the fence). Each deletion is safe on its own, so a
crashed pass leaves a correct shard; its claim expires after ``5 * merge_lease``.
Like RFC 0003, this assumes the clocks of the processes and the store's ``last_modified``
agree within ``batch_lease / 2``: a GC whose clock ran ahead by more would see a part being
written now as old, and could take it before the append that writes it lands.

**Finalized shards** reference no part: every part goes (nothing can reference one again: a
finalized shard takes no appends, merges or readers). The state is rolled up once more if
the latest rollup is not finalized; consensus is truncated to that rollup, leaving it and
the entries after it (the registration and the pass's own commits) as the tombstone.

A **dry run** (``mode="dry-run"``) writes nothing, not even the fence: it plans from the
head and returns what a pass would delete.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from slatepy.errors import CorruptionError
from slatepy.persist.ids import rollup_key
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.append import check_batch_age
from slatepy.persist.state.diff import apply, check_chain, decode_state_diff
from slatepy.persist.state.gc_rules import (
    ClaimGc,
    CompleteGc,
    claim_gc,
    complete_gc,
    deletable_parts,
    deletable_rollups,
    live_part_keys,
    seqno_since,
    truncation_seqno,
)
from slatepy.persist.state.records import RollupRef, State, decode_rollup, encode_rollup
from slatepy.persist.state.transitions import AddRollup, add_rollup
from slatepy.persist.versions import SCAN_LIMIT, entry_path, shard_path

log = logging.getLogger(__name__)

GcMode = Literal["run", "dry-run"]
GcStatus = Literal["done", "planned", "skipped"]
"""``done``: a pass ran; ``planned``: a dry run; ``skipped``: another pass holds the claim,
or a finalized shard has nothing left to collect."""


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one pass deleted (or, in a dry run, would delete).

    Attributes:
        shard_id: The shard.
        status: See :data:`GcStatus`.
        fence: The claim's seqno ``F`` (None in a dry run or when skipped).
        seqno_since: The oldest seqno a reader may hold, at the fence.
        truncated_to: Consensus entries below it deleted (None: none).
        live_parts: Part keys the replayed states reference.
        parts: Part keys (relative to the shard) deleted.
        rollups: Rollup keys deleted.
        finalized: The shard is finalized.
    """

    shard_id: str
    status: GcStatus
    fence: int | None = None
    seqno_since: int | None = None
    truncated_to: int | None = None
    live_parts: int = 0
    parts: tuple[str, ...] = ()
    rollups: tuple[str, ...] = ()
    finalized: bool = False


@dataclass(slots=True)
class _Listing:
    parts: list[tuple[str, int]] = field(default_factory=list)
    rollups: list[tuple[str, int]] = field(default_factory=list)


def collect(machine: ShardMachine, *, claimant: str, mode: GcMode = "run") -> GcReport:
    """Run one GC pass on ``machine``'s shard (or plan one, ``mode="dry-run"``).

    Args:
        machine: The shard's machine.
        claimant: Who runs the pass (recorded in the claim; a writer id, say).
        mode: ``"run"`` deletes; ``"dry-run"`` writes nothing and returns the plan.

    Raises:
        StoreError: the store or consensus failed (deletions made so far are each safe;
            the claim expires after ``5 * merge_lease``).
        CorruptionError: a rollup or consensus entry does not decode or chain, or no rollup
            lets the pass replay the states readers may hold (nothing is deleted).
    """
    # The cutoff and the lower bound of seqno_since come from before the fence: any part
    # a state after the fence references was written after this cutoff - batch_lease / 2.
    now_ms = machine.now_ms()
    before = machine.fetch()
    if before.finalized:
        return _collect_finalized(machine, before, claimant=claimant, mode=mode, now_ms=now_ms)
    fence: int | None = None
    if mode == "run":
        fence = machine.run(claim_gc, ClaimGc(claimant), on_uncertain=rerun_as_is)
        if not fence:
            return GcReport(machine.shard_id, "skipped")
        end = fence
    else:
        end = before.seqno
    states = _replay(machine, lower=seqno_since(before), end=end)
    at_fence = states[-1]
    since_seqno = seqno_since(at_fence)
    if states[0].seqno > since_seqno:
        raise CorruptionError(
            f"shard {machine.shard_id!r}: GC cannot replay state {since_seqno} (the oldest a "
            f"reader holds): the earliest rollup it can load is at {states[0].seqno}",
            path=entry_path(machine.shard_id, since_seqno),
        )
    live = live_part_keys(state for state in states if state.seqno >= since_seqno)
    listing = _list(machine)
    parts = deletable_parts(listing.parts, live, now_ms, machine.settings)
    truncate_to = truncation_seqno(at_fence)
    rollups = deletable_rollups(at_fence, listing.rollups, truncate_to, now_ms, machine.settings)
    report = GcReport(
        machine.shard_id,
        "planned" if mode == "dry-run" else "done",
        fence=fence,
        seqno_since=since_seqno,
        truncated_to=truncate_to,
        live_parts=len(live),
        parts=tuple(parts),
        rollups=tuple(rollups),
    )
    if mode == "run":
        _delete(machine, parts)
        if truncate_to is not None:
            machine.consensus.truncate(machine.shard_id, truncate_to)
        _delete(machine, rollups)
        machine.run(
            complete_gc, CompleteGc(claimant, since_seqno, truncate_to), on_uncertain=rerun_as_is
        )
    return report


def _collect_finalized(
    machine: ShardMachine, state: State, *, claimant: str, mode: GcMode, now_ms: int
) -> GcReport:
    """A finalized shard: every part goes, one finalized rollup and the entries after it
    stay. Skipped (nothing written) once that is all there is."""
    listing = _list(machine)
    latest = state.latest_rollup()
    earliest = _earliest(machine)
    if (
        not listing.parts
        and latest is not None
        and set(state.rollups) == {latest[0]}
        and [key for key, _ in listing.rollups] == [latest[1].key]
        and earliest == latest[0]
        and _is_finalized_rollup(machine, latest[1])
    ):
        return GcReport(machine.shard_id, "skipped", finalized=True)
    parts = [key for key, _ in listing.parts]
    settings = machine.settings
    if mode == "dry-run":
        return GcReport(
            machine.shard_id,
            "planned",
            seqno_since=state.seqno,
            truncated_to=latest[0] if latest else None,
            parts=tuple(parts),
            rollups=tuple(deletable_rollups(state, listing.rollups, None, now_ms, settings)),
            finalized=True,
        )
    fence = machine.run(claim_gc, ClaimGc(claimant), on_uncertain=rerun_as_is)
    if not fence:
        return GcReport(machine.shard_id, "skipped", finalized=True)
    _delete(machine, parts)
    final = _final_rollup(machine)
    machine.consensus.truncate(machine.shard_id, final)
    current = machine.state
    rollups = deletable_rollups(current, listing.rollups, final, now_ms, settings)
    _delete(machine, rollups)
    machine.run(
        complete_gc,
        CompleteGc(claimant, seqno_since(current), final),
        on_uncertain=rerun_as_is,
    )
    return GcReport(
        machine.shard_id,
        "done",
        fence=fence,
        seqno_since=seqno_since(current),
        truncated_to=final,
        parts=tuple(parts),
        rollups=tuple(rollups),
        finalized=True,
    )


def _final_rollup(machine: ShardMachine) -> int:
    """The seqno of a registered rollup of the finalized state: the latest one if it is
    finalized already, else one written and registered now."""
    state = machine.state
    latest = state.latest_rollup()
    if latest is not None and _is_finalized_rollup(machine, latest[1]):
        return latest[0]
    data = encode_rollup(state)
    ref = RollupRef(rollup_key(state.seqno), len(data))
    written_ms = machine.now_ms()
    machine.blob.put(shard_path(machine.shard_id, ref.key), data)

    def young_enough(now_ms: int) -> None:
        # Registered only while GC could not have taken the blob (as batches, RFC §8.2).
        check_batch_age(written_ms, now_ms, machine.settings)

    added = machine.run(
        add_rollup, AddRollup(state.seqno, ref), on_uncertain=rerun_as_is, check=young_enough
    )
    if not added:
        # A rollup at that seqno was registered meanwhile: it holds the same state.
        machine.blob.delete(shard_path(machine.shard_id, ref.key))
    return state.seqno


def _is_finalized_rollup(machine: ShardMachine, ref: RollupRef) -> bool:
    path = shard_path(machine.shard_id, ref.key)
    return decode_rollup(machine.blob.get(path), path=path).finalized


def _earliest(machine: ShardMachine) -> int | None:
    """The seqno of the earliest retained consensus entry (None: an empty log)."""
    first = machine.consensus.scan(machine.shard_id, 1, 1)
    return first[0].seqno if first else None


def _replay(machine: ShardMachine, *, lower: int, end: int) -> list[State]:
    """The states from ``lower`` (or the first loadable one after it) to ``end``, replayed
    from the newest registered rollup in ``[earliest retained entry, lower]`` — from the
    initial state if the log was never truncated and no rollup qualifies. Each diff's
    digest chain is checked, as a loader does."""
    shard = machine.shard_id
    earliest = _earliest(machine) or 1
    rollups = machine.state.rollups
    below = [seqno for seqno in rollups if earliest <= seqno <= lower]
    above = [seqno for seqno in rollups if earliest <= seqno <= end]
    prev: bytes | None = None
    if below or (earliest > 1 and above):
        start = max(below) if below else min(above)
        path = shard_path(shard, rollups[start].key)
        state = decode_rollup(machine.blob.get(path), path=path)
        first = machine.consensus.scan(shard, start, 1)
        if state.seqno != start or not first or first[0].seqno != start:
            raise CorruptionError(
                f"shard {shard!r}: rollup {start} does not match its consensus entry",
                path=path,
            )
        prev = first[0].data
    elif earliest == 1:
        state = State.initial(shard)
    else:
        raise CorruptionError(
            f"shard {shard!r}: consensus starts at {earliest} but no rollup is registered there",
            path=entry_path(shard, earliest),
        )
    states = [state] if state.seqno >= lower else []
    while state.seqno < end:
        entries = machine.consensus.scan(shard, state.seqno + 1, SCAN_LIMIT)
        if not entries or entries[0].seqno != state.seqno + 1:
            raise CorruptionError(
                f"shard {shard!r}: consensus entry {state.seqno + 1} is missing",
                path=entry_path(shard, state.seqno + 1),
            )
        for entry in entries:
            if entry.seqno > end:
                break
            path = entry_path(shard, entry.seqno)
            diff = decode_state_diff(entry.data, path=path)
            check_chain(prev, diff, path=path)
            state, prev = apply(state, diff), entry.data
            if state.seqno >= lower:
                states.append(state)
    return states


def _list(machine: ShardMachine) -> _Listing:
    """The shard's parts and rollups as ``(key relative to the shard, last_modified_ms)``."""
    root = shard_path(machine.shard_id, "")
    listing = _Listing()
    for prefix, out in (("part/", listing.parts), ("rollup/", listing.rollups)):
        for meta in machine.blob.list(root + prefix):
            out.append((meta.path[len(root) :], int(meta.last_modified.timestamp() * 1000)))
    return listing


def _delete(machine: ShardMachine, keys: Iterable[str]) -> None:
    for key in keys:
        machine.blob.delete(shard_path(machine.shard_id, key))
