"""A clone's shared SSTs: stop sharing what it no longer reads, then release its source's
checkpoint (RFC 0017, "Releasing the source").

A clone's manifest lists, per source, the SSTs it reads there (``external_dbs``), and a
checkpoint of the clone's in the source keeps them from the source's GC. The clone's
compactions rewrite them into its own store one by one; once no *active* manifest of the
clone (the rules' set: current, snapshotted, checkpointed, or in its ``min_age`` grace) still
references one, no process of the clone can read it. The collector then, each pass:

1. Cuts every entry's ``sst_ids`` to the ids still needed (one manifest update, only when
   something changes). An entry left with no ids stays, empty: it is the durable record that
   the checkpoint is still to be released.
2. Releases the checkpoint of each empty entry: deletes it from the source's manifest (a
   checkpoint already gone counts as released: a crash after this step, or an operator
   deleting it by hand).
3. Drops the entries whose checkpoint it released (a second manifest update).

So the clone's manifest stops naming the shared SSTs before the source may collect them,
and a crash anywhere leaves at most an empty entry, which the next pass (of the clone's GC,
in its compactor process or ``slatepy gc``) releases and drops. A source it cannot reach
keeps its entry and is retried the next pass.

Why "active" is enough: nothing ever adds an external id to a clone's manifest after the
clone is made (compactions and ingests write fresh ids), so a manifest newer than the one
the pass decided on references a subset of what it references; and a snapshot only ever
names a new manifest or, as a second checkpoint, one an active checkpoint already holds.
:func:`shrink_shared` re-checks the latter inside its update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Set

import msgspec

from slatepy.errors import SlatepyError
from slatepy.gc.rules import referenced_ssts
from slatepy.manifest.record import CHECKPOINT, Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore

log = logging.getLogger(__name__)

OpenSource = Callable[[str], ObjectStore]
"""Opens a clone's source by URL (to release the clone's checkpoint there)."""

Released = tuple[str, str]
"""``(source url, checkpoint id)`` of a released checkpoint."""


def needed_shared(active: Mapping[int, Manifest]) -> set[str]:
    """The external SST ids some active manifest references (only those may still be read)."""
    external = {i for m in active.values() for e in m.external_dbs for i in e.sst_ids}
    return external & referenced_ssts(active.values())


def to_release(manifest: Manifest, needed: Set[str]) -> list[Released]:
    """The checkpoints of ``manifest``'s entries with no needed id: what a pass releases (a
    dry run's answer; a real pass releases the entries its update left empty)."""
    return [
        (e.url, e.checkpoint_id)
        for e in manifest.external_dbs
        if not any(i in needed for i in e.sst_ids)
    ]


def shrink_shared(
    latest: Manifest,
    needed: Set[str],
    *,
    decided_on: int,
    checked: Set[int],
    now_s: float,
) -> Manifest | None:
    """``latest`` with each ``external_dbs`` entry cut to the ids still needed; None when
    nothing changes, or when it cannot tell (see below).

    Args:
        needed: :func:`needed_shared` of the pass's active manifests.
        decided_on: The current manifest the pass decided on.
        checked: The ids of the active manifests ``needed`` was taken from.

    An entry keeps the ids in ``needed`` and those ``latest`` itself references; an entry
    left without ids stays (its checkpoint is still to be released). If ``latest`` holds an
    unexpired snapshot of a manifest older than ``decided_on`` that the pass did not check
    (no known path makes one), nothing is cut: that manifest may reference them.
    """
    for s in latest.snapshots:
        if not s.expired(now_s) and s.manifest_id < decided_on and s.manifest_id not in checked:
            return None
    keep = set(needed) | referenced_ssts([latest])
    entries = tuple(
        msgspec.structs.replace(e, sst_ids=tuple(i for i in e.sst_ids if i in keep))
        for e in latest.external_dbs
    )
    if entries == latest.external_dbs:
        return None
    return msgspec.structs.replace(latest, external_dbs=entries)


def drop_released(latest: Manifest, released: Set[Released]) -> Manifest | None:
    """``latest`` without the empty entries whose checkpoint was released (None: none)."""
    kept = tuple(
        e for e in latest.external_dbs if e.sst_ids or (e.url, e.checkpoint_id) not in released
    )
    if kept == latest.external_dbs:
        return None
    return msgspec.structs.replace(latest, external_dbs=kept)


def release_checkpoint(source: ObjectStore, checkpoint_id: str, *, attempts: int) -> bool:
    """Delete checkpoint ``checkpoint_id`` from the database at ``source``.

    Returns:
        True when it is gone (deleted now, or before: it was released already); False when
        there is no database at ``source`` to release it from (kept, so a source that is
        only unreachable for now is retried rather than forgotten).
    """
    manifests = ManifestStore(source, attempts=attempts)
    if manifests.load() is None:
        return False

    def remove(m: Manifest, _: int) -> Manifest | None:
        held = any(s.id == checkpoint_id and s.kind == CHECKPOINT for s in m.snapshots)
        return m.without_snapshot(checkpoint_id) if held else None

    manifests.update(remove)
    return True


def prune_shared(
    manifests: ManifestStore,
    active: Mapping[int, Manifest],
    *,
    decided_on: int,
    now_s: float,
    open_source: OpenSource,
    attempts: int,
) -> tuple[Released, ...]:
    """Steps 1-3 of the module docstring on the clone whose manifests are ``manifests``.

    Returns:
        The checkpoints released (and their entries dropped) by this call.

    Raises:
        ManifestConflictError: the clone's manifest update lost too often (nothing released
            that its manifest still names).
    """
    needed = needed_shared(active)
    current = active[decided_on]
    checked = set(active)
    if all(e.sst_ids for e in current.external_dbs) and (
        shrink_shared(current, needed, decided_on=decided_on, checked=checked, now_s=now_s) is None
    ):
        return ()  # the usual pass: nothing to cut, nothing to release, no request
    shrunk = manifests.update(
        lambda latest, _: shrink_shared(
            latest, needed, decided_on=decided_on, checked=checked, now_s=now_s
        )
    )
    released: set[Released] = set()
    empty = [(e.url, e.checkpoint_id) for e in shrunk.manifest.external_dbs if not e.sst_ids]
    for url, checkpoint_id in empty:
        try:
            gone = release_checkpoint(open_source(url), checkpoint_id, attempts=attempts)
        except SlatepyError as exc:
            log.warning(
                "gc: releasing checkpoint %s in %s failed (%s); the next pass retries",
                checkpoint_id,
                url,
                exc,
            )
            continue
        if not gone:
            log.warning(
                "gc: no database at %s to release checkpoint %s from; keeping the record "
                "(the next pass retries)",
                url,
                checkpoint_id,
            )
            continue
        log.info(
            "gc: released checkpoint %s in %s: nothing there is shared now", checkpoint_id, url
        )
        released.add((url, checkpoint_id))
    if released:
        manifests.update(lambda latest, _: drop_released(latest, released))
    return tuple(sorted(released))
