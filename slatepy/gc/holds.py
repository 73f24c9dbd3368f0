"""Why the garbage collector keeps what it keeps: pure functions of a listing and manifests.

:func:`~slatepy.gc.rules.select_garbage` says what may go. This module says, for every other
listed object, whether it is *live* (the current state needs it) or *held back*: not needed
by the current manifest, yet kept, and for what reason and until when (RFC 0017):

* ``min_age``: a superseded manifest (and what only it references) during its grace period,
  or an unreferenced compacted SST younger than ``gc_min_age``. A process that read the old
  manifest may still be reading its SSTs; a compactor's output is unreferenced until it
  publishes it.
* ``snapshot``: an unexpired reader snapshot keeps its manifest, and so its SSTs, active.
* ``checkpoint``: the same for a checkpoint (a named snapshot, kept until deleted or expired).
* ``kept``: kept deliberately whatever the time: the WAL SST at ``wal_id_last_compacted``
  (it carries the last compacted writer epoch), young temporaries (a write may be in flight),
  SSTs a compaction published while the pass was deciding.

A held object's ``collectable_at`` is the earliest time the rules could let it go if nothing
else changes (None: not by time; a checkpoint without expiry, or the epoch WAL SST).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from slatepy.gc.rules import Deletion, Listing, compacted_id, wal_readers
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import MANIFEST_SUFFIX
from slatepy.store.base import ObjectMeta
from slatepy.store.numbered import parse_id
from slatepy.table.layout import WAL_SUFFIX

HoldReason = Literal["min_age", "snapshot", "checkpoint", "kept"]
"""Why an object the current state does not need is not deleted (module docstring)."""

REASON_ORDER: tuple[HoldReason, ...] = ("min_age", "snapshot", "checkpoint", "kept")


@dataclass(frozen=True, slots=True)
class Hold:
    """One object the collector keeps although the current manifest does not need it.

    Attributes:
        detail: For ``snapshot``/``checkpoint`` the snapshot's id (and a checkpoint's name);
            for ``kept`` what is kept; for ``min_age`` what waits (manifest, WAL, SST).
        collectable_at: When the rules let it go, if nothing else changes; None: not by
            time alone.
    """

    path: str
    size: int
    reason: HoldReason
    detail: str
    collectable_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class HoldSummary:
    """The held objects of one reason (and, for snapshots and checkpoints, one holder).

    ``earliest``/``latest`` span the objects' ``collectable_at``; ``forever`` counts those
    held with no time at all (``latest`` is then only over the others).
    """

    reason: HoldReason
    detail: str
    objects: int
    bytes: int
    earliest: dt.datetime | None
    latest: dt.datetime | None
    forever: int = 0


@dataclass(frozen=True, slots=True)
class ManifestHold:
    """Why a superseded manifest is active: the holder whose hold lasts longest."""

    reason: HoldReason
    detail: str
    until: dt.datetime | None


def manifest_holds(
    current_id: int,
    current: Manifest,
    manifests: Sequence[tuple[int, ObjectMeta]],
    *,
    now: dt.datetime,
    min_age: float,
) -> dict[int, ManifestHold]:
    """For each active manifest other than the current one, what keeps it active.

    Mirrors :func:`~slatepy.gc.rules.active_manifest_ids`; where several reasons apply, the
    one lasting longest is given (a never-expiring snapshot outlasts every time).

    Args:
        manifests: ``(id, meta)`` of the listed manifests, ascending by id.
    """
    candidates: dict[int, list[ManifestHold]] = {}
    for s in current.snapshots:
        if s.expired(now.timestamp()) or s.manifest_id == current_id:
            continue
        reason: HoldReason = "checkpoint" if s.kind == "checkpoint" else "snapshot"
        until = None if s.expire_time_s == 0 else _at(s.expire_time_s)
        detail = f"{s.id} ({s.name})" if s.name else s.id
        candidates.setdefault(s.manifest_id, []).append(ManifestHold(reason, detail, until))
    for (manifest_id, _), (_, successor) in itertools.pairwise(manifests):
        until = successor.last_modified + dt.timedelta(seconds=min_age)
        if manifest_id < current_id and until > now:
            candidates.setdefault(manifest_id, []).append(
                ManifestHold("min_age", "superseded manifest", until)
            )
    return {i: max(holds, key=_lasting) for i, holds in candidates.items()}


def explain_holds(
    listing: Listing,
    current_id: int,
    active: Mapping[int, Manifest],
    holders: Mapping[int, ManifestHold],
    deletions: Iterable[Deletion],
    *,
    now: dt.datetime,
    min_age: float,
    wal_limits: Mapping[int, int] | None = None,
) -> tuple[list[Hold], list[ObjectMeta]]:
    """Sort every listed object not in ``deletions`` into held (with why) or live.

    Args:
        active: Every active manifest by id (the current one included).
        holders: :func:`manifest_holds` of the same pass.
        deletions: What the pass deletes (after its fence): neither held nor live.
        wal_limits: As given to :func:`~slatepy.gc.rules.select_garbage`.

    Returns:
        ``(holds, live)``.
    """
    gone = {d.path for d in deletions}
    current = active[current_id]
    holds: list[Hold] = []
    live: list[ObjectMeta] = []
    grace = dt.timedelta(seconds=min_age)

    def held_by(
        meta: ObjectMeta, manifest_ids: Iterable[int], what: str, *, aged: bool = False
    ) -> None:
        chosen = [holders[i] for i in manifest_ids if i in holders]
        if not chosen:  # only the current manifest: live
            live.append(meta)
            return
        best = max(chosen, key=_lasting)
        detail = what if best.reason == "min_age" else best.detail
        until = best.until
        if aged and until is not None:  # unreferenced, a compacted SST must be old enough
            until = max(until, meta.last_modified + grace)
        holds.append(Hold(meta.path, meta.size, best.reason, detail, until))

    def young(meta: ObjectMeta, reason: HoldReason, detail: str) -> None:
        holds.append(Hold(meta.path, meta.size, reason, detail, meta.last_modified + grace))

    for meta in (m for m in listing.manifests if m.path not in gone):
        manifest_id = parse_id(meta.path, MANIFEST_SUFFIX)
        if manifest_id is None:
            young(meta, "kept", "young temporary (a write may be in flight)")
        elif manifest_id >= current_id:
            live.append(meta)
        else:
            held_by(meta, [manifest_id], "superseded manifest")

    for meta in (m for m in listing.wal if m.path not in gone):
        wal_id = parse_id(meta.path, WAL_SUFFIX)
        if wal_id is None:
            young(meta, "kept", "young temporary (a write may be in flight)")
        elif wal_id > current.wal_id_last_compacted:
            live.append(meta)
        elif wal_id == current.wal_id_last_compacted:
            holds.append(
                Hold(meta.path, meta.size, "kept", "WAL SST at wal_id_last_compacted", None)
            )
        else:
            # Kept because an active manifest compacted less: it still reads this WAL SST.
            held_by(meta, wal_readers(wal_id, active, wal_limits or {}), "compacted WAL SST")

    users: dict[str, list[int]] = {}
    for manifest_id, manifest in active.items():
        for handle in (*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts)):
            users.setdefault(handle.id, []).append(manifest_id)
    for meta in (m for m in listing.compacted if m.path not in gone):
        sst_id = compacted_id(meta.path)
        if sst_id is None:
            young(meta, "kept", "young temporary (a write may be in flight)")
        elif current_id in users.get(sst_id, ()):
            live.append(meta)
        elif sst_id in users:
            held_by(meta, users[sst_id], "SST of a superseded manifest", aged=True)
        elif meta.last_modified + grace > now:
            young(meta, "min_age", "young unreferenced SST (a compaction output?)")
        else:  # spared by the fence: a compaction published it while the pass decided
            holds.append(Hold(meta.path, meta.size, "kept", "published during the pass", None))
    return holds, live


def summarize(holds: Iterable[Hold]) -> tuple[HoldSummary, ...]:
    """Counts, bytes and the collectable span per reason: ``min_age`` as one group, the
    others per holder or detail (a snapshot, a checkpoint, what is ``kept``). Ordered as
    :data:`REASON_ORDER`, then detail."""
    groups: dict[tuple[HoldReason, str], list[Hold]] = {}
    for hold in holds:
        per_holder = hold.reason != "min_age"
        groups.setdefault((hold.reason, hold.detail if per_holder else ""), []).append(hold)
    summaries = []
    for (reason, detail), members in groups.items():
        times = [h.collectable_at for h in members if h.collectable_at is not None]
        summaries.append(
            HoldSummary(
                reason,
                detail,
                len(members),
                sum(h.size for h in members),
                min(times, default=None),
                max(times, default=None),
                len(members) - len(times),
            )
        )
    return tuple(sorted(summaries, key=lambda s: (REASON_ORDER.index(s.reason), s.detail)))


def _lasting(hold: ManifestHold) -> tuple[bool, dt.datetime]:
    """Sort key: no end outlasts any time."""
    return (hold.until is None, hold.until or dt.datetime.min.replace(tzinfo=dt.UTC))


def _at(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC)
