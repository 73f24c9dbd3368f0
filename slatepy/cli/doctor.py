"""``slatepy doctor URL [--repair]``: explain what is damaged, what a repair would give up,
and (only with ``--repair``) carry the repair out (RFC 0012).

The diagnosis is :func:`slatepy.cli.verify.survey` (reads only) and the plan the pure
:func:`slatepy.manifest.repair.plan_repair`. A repair is a writer start-up that gives things
up, and is fenced like one:

1. List the WAL, then claim: write manifest ``latest + 1`` (create-if-absent, so it loses to
   any concurrent update and starts over) copying the newest intact manifest, with writer and
   compactor epochs above any a live process can hold, and a snapshot that keeps GC off the
   WAL. A live compactor's next publish now fails its epoch check.
2. Fence the WAL after its tail exactly as a starting writer does
   (:func:`~slatepy.engine.fencing.fence_wal`), so a live writer halts at its next WAL write,
   and fill the narrow gaps below (writes still in flight lose their slot).
3. Read the WAL below the fence again, now frozen, and decide the cut for good.
4. Compact the intact WAL before the cut into L0 and publish (the usual update loop, refused
   if anyone claimed a newer epoch meanwhile): damaged compacted SSTs removed, the WAL up to
   the fence marked compacted, the snapshot released.

Nothing is ever deleted or overwritten: what is given up stays in the store until GC's rules
collect it, and the report names every object given up with what it held.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from slatepy.cli import verify
from slatepy.compactor.executor import compact_plan
from slatepy.compactor.planner import CompactionPolicy, WalToL0
from slatepy.config import Settings
from slatepy.engine.clone import with_external
from slatepy.engine.fencing import (
    Conflict,
    empty_sst,
    epoch_verifier,
    fence_wal,
    fenced,
    resolve_conflict,
    wal_gaps,
)
from slatepy.errors import CompactionAbandoned, ManifestConflictError
from slatepy.format.sst import decode_sst
from slatepy.manifest.record import Manifest, Snapshot, SstHandle
from slatepy.manifest.repair import (
    Damage,
    RepairPlan,
    Survey,
    Unrepairable,
    claim,
    finish,
    handles,
    plan_repair,
    replan_wal,
)
from slatepy.manifest.repair_report import keys, losses
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.store.stack import open_stack
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.reader import TableReader

REPAIR_ATTEMPTS = 5
"""Surveys a repair makes when concurrent updates keep taking the manifest id it claims."""


@dataclass(frozen=True, slots=True)
class Repaired:
    """A finished repair: the plan as carried out and the manifest that now holds it."""

    plan: RepairPlan
    survey: Survey
    manifest_id: int


def doctor(
    store: ObjectStore, *, settings: Settings | None = None, repair: bool = False
) -> tuple[str, int]:
    """The doctor's report and exit status: 0 when the database opens (healthy, repaired,
    or damaged only where opening does not look), 1 when it needs ``--repair`` or cannot be
    repaired.

    A manifest a newer slatepy wrote is never damage: the report says to upgrade, and a
    repair that would fall back past it is refused.

    Raises:
        NotASlatepyDatabase: the location holds someone else's data.
        UnsupportedFormatVersion: with ``repair``, a newer slatepy wrote the newest manifest
            or an SST the database needs; nothing was written.
    """
    settings = settings or Settings()
    # A clone's shared SSTs live in its source: not damage (RFC 0017).
    store = verify.uncached(open_stack(with_external(store, settings), settings))
    found = verify.survey(store)
    lines = [f"doctor: {store.url}", *verify.describe(found)]
    if not found.manifest_ids:
        lines.append("no manifest: this location holds no slatepy database")
        return "\n".join(lines), 1
    if found.healthy:
        return "\n".join(lines), 0
    if found.needs_upgrade:
        if repair:
            raise found.needs_upgrade[-1].error()
        lines.append(
            "no repair: a repair by this slatepy would give up what a newer slatepy wrote "
            "(fall back to an older manifest, or cut the WAL or drop SSTs at objects it "
            "cannot read); upgrade slatepy and run `slatepy doctor` again"
        )
        return "\n".join(lines), 1
    lines += ["", "what this means:", *(f"  {line}" for line in explain(found))]
    try:
        plan = plan_repair(found)
    except Unrepairable as exc:
        lines.append(f"no repair is possible: {exc}")
        return "\n".join(lines), 1
    if plan is None:
        lines.append("nothing stops the database from opening: no repair needed")
        return "\n".join(lines), 0
    if not repair:
        lines += ["", "a repair (slatepy doctor URL --repair) would:"]
        lines += [f"  {line}" for line in actions(plan)]
        lines += ["and give up:", *(f"  {line}" for line in losses(plan, found) or ["nothing"])]
        return "\n".join(lines), 1
    done = run_repair(store, settings)
    if done is None:
        lines.append("repair: nothing left to repair (someone else repaired it meanwhile?)")
        return "\n".join(lines), 0
    lines += ["", f"repaired: manifest {done.manifest_id} is now current. The repair did:"]
    lines += [f"  {line}" for line in actions(done.plan)]
    given_up = losses(done.plan, done.survey) or ["nothing"]
    lines += ["given up:", *(f"  {line}" for line in given_up)]
    lines.append(
        "given-up objects stay in the store until GC collects them (copy them aside now to "
        "keep them); the database opens again"
    )
    return "\n".join(lines), 0


def explain(found: Survey) -> list[str]:
    """Why each bad object matters, in terms of what fails."""
    return [f"{d.path}: {_consequence(d, found.base_id, found.base)}" for d in found.damage]


def _consequence(d: Damage, base_id: int | None, base: Manifest | None) -> str:
    if d.kind == "manifest":
        if base_id is None or (isinstance(d.object_id, int) and d.object_id > base_id):
            return (
                "the newest manifest is damaged; every open (writer, reader, compactor, GC) "
                "reads it first, so nothing can open the database"
            )
        return (
            "an older manifest: opening does not read it, but GC refuses to run while it is "
            "active (a snapshot refers to it, or it was superseded less than gc_min_age ago); "
            "a repair does not touch it"
        )
    if d.kind == "wal":
        return (
            "a WAL SST not yet compacted: a writer replays the WAL in order when it opens, so "
            "Db.open fails (and so do readers and compaction, which read it too)"
        )
    handle = _handle(base, str(d.object_id))
    where = keys(handle.first_key, handle.last_key) if handle else "its keys"
    return (
        f"a compacted SST: the database opens, but reads of {where} that reach it fail, "
        "and so does every compaction that merges it"
    )


def _handle(base: Manifest | None, sst_id: str) -> SstHandle | None:
    return next((h for h in handles(base) if h.id == sst_id), None) if base else None


def actions(plan: RepairPlan) -> list[str]:
    """What a repair does, step by step."""
    steps = [
        f"write manifest {plan.latest_id + 1}, a copy of manifest {plan.base_id} (the newest "
        f"intact) with writer epoch {plan.writer_epoch} and compactor epoch "
        f"{plan.compactor_epoch}, fencing any live writer or compactor",
        "write empty fencing SSTs after the WAL tail, as a starting writer does",
    ]
    if plan.wal_cut is not None:
        kept = [w for w in plan.wal_kept if w.entries]
        if kept:
            steps.append(
                f"compact the intact WAL before the cut (ids {plan.wal_first}.."
                f"{plan.wal_cut - 1}, {sum(w.entries or 0 for w in kept)} entries) into L0"
            )
        steps.append(
            f"cut the WAL before id {plan.wal_cut}: mark it compacted up to the fence, so "
            "nothing from the cut on is replayed"
        )
    for handle, _ in plan.dropped:
        steps.append(f"remove compacted/{handle.id}.sst from the manifest")
    steps.append("delete nothing")
    return steps


def run_repair(
    store: ObjectStore, settings: Settings, *, attempts: int = REPAIR_ATTEMPTS
) -> Repaired | None:
    """Survey, plan and repair; start over when a concurrent update takes the claimed id.

    Returns None when there is nothing to repair.

    Raises:
        Unrepairable: no intact manifest to start from.
        FencedError: a writer opened the database while the repair ran (after its claim);
            nothing was given up.
        ManifestConflictError: the claim lost the compare-and-swap ``attempts`` times.
    """
    for _ in range(attempts):
        found = verify.survey(store)
        plan = plan_repair(found)
        if plan is None:
            return None
        done = _repair(store, settings, found, plan)
        if done is not None:
            return done
    raise ManifestConflictError(
        f"the repair's claim lost the manifest compare-and-swap {attempts} times: something "
        "keeps updating this database; stop it and run the repair again"
    )


def _repair(
    store: ObjectStore, settings: Settings, found: Survey, plan: RepairPlan
) -> Repaired | None:
    """One attempt; None if the claim lost its compare-and-swap (survey again)."""
    assert found.base is not None
    base = found.base
    manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    first = plan.wal_first
    # Listed before the claim lands: no slot below ``start`` can hold a newer epoch (RFC 0008).
    ids = wal.ids(after=first - 1)
    start = ids[-1] + 1 if ids else first
    now = time.time()
    snapshot = Snapshot(
        uuid.uuid4().hex, plan.latest_id + 1, int(now + settings.writer_snapshot_ttl) + 1
    )
    claimed = manifests.put_after(plan.latest_id, claim(base, plan, snapshot=snapshot, now_s=now))
    if claimed is None:
        return None
    epoch = plan.writer_epoch

    check_epoch = epoch_verifier(manifests, epoch, "the repair's")

    fences = fence_wal(
        wal,
        start,
        epoch,
        max(base.max_parallel_writes, 1),
        verify=check_epoch,
        attempts=settings.wal_write_attempts,
    )
    # Narrow gaps may be writes still in flight: take their slots, as a writer's fence does,
    # so nothing lands below the fence after the WAL is read (wide gaps are lost already).
    lost = {i for gap in wal_gaps(ids, first, base.max_parallel_writes) for i in gap}
    for slot in sorted(set(range(first, start)) - set(ids) - lost):
        existing = wal.create(slot, empty_sst(epoch), attempts=settings.wal_write_attempts)
        if existing is not None:
            theirs = decode_sst(existing)[0].props.writer_epoch
            if resolve_conflict(epoch, theirs) is not Conflict.TRY_NEXT:
                raise fenced(slot, epoch, theirs)
    reads = verify.survey_wal(store, base, end=fences[0])
    newer = [r.newer for r in reads if r.newer is not None]
    if newer:  # a newer writer wrote since the survey: give up none of it
        raise newer[0].error()
    final = replan_wal(plan, tuple(r.sst for r in reads))
    new_l0: tuple[SstHandle, ...] = ()
    deadline = time.time() + settings.gc_min_age / 2
    if final.wal_cut is not None and final.wal_cut > first:
        tables = TableReader(store, cache_bytes=8 * 1024 * 1024)
        todo = WalToL0(first, final.wal_cut - 1)
        new_l0 = tuple(
            compact_plan(
                todo,
                base,
                tables,
                CompactionPolicy(),
                block_size=settings.block_size,
                bloom_bits_per_key=settings.bloom_bits_per_key,
                compression=settings.compression,
                compression_level=settings.compression_level,
            )
        )

    def publish(latest: Manifest, _: int) -> Manifest:
        # As a compactor does (RFC 0003): outputs GC may already count as garbage are not
        # published.
        if new_l0 and time.time() >= deadline:
            raise CompactionAbandoned("the repair took longer than gc_min_age / 2; run it again")
        return finish(latest, final, snapshot_id=snapshot.id, new_l0=new_l0, fence_end=fences[-1])

    stored = manifests.update(publish)
    return Repaired(final, found, stored.id)
