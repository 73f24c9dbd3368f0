"""What ``slatepy doctor`` found, and the repair it plans: pure data and pure functions.

The I/O lives in ``slatepy/cli/verify.py`` (reading every object into a :class:`Survey`) and
``slatepy/cli/doctor.py`` (carrying a :class:`RepairPlan` out under fencing). Here a survey
goes in and a plan comes out, and the two manifest transitions of a repair are functions
``Manifest -> Manifest``, so every decision (what to keep, what to give up, which epochs are
safe) is tested without a store (RFC 0012).

A repair never deletes and never rewrites an object. It gives up exactly three kinds of
thing, and says which:

* damaged manifests newer than the newest intact one (what they recorded is unknown: the
  repair writes a new manifest copying the intact one, with epochs above anything the lost
  ones could have held);
* the WAL from its first damaged or lost SST on (a WAL is a prefix: replaying writes that
  came after a lost one would resurrect a later state without the writes before it). The
  intact SSTs before the cut are compacted into L0 and ``wal_id_last_compacted`` moves past
  the cut;
* damaged or missing compacted (L0 or sorted-run) SSTs, removed from the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import msgspec

from slatepy.errors import FencedError, SlatepyError, UnsupportedFormatVersion
from slatepy.manifest.record import Manifest, Snapshot, SortedRun, SstHandle

ObjectKind = Literal["manifest", "wal", "compacted"]
WalState = Literal["ok", "damaged", "missing", "pending"]
"""A WAL slot: intact; damaged; missing below later SSTs in a run at least the fence width
long (lost: RFC 0008); or missing in a narrower run (``pending``: possibly a write still in
flight, which the next writer's fence fills if it never lands)."""


@dataclass(frozen=True, slots=True)
class Damage:
    """One object that failed verification.

    Attributes:
        kind: Which sequence it belongs to.
        path: The object.
        reason: What is wrong (the decoder's message, or "missing").
        missing: True when the object does not exist at all.
        object_id: The manifest or WAL id, or the compacted SST's id.
    """

    kind: ObjectKind
    path: str
    reason: str
    object_id: int | str
    missing: bool = False


@dataclass(frozen=True, slots=True)
class Newer:
    """An object a newer slatepy wrote (its format version is above the newest this one
    reads): not damage, and never given up by a repair.

    Attributes:
        kind: Which sequence it belongs to.
        path: The object.
        object_id: The manifest or WAL id, or the compacted SST's id.
        found: Its format version.
        newest: The newest format version this slatepy reads (of that kind of object).
    """

    kind: ObjectKind
    path: str
    object_id: int | str
    found: int
    newest: int

    def error(self) -> UnsupportedFormatVersion:
        what = "manifest" if self.kind == "manifest" else "SST"
        return UnsupportedFormatVersion(what, found=self.found, newest=self.newest, path=self.path)

    def describe(self) -> str:
        return (
            f"{self.path}: written by a newer slatepy (format {self.found}; this one reads up "
            f"to {self.newest}): upgrade slatepy"
        )


@dataclass(frozen=True, slots=True)
class WalSst:
    """What verification read from one WAL slot (after ``wal_id_last_compacted``).

    The fields after ``state`` come from the SST's properties and are None when even its footer
    is unreadable (or the SST is missing); a data block can be damaged under an intact footer,
    and then they still say what the SST held.
    """

    id: int
    path: str
    state: WalState
    epoch: int | None = None
    entries: int | None = None
    min_seq: int | None = None
    max_seq: int | None = None
    first_key: bytes | None = None
    last_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Survey:
    """Everything verification learnt about a database (a pure value).

    Attributes:
        url: Where it is.
        manifest_ids: Every manifest id listed.
        base_id: The newest manifest that decodes (None: none does).
        base: That manifest.
        damage: Every damaged or missing object, manifests first.
        wal: The WAL SSTs from ``base.wal_id_last_compacted + 1`` up to the highest listed,
            in id order, missing ones included (``ok`` False).
        max_wal_epoch: The highest writer epoch read from any WAL SST.
        unreferenced: Compacted SSTs ``base`` does not reference (GC's garbage, or what a
            lost newer manifest had published).
        checked: How many objects were read and checked, by kind (singular, plural, count).
        newer: Objects a newer slatepy wrote. When a manifest among them is newer than
            ``base_id``, ``base`` is not the database's state: nothing past the manifests
            was checked.
    """

    url: str
    manifest_ids: tuple[int, ...]
    base_id: int | None
    base: Manifest | None
    damage: tuple[Damage, ...]
    wal: tuple[WalSst, ...] = ()
    max_wal_epoch: int = 0
    unreferenced: tuple[str, ...] = ()
    checked: tuple[tuple[str, str, int], ...] = ()
    newer: tuple[Newer, ...] = ()

    @property
    def latest_id(self) -> int | None:
        return self.manifest_ids[-1] if self.manifest_ids else None

    @property
    def healthy(self) -> bool:
        return not self.damage and not self.newer

    @property
    def needs_upgrade(self) -> tuple[Newer, ...]:
        """What only a newer slatepy can read and a repair by this one would give up: the
        newer-format manifests after the newest one this slatepy reads (the state is
        theirs), and every newer-format WAL or compacted SST the database still needs."""
        return tuple(
            n
            for n in self.newer
            if n.kind != "manifest"
            or self.base_id is None
            or (isinstance(n.object_id, int) and n.object_id > self.base_id)
        )


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What a repair does, derived from a :class:`Survey` alone.

    Attributes:
        base_id: The intact manifest the repair starts from.
        latest_id: The newest manifest id; the repair's first write takes ``latest_id + 1``.
        lost_manifests: Damaged manifests newer than ``base_id`` (superseded, not deleted).
        wal_first: ``base.wal_id_last_compacted + 1``.
        wal_cut: The first WAL id given up; None keeps the whole WAL.
        wal_kept: Intact WAL SSTs before the cut (compacted into L0 when there is a cut).
        wal_lost: WAL SSTs from the cut on (intact ones too), missing ones included.
        dropped: Compacted SSTs removed from the manifest, with the damage found.
        writer_epoch: The epoch the repair claims; above every epoch any writer can hold.
        compactor_epoch: Likewise for compactors.
        seq_floor: ``last_compacted_seq`` after the repair: above every sequence number
            seen, given up ones included, so a new writer never reuses one.
    """

    base_id: int
    latest_id: int
    lost_manifests: tuple[int, ...]
    wal_first: int
    wal_cut: int | None
    wal_kept: tuple[WalSst, ...]
    wal_lost: tuple[WalSst, ...]
    dropped: tuple[tuple[SstHandle, Damage], ...]
    writer_epoch: int
    compactor_epoch: int
    seq_floor: int

    @property
    def gives_up_data(self) -> bool:
        return bool(self.wal_lost or self.dropped)


class Unrepairable(SlatepyError):
    """No repair can make this database openable (e.g. no manifest decodes at all)."""


def wal_cut(wal: tuple[WalSst, ...]) -> int | None:
    """The first WAL id that is damaged or lost (everything from it on is given up)."""
    return next((w.id for w in wal if w.state in ("damaged", "missing")), None)


def replan_wal(plan: RepairPlan, wal: tuple[WalSst, ...]) -> RepairPlan:
    """``plan`` with its WAL part decided again from ``wal``, read after the repair's fence.

    The fence froze the WAL below it, so this is final: the WAL slots an older writer filled
    after the first survey are counted (kept or given up) and the report names them.
    """
    cut = wal_cut(wal)
    seqs = [w.max_seq for w in wal if w.max_seq is not None]
    return replace(
        plan,
        wal_cut=cut,
        wal_kept=tuple(w for w in wal if cut is None or w.id < cut),
        wal_lost=tuple(w for w in wal if cut is not None and w.id >= cut),
        seq_floor=max([plan.seq_floor, *seqs]),
    )


def plan_repair(survey: Survey) -> RepairPlan | None:
    """The repair for ``survey``, or None when nothing that blocks opening is damaged.

    Damaged manifests older than the newest intact one block nothing (no open reads them;
    GC deletes them once inactive) and need no repair.

    Epochs: every manifest update raises ``writer_epoch`` and ``compactor_epoch`` by at most
    one (writer start, compactor claim; a repair raises them past its own bound), so the
    lost manifests ``base_id+1 .. latest_id`` hold at most ``base + (latest_id - base_id)``;
    and any writer that wrote has its epoch in the WAL. The repair claims one more than the
    larger, so no live writer or compactor can hold its epoch or a newer one.

    Raises:
        UnsupportedFormatVersion: a newer slatepy wrote the newest manifest (falling back
            past it would give up its state and, once GC ran, SSTs only it names) or an SST
            the database needs (cutting or dropping it would give up acknowledged writes).
            Upgrade instead.
        Unrepairable: no manifest decodes.
    """
    if survey.needs_upgrade:
        raise survey.needs_upgrade[-1].error()
    base, base_id, latest_id = survey.base, survey.base_id, survey.latest_id
    if base is None or base_id is None or latest_id is None:
        raise Unrepairable(
            "no manifest decodes: there is no intact state to fall back to. Restore the "
            "manifest directory from a backup."
        )
    lost_manifests = tuple(
        d.object_id
        for d in survey.damage
        if d.kind == "manifest" and isinstance(d.object_id, int) and d.object_id > base_id
    )
    cut = wal_cut(survey.wal)
    by_id = {d.object_id: d for d in survey.damage if d.kind == "compacted"}
    dropped = tuple((h, by_id[h.id]) for h in handles(base) if h.id in by_id)
    if not lost_manifests and cut is None and not dropped:
        return None
    kept = tuple(w for w in survey.wal if cut is None or w.id < cut)
    lost = tuple(w for w in survey.wal if cut is not None and w.id >= cut)
    missed = latest_id - base_id
    seqs = [w.max_seq for w in survey.wal if w.max_seq is not None]
    return RepairPlan(
        base_id=base_id,
        latest_id=latest_id,
        lost_manifests=lost_manifests,
        wal_first=base.wal_id_last_compacted + 1,
        wal_cut=cut,
        wal_kept=kept,
        wal_lost=lost,
        dropped=dropped,
        writer_epoch=max(base.writer_epoch, survey.max_wal_epoch) + missed + 1,
        compactor_epoch=base.compactor_epoch + missed + 1,
        seq_floor=max([base.max_compacted_seq(), *seqs]),
    )


def handles(manifest: Manifest) -> tuple[SstHandle, ...]:
    """Every compacted SST ``manifest`` references, L0 first, then the runs newest first."""
    return (*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts))


def claim(base: Manifest, plan: RepairPlan, *, snapshot: Snapshot, now_s: float) -> Manifest:
    """The repair's first manifest: ``base`` with the repair's epochs and ``snapshot``.

    Written at ``plan.latest_id + 1`` with create-if-absent. The epochs fence every writer
    and compactor (a live writer halts at the fencing SST the repair writes next; a live
    compactor's publish fails its epoch check); the snapshot keeps GC off the WAL while the
    repair reads it. Nothing is given up yet.
    """
    claimed = msgspec.structs.replace(
        base.without_expired_snapshots(now_s),
        writer_epoch=plan.writer_epoch,
        compactor_epoch=plan.compactor_epoch,
    )
    return claimed.with_snapshot(snapshot)


def finish(
    latest: Manifest,
    plan: RepairPlan,
    *,
    snapshot_id: str,
    new_l0: tuple[SstHandle, ...],
    fence_end: int,
) -> Manifest:
    """The repair's second manifest: what it gives up removed, the kept WAL in ``new_l0``.

    Applied to the latest manifest (normally the claim itself) under the usual update loop.

    Args:
        new_l0: The L0 SSTs holding the kept WAL SSTs (only when the WAL is cut).
        fence_end: The last WAL id of the repair's fence; with a cut, the WAL up to it is
            marked compacted (the kept part is in ``new_l0``, the rest is given up), so the
            next writer replays nothing before the fence.

    Raises:
        FencedError: a writer or compactor claimed a newer epoch after the repair's claim;
            nothing is given up (the repair's outputs are left for GC).
    """
    if latest.writer_epoch != plan.writer_epoch or latest.compactor_epoch != plan.compactor_epoch:
        raise FencedError(
            f"the repair's epochs (writer {plan.writer_epoch}, compactor "
            f"{plan.compactor_epoch}) were superseded (writer {latest.writer_epoch}, compactor "
            f"{latest.compactor_epoch}) while it ran: someone opened the database; run "
            "`slatepy doctor` again"
        )
    drop = {h.id for h, _ in plan.dropped}
    runs = tuple(
        SortedRun(run.id, kept)
        for run in latest.sorted_runs
        if (kept := tuple(h for h in run.ssts if h.id not in drop))
    )
    seq_floor = max([latest.max_compacted_seq(), plan.seq_floor, *(h.max_seq for h in new_l0)])
    repaired = msgspec.structs.replace(
        latest.without_snapshot(snapshot_id),
        l0=new_l0 + tuple(h for h in latest.l0 if h.id not in drop),
        sorted_runs=runs,
        last_compacted_seq=seq_floor,
    )
    if plan.wal_cut is None:
        return repaired
    if latest.wal_id_last_compacted != plan.wal_first - 1:
        raise FencedError("the WAL was compacted by someone else while the repair ran")
    return msgspec.structs.replace(
        repaired,
        wal_id_last_compacted=fence_end,
        wal_id_last_seen=max(latest.wal_id_last_seen, fence_end),
    )
