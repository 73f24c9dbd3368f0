"""Reading every object of a database and checking every checksum (``inspect --verify``,
``doctor``): the I/O half; the findings are the pure :class:`~slatepy.manifest.repair.Survey`.

What is read, whole, and checked: every manifest listed; every compacted SST the newest
intact manifest references (footer, index, filters and every data block, and that the object
size matches the manifest's handle); every WAL SST after that manifest's
``wal_id_last_compacted``, with runs of missing ones classified as RFC 0008 does (lost when at
least the fence width long, else possibly a write in flight). Nothing is written.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from slatepy.engine.fencing import wal_gaps
from slatepy.errors import CorruptionError, NotFound, UnsupportedFormatVersion
from slatepy.format.sst import SstMeta, decode_sst
from slatepy.manifest.record import Manifest, SstHandle
from slatepy.manifest.repair import Damage, Newer, Survey, WalSst, handles
from slatepy.manifest.repair_report import plural
from slatepy.manifest.store import MANIFEST_DIR, MANIFEST_SUFFIX, ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.disk_cache import DiskCachedStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import COMPACTED_DIR, WAL_DIR, WAL_SUFFIX, compacted_path


def uncached(store: ObjectStore) -> ObjectStore:
    """``store`` without its disk cache: verification must check the store's bytes."""
    return store.uncached() if isinstance(store, DiskCachedStore) else store


def survey(store: ObjectStore) -> Survey:
    """Read and check everything reachable; see the module docstring.

    A manifest a newer slatepy wrote is listed in ``newer``, not as damage; when it is
    newer than every manifest this slatepy reads, the survey stops at the manifests (the
    WAL and SSTs are the newer manifest's, which this slatepy cannot read).

    Raises:
        NotASlatepyDatabase: the manifest directory holds only foreign objects.
    """
    manifests = NumberedObjects(store, MANIFEST_DIR, MANIFEST_SUFFIX)
    ids = tuple(manifests.ids())
    damage: list[Damage] = []
    decoded: dict[int, Manifest] = {}
    newer: list[Newer] = []
    for manifest_id in ids:
        path = manifests.path(manifest_id)
        try:
            decoded[manifest_id] = Manifest.decode(manifests.read(manifest_id))
        except NotFound:
            continue  # collected by GC since the listing: not damage
        except UnsupportedFormatVersion as exc:
            newer.append(Newer("manifest", path, manifest_id, exc.found, exc.newest))
        except CorruptionError as exc:
            damage.append(Damage("manifest", path, str(exc), manifest_id))
    if newer and (not decoded or int(newer[-1].object_id) > max(decoded)):
        base_id = max(decoded) if decoded else None
        base = decoded[base_id] if base_id is not None else None
        checked = (("manifest", "manifests", len(ids)),)
        return Survey(
            store.url, ids, base_id, base, tuple(damage), checked=checked, newer=tuple(newer)
        )
    if ids and not decoded:
        # Ours but damaged, or someone else's data? The manifest store tells them apart.
        with contextlib.suppress(CorruptionError, NotFound):
            ManifestStore(store).read(ids[-1])
    if not decoded:
        return Survey(store.url, ids, None, None, tuple(damage))
    base_id = max(decoded)
    base = decoded[base_id]
    for snapshot in base.snapshots:
        if snapshot.manifest_id not in decoded and snapshot.manifest_id not in ids:
            path = manifests.path(snapshot.manifest_id)
            reason = f"missing; snapshot {snapshot.id} refers to it"
            damage.append(Damage("manifest", path, reason, snapshot.manifest_id, missing=True))
    ssts = handles(base)
    for handle in ssts:
        problem = check_compacted(store, handle)
        if isinstance(problem, Newer):
            newer.append(problem)
        elif problem is not None:
            damage.append(problem)
    wal = survey_wal(store, base)
    damage += [
        Damage("wal", w.path, w.reason, w.sst.id, missing=w.sst.state == "missing")
        for w in wal
        if w.reason
    ]
    newer += [w.newer for w in wal if w.newer is not None]
    referenced = {h.id for h in ssts}
    unreferenced = tuple(
        meta.path
        for meta in store.list(COMPACTED_DIR + "/")
        if meta.path.endswith(".sst") and meta.path[len(COMPACTED_DIR) + 1 : -4] not in referenced
    )
    epochs = [w.sst.epoch for w in wal if w.sst.epoch is not None]
    return Survey(
        store.url,
        ids,
        base_id,
        base,
        tuple(damage),
        tuple(w.sst for w in wal),
        max(epochs, default=0),
        unreferenced,
        (
            ("manifest", "manifests", len(ids)),
            ("WAL SST", "WAL SSTs", sum(1 for w in wal if w.sst.state in ("ok", "damaged"))),
            ("compacted SST", "compacted SSTs", len(ssts)),
        ),
        tuple(newer),
    )


