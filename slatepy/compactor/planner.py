"""Compaction planning: a pure function from a manifest (and the WAL tail) to a plan.

Two kinds of work, in priority order:

1. ``WalToL0``: merge the WAL SSTs after ``wal_id_last_compacted`` (up to
   ``max_wal_ssts`` of them) into L0 SSTs cut at ``target_sst_bytes``, with disjoint key
   ranges (one, unless the WAL tail is larger than that).
2. ``L0ToRun``: once ``l0_trigger`` L0 SSTs exist, merge all of L0 with the newest sorted runs
   whose size is at most ``size_ratio`` times what is being merged so far (size-tiered), into
   one new sorted run. Tombstones are dropped only when the output includes the oldest run,
   because only then can no older value lie underneath them.

The WAL comes first, so that the writer's memtable is released soon, except once L0 holds
``l0_max`` SSTs: then L0ToRun does. Under a sustained write load there is always new WAL
when the compactor plans, and WAL-first alone would never merge L0 (the L0 count, and with
it the cost of every get and scan, would grow without bound). While L0 is merged the WAL
waits, the writer's memtable fills, and writes stall at ``max_unflushed_bytes``: that
stall is what holds the L0 count at ``l0_max`` plus one WalToL0's outputs (issue 33,
docs/performance.md). Except while L0 holds an ingested SST: the WAL may still hold writes
older than the ingestion, and only in L0 do reads order versions by seq (an ingested SST
moved to a run first would be shadowed by them once they reach L0), so the WAL stays first
until it is drained and the ingestion merged with the rest of L0. And except right after an
L0 merge failed (``wal_first``): a merge that keeps failing (a damaged L0 SST, a store
failing its reads) would otherwise hold the WAL, and with it every write, for as long as it
fails; the WAL goes first for a while (the compactor's ``WAL_FIRST_MAX``), then the merge is
tried again.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from slatepy.errors import FencedError
from slatepy.manifest.record import Manifest, SortedRun, SstHandle

CLOSE_L0_TRIGGER = 2
"""The L0 count at which a closing writer's compactor merges L0 (``Db.close()`` drains it,
``Settings.close_compaction_wait``). Every L0 SST is one more source a get asks and a scan
merges, and after a close nothing adds to L0 until the next open: merging them once, on the
way out, is cheaper than every read of the next process paying for them. Runs are chosen as
in any L0 merge (size-tiered), within the close's budget (:func:`plan`'s ``close_budget``).
One L0 SST is left as it is: it reads like a sorted run of one SST."""

CLOSE_MAX_RUNS = 4
"""Sorted runs from which a close no longer merges L0 alone when the runs size-tiering
takes along do not fit its budget. Each such close adds a run (merging L0 alone at every
close grew the run count without bound for a process that restarts often: the review's
fix, reverted at stop 37); below this count the added runs are the newest and smallest,
which a later merge takes along; at it, L0 is left as it is, for the next process's
compactor. (4, ``l0_trigger``'s default: in a simulation of 60 databases
through 1,000 open-write-close cycles, 8 let the run count reach 10 against 7 without a
budget, and left more sources after a close on average; 3 or 4 kept it at 6-7.)"""


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """Tunables of the planner."""

    l0_trigger: int = 4
    l0_max: int = 8
    """L0 SSTs at which merging L0 comes before compacting the WAL (see the module)."""
    size_ratio: float = 4.0
    max_wal_ssts: int = 1000
    target_sst_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WalToL0:
    first_wal_id: int
    last_wal_id: int


@dataclass(frozen=True, slots=True)
class L0ToRun:
    l0_ids: tuple[str, ...]
    run_ids: tuple[int, ...]
    new_run_id: int
    drop_tombstones: bool


Plan = WalToL0 | L0ToRun


def run_size(run: SortedRun) -> int:
    return sum(h.object_size for h in run.ssts)


def plan(
    manifest: Manifest,
    wal_tail: int | None,
    policy: CompactionPolicy,
    *,
    close_budget: int | None = None,
    wal_first: bool = False,
) -> Plan | None:
    """The next compaction to run, or None when there is nothing worth doing.

    Args:
        manifest: The latest manifest.
        wal_tail: The highest id of the contiguous WAL (None if the WAL is empty).
        close_budget: The bytes a closing compactor can still merge before the close stops
            it (``Settings.close_compaction_wait`` at its merge rate), or None (not closing).
            An L0 merge whose size-tiered runs do not fit it merges L0 alone instead, if
            that fits and fewer than ``CLOSE_MAX_RUNS`` runs exist; else none is made (the
            WAL still is). A merge the close would abandon is written in vain, and again at
            every later close. Never a part of the runs size-tiering chose: a run cut at
            the budget is one no later close can take along with the next (simulated,
            such cuts piled up runs of the budget's size, 33 of them).
        wal_first: The WAL (if any) before L0, even at ``l0_max``: L0 merges failed
            lately (see the module).
    """
    first = manifest.wal_id_last_compacted + 1
    wal = None
    if wal_tail is not None and wal_tail >= first:
        wal = WalToL0(first, min(wal_tail, first + policy.max_wal_ssts - 1))
    l0_full = len(manifest.l0) >= max(policy.l0_max, policy.l0_trigger)
    if wal is not None and (wal_first or not l0_full or manifest.l0_has_ingested()):
        return wal
    merge = _merge_l0(manifest, policy, close_budget)
    # A close that cannot afford L0's merge still compacts the WAL.
    return wal if merge is None else merge


def _merge_l0(
    manifest: Manifest, policy: CompactionPolicy, close_budget: int | None
) -> L0ToRun | None:
    """All of L0 and the size-tiered runs (within ``close_budget``: see :func:`plan`), or
    None below ``l0_trigger`` SSTs or beyond the budget."""
    if len(manifest.l0) < policy.l0_trigger:
        return None
    l0_bytes = merged = sum(h.object_size for h in manifest.l0)
    runs: list[int] = []
    for run in manifest.sorted_runs:  # newest first
        size = run_size(run)
        if size > merged * policy.size_ratio:
            break
        runs.append(run.id)
        merged += size
    if close_budget is not None and merged > close_budget:
        if not runs or l0_bytes > close_budget or len(manifest.sorted_runs) >= CLOSE_MAX_RUNS:
            return None
        runs = []  # L0 alone: one run more
    return L0ToRun(
        l0_ids=tuple(h.id for h in manifest.l0),
        run_ids=tuple(runs),
        new_run_id=max((r.id for r in manifest.sorted_runs), default=0) + 1,
        drop_tombstones=len(runs) == len(manifest.sorted_runs),
    )


def plan_full(manifest: Manifest) -> L0ToRun | None:
    """A full compaction: all of L0 and every sorted run merged into one run, tombstones
    dropped (the output includes the oldest run), as RocksDB's ``CompactRange`` does; None
    when the database is one source already (at most one L0 SST or one run, not both).

    What size-tiering (:func:`plan`) never does on its own: it leaves runs whose sizes differ
    by more than ``size_ratio`` apart, each one more source for every get and scan. An
    operator asks for this (``slatepy compact --full``) after a bulk write, at the price of
    rewriting the whole database once (and, like every compaction, publishing within
    ``gc_min_age / 2``). The WAL is compacted first (:func:`plan`), so the merge reads every
    write made before it.
    """
    if len(manifest.l0) + len(manifest.sorted_runs) <= 1:
        return None
    return L0ToRun(
        l0_ids=tuple(h.id for h in manifest.l0),
        run_ids=tuple(r.id for r in manifest.sorted_runs),
        new_run_id=max((r.id for r in manifest.sorted_runs), default=0) + 1,
        drop_tombstones=True,
    )


def apply_result(
    manifest: Manifest, done: Plan, outputs: tuple[SstHandle, ...], compactor_epoch: int
) -> Manifest:
    """The manifest after publishing ``outputs`` of ``done`` (a pure transition).

    Raises:
        FencedError: a newer compactor took over, or the inputs are no longer current.
    """
    if manifest.compactor_epoch != compactor_epoch:
        raise FencedError(
            f"compactor epoch {compactor_epoch} was superseded by {manifest.compactor_epoch}"
        )
    # Dropped tombstones take their sequence numbers with them: remember the highest.
    seq_floor = max([manifest.max_compacted_seq(), *(h.max_seq for h in outputs)])
    manifest = msgspec.structs.replace(manifest, last_compacted_seq=seq_floor)
    if isinstance(done, WalToL0):
        if manifest.wal_id_last_compacted != done.first_wal_id - 1:
            raise FencedError("the WAL was compacted by someone else meanwhile")
        return msgspec.structs.replace(
            manifest,
            l0=outputs + manifest.l0,
            wal_id_last_compacted=done.last_wal_id,
            wal_id_last_seen=max(manifest.wal_id_last_seen, done.last_wal_id),
        )
    current_l0 = {h.id for h in manifest.l0}
    current_runs = {r.id for r in manifest.sorted_runs}
    if not set(done.l0_ids) <= current_l0 or not set(done.run_ids) <= current_runs:
        raise FencedError("the compaction's inputs were compacted by someone else meanwhile")
    new_runs = (SortedRun(done.new_run_id, outputs),) if outputs else ()
    kept_runs = tuple(r for r in manifest.sorted_runs if r.id not in done.run_ids)
    # L0 SSTs added after planning are newer than the output, so they stay in front of it;
    # the merged runs were the newest runs, so the output goes before the remaining ones.
    return msgspec.structs.replace(
        manifest,
        l0=tuple(h for h in manifest.l0 if h.id not in done.l0_ids),
        sorted_runs=new_runs + kept_runs,
    )
