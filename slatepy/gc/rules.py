"""What the garbage collector may delete: pure functions of a listing and manifests.

The seed's rules (manifest design, "Garbage Collectors"), with additions that close races
the seed leaves open (RFC 0003, "Why GC cannot delete what is still reachable"):

* A manifest stays *active* for ``min_age`` after it stopped being current (its successor's
  creation time). A process that read a manifest without registering a snapshot (the writer's
  read view, a reader between loading and its snapshot write) can use it for that long.
* A compacted SST nobody references is deleted only once it is older than ``min_age``: a
  compactor writes its outputs before it publishes them, and abandons any compaction whose
  outputs are older than ``min_age / 2`` when it checks, after reading the latest manifest
  and before its publishing PUT.
* Before deleting such an SST the collector writes a manifest of its own (a *fence*) and
  spares what any manifest between the one it decided on and the fence references
  (:func:`spare_published`): a publishing PUT may be in flight for any length of time after
  the compactor's check, and the fence is what makes it either land before the fence (and be
  read) or lose its compare-and-swap (and check again, too late).

Active manifests are: the current one, those referenced by unexpired snapshots in it, and
those superseded less than ``min_age`` ago. Then, for every object listed:

1. ``manifest/N.manifest``: deleted unless active or newer than the current manifest.
2. ``wal/N.sst``: deleted if ``N`` < the smallest ``wal_id_last_compacted`` of the active
   manifests (never the SST at it: it carries the last compacted writer epoch).
3. ``compacted/X.sst``: deleted if no active manifest references it and it is old enough
   (and, after the fence, no newer manifest references it).
4. Anything else in those directories (temporaries, strays): deleted once old enough.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from slatepy.manifest.record import Manifest
from slatepy.manifest.store import MANIFEST_SUFFIX
from slatepy.store.base import ObjectMeta
from slatepy.store.numbered import parse_id
from slatepy.table.layout import WAL_SUFFIX


@dataclass(frozen=True, slots=True)
class Listing:
    """Every object under the three directories the collector manages, as listed."""

    manifests: Sequence[ObjectMeta]
    wal: Sequence[ObjectMeta]
    compacted: Sequence[ObjectMeta]


DeletionKind = Literal["manifest", "wal", "compacted", "stray"]
"""Which rule selected a deletion (1-4 in the module docstring)."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """One object the collector will delete, and why."""

    path: str
    size: int
    reason: str
    kind: DeletionKind


def active_manifest_ids(
    current_id: int,
    current: Manifest,
    manifests: Sequence[tuple[int, ObjectMeta]],
    *,
    now: datetime,
    min_age: float,
) -> set[int]:
    """Ids of the manifests that still protect what they reference.

    Args:
        manifests: ``(id, meta)`` of the listed manifests, ascending by id.
    """
    active = {current_id}
    active.update(s.manifest_id for s in current.snapshots if not s.expired(now.timestamp()))
    for (manifest_id, _), (_, successor) in itertools.pairwise(manifests):
        if manifest_id < current_id and _age(successor, now) < min_age:
            active.add(manifest_id)
    return active


def select_garbage(
    listing: Listing,
    current_id: int,
    active: Mapping[int, Manifest],
    *,
    now: datetime,
    min_age: float,
    wal_limits: Mapping[int, int] | None = None,
) -> list[Deletion]:
    """The objects of ``listing`` no active manifest can reach.

    Args:
        active: Every active manifest by id (see :func:`active_manifest_ids`).
        now: Taken *before* the current manifest was read (see RFC 0003).
        wal_limits: :func:`checkpoint_wal_limits`: the last WAL SST each manifest that only
            checkpoints hold can read; the others read every WAL SST from their
            ``wal_id_last_compacted`` on.
    """
    garbage: list[Deletion] = []

    def stray(meta: ObjectMeta) -> None:
        if _age(meta, now) >= min_age:
            garbage.append(Deletion(meta.path, meta.size, "temporary or stray object", "stray"))

    for meta in listing.manifests:
        manifest_id = parse_id(meta.path, MANIFEST_SUFFIX)
        if manifest_id is None:
            stray(meta)
        elif manifest_id < current_id and manifest_id not in active:
            garbage.append(Deletion(meta.path, meta.size, "inactive manifest", "manifest"))

    wal_floor = min(m.wal_id_last_compacted for m in active.values())
    limits = wal_limits or {}
    for meta in listing.wal:
        wal_id = parse_id(meta.path, WAL_SUFFIX)
        if wal_id is None:
            stray(meta)
        elif wal_id < wal_floor:
            reason = f"WAL below {wal_floor} (compacted)"
            garbage.append(Deletion(meta.path, meta.size, reason, "wal"))
        elif not wal_readers(wal_id, active, limits):
            reason = "compacted WAL after every checkpoint's (only checkpoints hold older views)"
            garbage.append(Deletion(meta.path, meta.size, reason, "wal"))

    referenced = referenced_ssts(active.values())
    for meta in listing.compacted:
        sst_id = compacted_id(meta.path)
        if sst_id is None:
            stray(meta)
        elif sst_id not in referenced and _age(meta, now) >= min_age:
            reason = "compacted SST no manifest uses"
            garbage.append(Deletion(meta.path, meta.size, reason, "compacted"))
    return garbage


def checkpoint_wal_limits(
    current_id: int,
    current: Manifest,
    manifests: Sequence[tuple[int, ObjectMeta]],
    *,
    now: datetime,
    min_age: float,
) -> dict[int, int]:
    """For each manifest that only checkpoints keep active, the last WAL SST it needs.

    A checkpoint covers the WAL from its manifest's ``wal_id_last_compacted`` up to its
    ``wal_id`` and no further (RFC 0017): what a checkpoint reader or a clone reads. A
    manifest that is also current, snapshotted by a reader (which polls the WAL on) or still
    in its ``min_age`` grace period (a process may be reading it and the WAL after it) has no
    limit. Without this, a checkpoint kept for a month would keep a month of WAL.

    Args:
        manifests: ``(id, meta)`` of the listed manifests, ascending by id.
    """
    now_s = now.timestamp()
    live = [s for s in current.snapshots if not s.expired(now_s)]
    unlimited = {current_id} | {s.manifest_id for s in live if s.kind != "checkpoint"}
    for (manifest_id, _), (_, successor) in itertools.pairwise(manifests):
        if _age(successor, now) < min_age:
            unlimited.add(manifest_id)
    limits: dict[int, int] = {}
    for s in live:
        if s.kind == "checkpoint" and s.manifest_id not in unlimited:
            limits[s.manifest_id] = max(limits.get(s.manifest_id, 0), s.wal_id)
    return limits


def wal_readers(
    wal_id: int, active: Mapping[int, Manifest], limits: Mapping[int, int]
) -> list[int]:
    """Ids of the active manifests that may read WAL SST ``wal_id``: those whose
    ``wal_id_last_compacted`` is at most it (the SST there carries the epoch), up to their
    limit (:func:`checkpoint_wal_limits`) if they have one."""
    return [
        i for i, m in active.items() if m.wal_id_last_compacted <= wal_id <= limits.get(i, wal_id)
    ]


def referenced_ssts(manifests: Iterable[Manifest]) -> set[str]:
    """Ids of the compacted SSTs (L0 and sorted runs) any of ``manifests`` references."""
    return {
        handle.id
        for manifest in manifests
        for handle in (*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts))
    }


def spare_published(deletions: Sequence[Deletion], newer: Iterable[Manifest]) -> list[Deletion]:
    """``deletions`` without the compacted SSTs that a manifest in ``newer`` references.

    Args:
        newer: Every manifest after the one the deletions were chosen from, up to the
            collector's fence (RFC 0003, "A publish in flight"): a compaction published
            while the collector was deciding.
    """
    published = referenced_ssts(newer)
    return [d for d in deletions if d.kind != "compacted" or compacted_id(d.path) not in published]


def compacted_id(path: str) -> str | None:
    """The SST id of ``compacted/{id}.sst`` (None for any other name)."""
    name = path.rsplit("/", 1)[-1]
    return name[: -len(".sst")] if name.endswith(".sst") else None


def _age(meta: ObjectMeta, now: datetime) -> float:
    return (now - meta.last_modified).total_seconds()