def check_compacted(store: ObjectStore, handle: SstHandle) -> Damage | Newer | None:
    """Read a compacted SST whole and check it against its handle; None when intact, a
    :class:`Newer` when a newer slatepy wrote it (this one cannot check it)."""
    path = compacted_path(handle.id)
    try:
        data = store.get(path)
    except NotFound:
        return Damage("compacted", path, "missing", handle.id, missing=True)
    if len(data) != handle.object_size:
        reason = f"{len(data)} bytes, the manifest says {handle.object_size} (truncated?)"
        return Damage("compacted", path, reason, handle.id)
    try:
        meta, entries = decode_sst(data)
        count = sum(1 for _ in entries)
    except UnsupportedFormatVersion as exc:
        return Newer("compacted", path, handle.id, exc.found, exc.newest)
    except CorruptionError as exc:
        return Damage("compacted", path, str(exc), handle.id)
    if count != handle.entry_count or meta.props.first_key != handle.first_key:
        return Damage("compacted", path, "its entries disagree with the manifest", handle.id)
    return None


LOST = (
    "missing below later WAL SSTs, in a run at least the fence width long: lost, not a "
    "write in flight (RFC 0008)"
)


@dataclass(frozen=True, slots=True)
class WalRead:
    """One WAL slot as read: the pure record, why it is bad ("" when it is not), and
    whether a newer slatepy wrote it (then its contents are unknown, but it is no damage)."""

    sst: WalSst
    reason: str = ""
    newer: Newer | None = None

    @property
    def path(self) -> str:
        return self.sst.path


def survey_wal(store: ObjectStore, base: Manifest, *, end: int | None = None) -> list[WalRead]:
    """Every WAL slot from ``base.wal_id_last_compacted + 1`` to the highest listed (or to
    ``end - 1``), read whole and checked; missing slots classified (see ``WalState``)."""
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    first = base.wal_id_last_compacted + 1
    ids = [i for i in wal.ids(after=first - 1) if end is None or i < end]
    lost = {i for gap in wal_gaps(ids, first, base.max_parallel_writes) for i in gap}
    present = set(ids)
    slots: list[WalRead] = []
    for wal_id in range(first, (ids[-1] + 1) if ids else first):
        path = wal.path(wal_id)
        if wal_id in lost:
            slots.append(WalRead(WalSst(wal_id, path, "missing"), LOST))
        elif wal_id not in present:
            slots.append(WalRead(WalSst(wal_id, path, "pending")))
        else:
            slots.append(read_wal_slot(wal, wal_id))
    return slots


def read_wal_slot(wal: NumberedObjects, wal_id: int) -> WalRead:
    """One WAL SST read whole; what its footer says even when a data block is damaged."""
    path = wal.path(wal_id)
    try:
        data = wal.read(wal_id)
    except NotFound:
        return WalRead(WalSst(wal_id, path, "missing"), "missing (deleted while checking?)")
    meta: SstMeta | None = None
    try:
        meta, entries = decode_sst(data)
        sum(1 for _ in entries)  # every block's checksum
    except UnsupportedFormatVersion as exc:
        newer = Newer("wal", path, wal_id, exc.found, exc.newest)
        return WalRead(WalSst(wal_id, path, "ok"), newer=newer)
    except CorruptionError as exc:
        return WalRead(_described(wal_id, path, "damaged", meta), str(exc))
    return WalRead(_described(wal_id, path, "ok", meta))


def _described(wal_id: int, path: str, state: str, meta: SstMeta | None) -> WalSst:
    if meta is None:
        return WalSst(wal_id, path, "damaged")
    p = meta.props
    return WalSst(
        wal_id,
        path,
        "ok" if state == "ok" else "damaged",
        epoch=p.writer_epoch,
        entries=p.entry_count,
        min_seq=p.min_seq if p.entry_count else None,
        max_seq=p.max_seq if p.entry_count else None,
        first_key=p.first_key,
        last_key=p.last_key,
    )


def describe(s: Survey) -> list[str]:
    """The verification report: what was checked and every bad object with the reason."""
    checked = ", ".join(plural(n, one, many) for one, many, n in s.checked) or "nothing"
    lines = [f"verified {s.url}: read and checked {checked}"]
    lines += [n.describe() for n in s.newer]
    if any(n.kind == "manifest" for n in s.needs_upgrade):
        lines.append(
            "the database's newest state is in a format this slatepy cannot read: its WAL "
            "and SSTs were not checked; upgrade slatepy and run this again (that is no "
            "damage: do not repair it with this slatepy)"
        )
    if s.base_id is not None and s.latest_id is not None and s.base_id != s.latest_id:
        newest = "manifest this slatepy reads" if s.needs_upgrade else "intact manifest"
        lines.append(f"newest {newest}: {s.base_id} (newest listed: {s.latest_id})")
    if s.needs_upgrade and not any(n.kind == "manifest" for n in s.needs_upgrade):
        lines.append(
            "objects this database needs are in a format this slatepy cannot read; upgrade "
            "slatepy to check them (that is no damage: do not repair it with this slatepy)"
        )
    if not s.damage:
        if not s.newer:
            lines.append("every checksum matched: no damage found")
        return lines
    lines.append(f"{plural(len(s.damage), 'bad object', 'bad objects')}:")
    lines += [f"  {d.path}: {d.reason}" for d in s.damage]
    return lines
