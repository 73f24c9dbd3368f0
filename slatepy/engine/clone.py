"""Clones: a new database that shares its source's compacted SSTs (RFC 0017).

``clone(src, dst)`` registers a checkpoint in the source (no expiry) and writes, at ``dst``,
a first manifest that is the checkpoint's manifest with the source's SSTs recorded as
external (:class:`~slatepy.manifest.record.ExternalDb`: the source's URL, the checkpoint and
the SST ids). Nothing compacted is copied; the checkpoint's WAL SSTs (those after its
``wal_id_last_compacted``, not yet compacted, so bounded by the source's
``max_unflushed_bytes``) are copied, at the same ids, because the clone's writer replays and
compacts its own WAL.

From then on the clone is a database of its own: its writer, compactor and GC write, list
and delete only under ``dst``. Reads of the shared SSTs go to the source's store
(:class:`~slatepy.table.external.ExternalSsts`, installed by :func:`with_external` wherever a
database's store is opened). The source's GC keeps them because the clone's checkpoint
keeps the manifest that references them; the clone's GC never deletes them (it lists
``dst``). Once the clone's compactions have rewritten every shared SST and no active
manifest of the clone references one, the clone's GC drops the source from
``external_dbs`` and releases the checkpoint (:mod:`slatepy.gc.shared`).

Deleting a clone before that: delete its objects, then the checkpoint in the source
(``slatepy checkpoint delete SRC ID``; its name is ``clone:DST``), so the source's GC can
collect what only the clone used. A clone of a clone also holds a checkpoint of its own in
each store its source shares SSTs from (so it outlives its source); its manifest's
``external_dbs`` lists every ``(url, checkpoint)`` to delete. Deleting the checkpoint
while the clone lives breaks the clone's reads of SSTs it has not rewritten yet.

The source must be reachable by URL from every process that opens the clone: a
``memory://`` store cannot be (each open of ``memory://`` is a new store).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import msgspec

from slatepy.config import Settings, SettingsLike, resolve_settings
from slatepy.engine import checkpoint as checkpoints
from slatepy.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    SlatepyError,
    StoreUnavailable,
)
from slatepy.manifest.record import CLONE_CHECKPOINT_PREFIX, ExternalDb, Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.store.stack import open_stack
from slatepy.store.url import open_store
from slatepy.table.external import ExternalSsts
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX

log = logging.getLogger(__name__)


def clone(
    src: str | ObjectStore,
    dst: str | ObjectStore,
    *,
    checkpoint: str | None = None,
    settings: SettingsLike = None,
) -> checkpoints.Checkpoint:
    """Make a new database at ``dst`` whose data is the source's, sharing its SSTs.

    Args:
        src: The source database (it must exist).
        dst: Where the clone goes: a location without a database.
        checkpoint: Clone this checkpoint of the source; default: the source's durable state
            now (a new checkpoint of it).

    Returns:
        The checkpoint registered in the source for the clone (it never expires; delete it
        once the clone is deleted).

    Raises:
        NotFound: no database at ``src``; no live checkpoint ``checkpoint`` there.
        AlreadyExists: ``dst`` holds a database already.
        InvalidArgument: ``src`` is a ``memory://`` store, or ``src`` and ``dst`` are the
            same location.
    """
    settings = resolve_settings(settings)
    source = open_stack(with_external(src, settings), settings)
    target = dst if isinstance(dst, ObjectStore) else open_store(dst, settings, create=True)
    if urlsplit(source.url).scheme == "memory":
        raise InvalidArgument(
            f"cannot clone {source.url}: a clone reads its source by URL, and every open of "
            "memory:// is a new store; clone a file://, s3://, gs:// or az:// database"
        )
    if source.url.rstrip("/") == target.url.rstrip("/"):
        raise InvalidArgument(f"clone: source and destination are both {source.url}")
    own = ManifestStore(target, attempts=settings.manifest_update_attempts)
    if own.load() is not None:
        raise AlreadyExists(
            f"clone: {target.url} already holds a database; clone into an empty location",
            path="manifest/",
        )
    made = checkpoints.create_checkpoint(
        source, settings, name=CLONE_CHECKPOINT_PREFIX + target.url, of=checkpoint
    )
    held: list[tuple[ObjectStore, str]] = [(source, made.id)]
    try:
        base = ManifestStore(source).read(made.manifest_id)
        _copy_wal(source, target, base.wal_id_last_compacted, made.wal_id)
        inherited = _hold_inherited(base, CLONE_CHECKPOINT_PREFIX + target.url, settings, held)
        first = _clone_manifest(base, made, source.url, inherited)
        if not _create_manifest(own, first, made.id):
            raise AlreadyExists(
                f"clone: another process created a database at {target.url} meanwhile",
                path="manifest/",
            )
    except BaseException:
        if _may_be_ours(own, made.id):
            # The manifest may have landed: without its checkpoints the clone would lose its
            # shared SSTs to the source's GC. Keeping them costs only what they hold.
            log.warning(
                "clone to %s failed, but its manifest may have been written: keeping its "
                "checkpoints %s (delete them if %s holds no database)",
                target.url,
                ", ".join(f"{store.url} {checkpoint_id}" for store, checkpoint_id in held),
                target.url,
            )
            raise
        for store, checkpoint_id in held:
            try:
                checkpoints.delete_checkpoint(store, settings, checkpoint_id)
            except SlatepyError as exc:  # best effort: the checkpoint is named clone:DST
                log.warning(
                    "clone failed; removing its checkpoint %s in %s failed too: %s",
                    checkpoint_id,
                    store.url,
                    exc,
                )
        raise
    log.info(
        "cloned %s (checkpoint %s, manifest %d) to %s: %d shared SSTs",
        source.url,
        made.id,
        made.manifest_id,
        target.url,
        len(first.external_dbs[-1].sst_ids) if first.external_dbs else 0,
    )
    return made


def _create_manifest(own: ManifestStore, first: Manifest, checkpoint_id: str) -> bool:
    """Write the clone's manifest 1; True if it is there now, False if another database's
    is. An uncertain outcome (the create landed, but its reply or read-back failed) is
    resolved by reading it back; if that fails too, the error is raised."""
    try:
        return own.put_after(0, first) is not None
    except StoreUnavailable:
        stored = own.load()
        if stored is not None and _is_ours(stored.manifest, checkpoint_id):
            return True
        raise


def _may_be_ours(own: ManifestStore, checkpoint_id: str) -> bool:
    """Whether the clone's manifest (holding ``checkpoint_id``) may be at the destination."""
    try:
        stored = own.load()
    except SlatepyError:
        return True  # cannot tell
    return stored is not None and _is_ours(stored.manifest, checkpoint_id)


