"""``slatepy persist admin force-gc`` and ``force-compaction``: operator tools that run a
shard's maintenance now, whatever the background schedule (RFC 0015 §12).

Both are dry runs unless ``commit``, and both print one JSON report (the style of
``inspect``): the shard, the mode, what was (or would be) done, and a one-line ``message``.
A dry run writes nothing: the client it uses never finds a rollup due (a cold load may
otherwise write one), plans from the head with the pure rules and only reads. A committed
run goes through the same compare-and-set transitions as every writer, as the claimant
:data:`ADMIN_CLAIMANT`, so it is safe beside live writers and their background compaction:
a race it loses is reported in the summary, never raised.

Neither ever creates a shard or a location: the client opens with ``create=False`` and a
shard without a consensus log is an error naming it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slatepy.config import Settings
from slatepy.errors import InvalidArgument
from slatepy.persist.client import PersistClient
from slatepy.persist.compactor import compact
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import StateConflictError
from slatepy.persist.gc import collect
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.outcome import MergeReq, walltime_after
from slatepy.persist.state.records import HollowBatch, HollowPart, State
from slatepy.persist.state.spine import ClaimMerges, claim_merges, plan_merges
from slatepy.persist.versions import shard_path
from slatepy.table.reader import TableReader

ADMIN_CLAIMANT = "admin-cli"
"""Who the admin commands claim GC passes and merges as (recorded in the state; compaction
outputs go under ``part/admin-cli/``)."""

MAX_ROUNDS = 32
"""Claim-and-merge rounds ``force-compaction`` runs at most. A round merges every span the
spine can claim, and the next one what those merges made mergeable (one per level a merge
climbs), so a shard converges in far fewer; a claim that keeps failing cannot loop forever."""

_NEVER = 2**62
"""A rollup threshold no read reaches: a dry-run client never writes a rollup."""


@dataclass(frozen=True, slots=True)
class AdminReport:
    """What an admin command prints (``report`` as JSON) and its exit status; on a non-zero
    status the CLI also prints ``report["message"]`` to stderr."""

    report: dict[str, Any]
    status: int = 0


def force_gc(
    url: str,
    shard: str,
    *,
    consensus: str | None,
    settings: Settings,
    commit: bool,
    persist_settings: PersistSettings | None = None,
    clock: Callable[[], float] = time.time,
) -> AdminReport:
    """``admin force-gc``: one GC pass on ``shard`` now (a plan only unless ``commit``).

    The report names every part and rollup key the pass deletes (or would), with their
    bytes from the listing taken before it. Status 1 when another pass holds the GC claim.

    Args:
        persist_settings: Leases the pass judges ages by (``batch_lease``); tests shorten
            them. Default: the production settings.
        clock: Wall clock in seconds (tests).

    Raises:
        InvalidArgument: no shard ``shard`` at ``url``.
    """
    with open_client(url, consensus, settings, persist_settings, clock, commit=commit) as client:
        machine = _require_shard(client, url, shard)
        sizes = _sizes(client, shard)
        result = collect(machine, claimant=ADMIN_CLAIMANT, mode="run" if commit else "dry-run")
        report: dict[str, Any] = {
            "shard": shard,
            "mode": "commit" if commit else "dry-run",
            "status": result.status,
            "finalized": result.finalized,
            "fence": result.fence,
            "seqno_since": result.seqno_since,
            "truncated_to": result.truncated_to,
            "live_parts": result.live_parts,
            "parts": len(result.parts),
            "part_bytes": sum(sizes.get(key, 0) for key in result.parts),
            "rollups": len(result.rollups),
            "rollup_bytes": sum(sizes.get(key, 0) for key in result.rollups),
            "part_keys": list(result.parts),
            "rollup_keys": list(result.rollups),
        }
        if result.status == "skipped":
            holder = machine.fetch().active_gc
            if holder is None and result.finalized:
                return AdminReport(
                    report | {"message": f"shard {shard!r} is finalized and fully collected"}
                )
            who = f" ({holder.claimant!r}, fenced at seqno {holder.seqno})" if holder else ""
            message = (
                f"shard {shard!r}: another GC pass holds the claim{who}; nothing was deleted. "
                "Try again once it finishes (a crashed pass's claim expires after "
                "5 * merge_lease)"
            )
            return AdminReport(report | {"message": message}, status=1)
        verb = "deleted" if commit else "would delete (dry run: add --commit)"
        message = (
            f"shard {shard!r}: {verb} {len(result.parts)} parts ({report['part_bytes']} bytes) "
            f"and {len(result.rollups)} rollups ({report['rollup_bytes']} bytes)"
        )
        if result.truncated_to is not None:
            message += f"; consensus {'truncated' if commit else 'would be truncated'} below seqno "
            message += str(result.truncated_to)
        return AdminReport(report | {"message": message})


def force_compaction(
    url: str,
    shard: str,
    *,
    consensus: str | None,
    settings: Settings,
    commit: bool,
    persist_settings: PersistSettings | None = None,
    clock: Callable[[], float] = time.time,
    max_rounds: int = MAX_ROUNDS,
) -> AdminReport:
    """``admin force-compaction``: run the spine's merges on ``shard`` now.

    "Everything that can be merged" is what the spine rule (``state/spine.py``) claims:
    each round claims every mergeable span through ``claim_merges``, merges each with
    ``compactor.compact`` (applied by compare-and-set on the exact input ids), and the
    next round claims what the applied merges made mergeable; it stops when a round claims
    nothing (the trace has the spine's shape, or the rest is claimed by others) or after
    ``max_rounds``. Claims the admin claimant already holds (a crashed earlier run's) are
    run too. A dry run reports the trace and the first round's plan.

    Raises:
        InvalidArgument: no shard ``shard`` at ``url``.
    """
    with open_client(url, consensus, settings, persist_settings, clock, commit=commit) as client:
        machine = _require_shard(client, url, shard)
        state = machine.fetch()
        report: dict[str, Any] = {
            "shard": shard,
            "mode": "commit" if commit else "dry-run",
            "seqno": state.seqno,
            "since": state.since,
            "finalized": state.finalized,
        }
        if state.finalized or state.since is None:
            why = "is finalized" if state.finalized else "has a closed since (None)"
            return AdminReport(report | {"message": f"shard {shard!r} {why}: nothing to compact"})
        report["trace"] = [_batch(batch) for batch in state.trace]
        report["claimed_by_others"] = _claims_of_others(state)
        if not commit:
            planned, requests = plan_merges(
                state,
                claimant=ADMIN_CLAIMANT,
                walltime_ms=walltime_after(state, machine.now_ms()),
                lease_ms=machine.settings.merge_lease_ms,
            )
            report["merges"] = [_request(request) for request in requests]
            report["batches_after_metadata_merges"] = len(planned.trace)
            message = (
                f"shard {shard!r}: would run {len(requests)} merges in the first round over "
                f"{len(state.trace)} batches (dry run: add --commit; applied merges may make "
                "more mergeable)"
            )
            return AdminReport(report | {"message": message})
        summary = _compact_rounds(client, machine, max_rounds)
        after = machine.fetch()
        report |= summary | {
            "batches_before": len(state.trace),
            "batches_after": len(after.trace),
            "trace_after": [_batch(batch) for batch in after.trace],
        }
        statuses = summary["statuses"]
        message = (
            f"shard {shard!r}: {statuses.get('applied', 0)} merges applied, "
            f"{sum(statuses.values()) - statuses.get('applied', 0)} not applied, "
            f"{summary['lost_races']} lost races; batches {len(state.trace)} -> "
            f"{len(after.trace)}; {summary['parts_written']} parts written"
        )
        others = _claims_of_others(after)
        report["claimed_by_others_after"] = others
        if others:
            message += f"; {len(others)} merges claimed by other writers left to them"
        if summary["rounds"] >= max_rounds and not summary["converged"]:
            message += f" (stopped after {max_rounds} rounds: run it again)"
        return AdminReport(report | {"message": message})


def _compact_rounds(
    client: PersistClient, machine: ShardMachine, max_rounds: int
) -> dict[str, Any]:
    """Claim and run merges as :data:`ADMIN_CLAIMANT` until a round finds none.

    A merge someone else applied first (``not_applied``), inputs gone (``skipped``), or a
    claim lost every CAS race (``StateConflictError``) is counted, not raised: the shard is
    fine, and the next round plans from the new head."""
    tables = TableReader(client.blob, block_cache_bytes=0, meta_cache_bytes=1 << 20)
    statuses: Counter[str] = Counter()
    lost_races = parts_written = rounds = 0
    converged = False
    while rounds < max_rounds:
        rounds += 1
        try:
            machine.run(claim_merges, ClaimMerges(ADMIN_CLAIMANT), on_uncertain=rerun_as_is)
        except StateConflictError:
            lost_races += 1
            continue
        # Every claim we hold: those just made, and any an earlier run left behind.
        requests = _claims_of(machine.fetch(), ADMIN_CLAIMANT)
        if not requests:
            converged = True
            break
        for request in requests:
            try:
                result = compact(machine, tables, ADMIN_CLAIMANT, request)
            except StateConflictError:
                lost_races += 1
                continue
            statuses[result.status] += 1
            if result.status == "applied":
                parts_written += result.parts
    return {
        "rounds": rounds,
        "converged": converged,
        "statuses": dict(statuses),
        "lost_races": lost_races,
        "parts_written": parts_written,
    }


def open_client(
    url: str,
    consensus: str | None,
    settings: Settings,
    persist_settings: PersistSettings | None,
    clock: Callable[[], float],
    *,
    commit: bool,
) -> PersistClient:
    """A client that never creates the location and, for a dry run, never writes a
    rollup: rollups are the one write a read can make (a cold load that replayed many
    diffs), and a dry run must write nothing. It opens no writer, so it starts no
    background maintenance."""
    psettings = persist_settings or PersistSettings()
    if not commit:
        psettings = dataclasses.replace(
            psettings, rollup_min_diffs=_NEVER, rollup_min_bytes=_NEVER, rollup_replay_limit=_NEVER
        )
    return PersistClient.open(
        url,
        consensus=consensus,
        settings=settings,
        persist_settings=psettings,
        clock=clock,
        create=False,
    )


def _require_shard(client: PersistClient, url: str, shard: str) -> ShardMachine:
    if shard not in client.list_shards():
        raise InvalidArgument(
            f"no shard {shard!r} at {url}: nothing was changed (`slatepy persist inspect "
            f"{url}` lists the shards)"
        )
    return client.machine(shard)


def _sizes(client: PersistClient, shard: str) -> dict[str, int]:
    """Bytes of every part and rollup blob of ``shard``, by key relative to the shard."""
    root = shard_path(shard, "")
    return {
        meta.path[len(root) :]: meta.size
        for prefix in ("part/", "rollup/")
        for meta in client.blob.list(root + prefix)
    }


def _claims_of(state: State, claimant: str) -> list[MergeReq]:
    """The merges ``claimant`` holds in ``state``, oldest claim first, as requests."""
    index = state.batch_index()
    return [
        MergeReq(merge_id, tuple(state.trace[index[i]] for i in claim.inputs))
        for merge_id, claim in sorted(state.merges.items())
        if claim.claimant == claimant
    ]


def _claims_of_others(state: State) -> list[dict[str, Any]]:
    return [
        {"merge_id": merge_id, "inputs": list(claim.inputs), "claimant": claim.claimant}
        for merge_id, claim in sorted(state.merges.items())
        if claim.claimant != ADMIN_CLAIMANT
    ]


def _batch(batch: HollowBatch) -> dict[str, Any]:
    parts = [part for run in batch.runs for part in run]
    return {
        "id": batch.id,
        "lower": batch.desc.lower,
        "upper": batch.desc.upper,
        "since": batch.desc.since,
        "updates": batch.updates,
        "runs": len(batch.runs),
        "parts": len(parts),
        "bytes": sum(p.size if isinstance(p, HollowPart) else len(p.data) for p in parts),
    }


def _request(request: MergeReq) -> dict[str, Any]:
    return {
        "merge_id": request.merge_id,
        "inputs": [batch.id for batch in request.inputs],
        "updates": sum(batch.updates for batch in request.inputs),
        "bytes": sum(_batch(batch)["bytes"] for batch in request.inputs),
    }
