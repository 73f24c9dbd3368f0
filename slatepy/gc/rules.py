"""What the garbage collector may delete: pure functions of a listing and manifests.

The seed's rules (manifest design, "Garbage Collectors"), with two additions that close
races the seed leaves open (RFC 0003, "Why GC cannot delete what is still reachable"):

* A manifest stays *active* for ``min_age`` after it stopped being current (its successor's
  creation time). A process that read a manifest without registering a snapshot (the writer's
  read view, a reader between loading and its snapshot write) can use it for that long.
* A compacted SST nobody references is deleted only once it is older than ``min_age``: a
  compactor writes its outputs before it publishes them, and abandons any compaction whose
  outputs are older than ``min_age / 2`` by the time it would publish.

Active manifests are: the current one, those referenced by unexpired snapshots in it, and
those superseded less than ``min_age`` ago. Then, for every object listed:

1. ``manifest/N.manifest``: deleted unless active or newer than the current manifest.
2. ``wal/N.sst``: deleted if ``N`` < the smallest ``wal_id_last_compacted`` of the active
   manifests (never the SST at it: it carries the last compacted writer epoch).
3. ``compacted/X.sst``: deleted if no active manifest references it and it is old enough.
4. Anything else in those directories (temporaries, strays): deleted once old enough.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from slatepy.engine.fencing import WAL_SUFFIX
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import MANIFEST_SUFFIX
from slatepy.store.base import ObjectMeta
from slatepy.store.numbered import parse_id


@dataclass(frozen=True, slots=True)
class Listing:
    """Every object under the three directories the collector manages, as listed."""

    manifests: Sequence[ObjectMeta]
    wal: Sequence[ObjectMeta]
    compacted: Sequence[ObjectMeta]


@dataclass(frozen=True, slots=True)
class Deletion:
    """One object the collector will delete, and why."""

    path: str
    size: int
    reason: str


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
) -> list[Deletion]:
    """The objects of ``listing`` no active manifest can reach.

    Args:
        active: Every active manifest by id (see :func:`active_manifest_ids`).
        now: Taken *before* the current manifest was read (see RFC 0003).
    """
    garbage: list[Deletion] = []

    def stray(meta: ObjectMeta) -> None:
        if _age(meta, now) >= min_age:
            garbage.append(Deletion(meta.path, meta.size, "temporary or stray object"))

    for meta in listing.manifests:
        manifest_id = parse_id(meta.path, MANIFEST_SUFFIX)
        if manifest_id is None:
            stray(meta)
        elif manifest_id < current_id and manifest_id not in active:
            garbage.append(Deletion(meta.path, meta.size, "inactive manifest"))

    wal_floor = min(m.wal_id_last_compacted for m in active.values())
    for meta in listing.wal:
        wal_id = parse_id(meta.path, WAL_SUFFIX)
        if wal_id is None:
            stray(meta)
        elif wal_id < wal_floor:
            garbage.append(Deletion(meta.path, meta.size, f"WAL below {wal_floor} (compacted)"))

    referenced = {
        handle.id
        for manifest in active.values()
        for handle in (*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts))
    }
    for meta in listing.compacted:
        name = meta.path.rsplit("/", 1)[-1]
        if not name.endswith(".sst"):
            stray(meta)
        elif name[: -len(".sst")] not in referenced and _age(meta, now) >= min_age:
            garbage.append(Deletion(meta.path, meta.size, "compacted SST no manifest uses"))
    return garbage


def _age(meta: ObjectMeta, now: datetime) -> float:
    return (now - meta.last_modified).total_seconds()