def _is_ours(manifest: Manifest, checkpoint_id: str) -> bool:
    return any(e.checkpoint_id == checkpoint_id for e in manifest.external_dbs)


def with_external(url: str | ObjectStore, settings: Settings) -> ObjectStore:
    """The store at ``url``, reading a clone's shared SSTs from where they live.

    Wrap the bottom store with it before the stack (``open_stack``): the clone's manifest is
    read only when an SST is missing locally (see :mod:`slatepy.table.external`).
    """
    store = url if isinstance(url, ObjectStore) else open_store(url, settings)
    if isinstance(store, ExternalSsts):
        return store

    def locate() -> dict[str, ObjectStore]:
        stored = ManifestStore(store).load()
        where: dict[str, ObjectStore] = {}
        for external in () if stored is None else stored.manifest.external_dbs:
            source = open_store(external.url, settings)
            where.update(dict.fromkeys(external.sst_ids, source))
        return where

    return ExternalSsts(store, locate)


def _copy_wal(source: ObjectStore, target: ObjectStore, first: int, last: int) -> None:
    """Copy WAL SSTs ``first..last`` (the one at ``first`` carries the epoch; it may be
    missing for a new database) to the same ids at ``target``."""
    theirs = NumberedObjects(source, WAL_DIR, WAL_SUFFIX)
    ours = NumberedObjects(target, WAL_DIR, WAL_SUFFIX)
    for wal_id in range(max(first, 1), last + 1):
        try:
            data = theirs.read(wal_id)
        except NotFound:
            if wal_id == first:
                continue
            raise
        if ours.create(wal_id, data) is not None:
            raise AlreadyExists(
                f"clone: {ours.path(wal_id)} exists at {target.url}; clone into an empty location",
                path=ours.path(wal_id),
            )


def _hold_inherited(
    base: Manifest, name: str, settings: Settings, held: list[tuple[ObjectStore, str]]
) -> list[ExternalDb]:
    """For a clone of a clone: the SSTs ``base`` shares with *its* sources stay where they
    live, each held by a checkpoint of the clone's own there (a second checkpoint of the
    view the source's checkpoint holds), so the new clone outlives its source. Appends each
    checkpoint registered to ``held``."""
    ids = _sst_ids(base)
    inherited = []
    for external in base.external_dbs:
        shared = tuple(i for i in external.sst_ids if i in ids)
        if not shared:
            continue
        origin = open_stack(open_store(external.url, settings), settings)
        made = checkpoints.create_checkpoint(origin, settings, name=name, of=external.checkpoint_id)
        held.append((origin, made.id))
        inherited.append(ExternalDb(external.url, made.id, external.manifest_id, shared))
    return inherited


def _sst_ids(manifest: Manifest) -> set[str]:
    return {h.id for h in (*manifest.l0, *(h for run in manifest.sorted_runs for h in run.ssts))}


def _clone_manifest(
    base: Manifest,
    made: checkpoints.Checkpoint,
    source_url: str,
    inherited: list[ExternalDb],
) -> Manifest:
    """The clone's first manifest: ``base`` with its SSTs external, no snapshots, no
    compactor lease (the source's compactor is not the clone's)."""
    ids = _sst_ids(base)
    elsewhere = {i for e in inherited for i in e.sst_ids}
    own = ExternalDb(source_url, made.id, made.manifest_id, tuple(sorted(ids - elsewhere)))
    return msgspec.structs.replace(
        base,
        snapshots=(),
        compactor_lease=None,
        wal_id_last_seen=max(base.wal_id_last_compacted, made.wal_id),
        external_dbs=(*inherited, own),
    )
