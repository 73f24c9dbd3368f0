"""``slatepy inspect URL``: the manifest, snapshots, levels, the WAL, what GC would delete, and
the requests the report cost (with the disk cache's hit rate)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from slatepy.cli import verify as checks
from slatepy.cli.output import escape
from slatepy.config import Settings
from slatepy.engine.clone import with_external
from slatepy.errors import SlatepyError
from slatepy.gc import GarbageCollector
from slatepy.gc.describe import human_bytes
from slatepy.manifest.record import CHECKPOINT, SstHandle, clone_of
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.disk_cache import DiskCachedStore
from slatepy.store.metrics import MetricsStore
from slatepy.store.numbered import NumberedObjects
from slatepy.store.stack import open_stack
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.reader import TableReader


def sst_summary(tables: TableReader, path: str, *, size: int | None = None) -> str:
    """One line about an SST, read from its footer and top index only (one ranged GET;
    no suffix request when ``size`` is known)."""
    meta = tables.meta(path, size=size)
    props = meta.props
    first, last = props.first_key or b"", props.last_key or b""
    keys = f"{escape(first)}..{escape(last)}" if props.entry_count else "(empty)"
    packed = ""
    if props.compression != "none":  # RFC 0018: blocks' bytes before and after compression
        packed = f" {props.compression}={props.uncompressed_size}->{props.data_size}"
    return (
        f"epoch={props.writer_epoch} entries={props.entry_count} "
        f"tombstones={props.tombstone_count} seq={props.min_seq}..{props.max_seq} "
        f"bytes={meta.object_size}{packed} keys={keys}"
    )


def handles_summary(handles: tuple[SstHandle, ...]) -> str:
    if not handles:
        return "empty"
    size = sum(h.object_size for h in handles)
    entries = sum(h.entry_count for h in handles)
    return (
        f"{len(handles)} SSTs, {size} bytes, {entries} entries, "
        f"keys {escape(handles[0].first_key)}..{escape(handles[-1].last_key)}"
    )


def run_summary(store: MetricsStore, settings: Settings) -> list[str]:
    """What reading through ``store`` cost so far: requests, and the disk cache's hit rate."""
    ops = store.metrics.snapshot()
    counts = ", ".join(f"{kind}={s.requests}" for kind, s in sorted(ops.items())) or "none"
    lines = [f"requests this run: {counts}"]
    if not isinstance(store, DiskCachedStore):
        lines.append(f"disk cache: off for this store (disk_cache={settings.disk_cache!r})")
        return lines
    usage = store.cache.usage()
    lines += [
        f"disk cache: on, {store.cache.root}: {usage.files} files, "
        f"{usage.bytes / 2**20:.1f} of {store.cache.max_bytes / 2**20:.0f} MiB",
        f"  this run: {store.metrics.cache_snapshot().describe()}",
    ]
    return lines


def inspect(store: ObjectStore, *, limit: int = 20, settings: Settings | None = None) -> str:
    """A human-readable report of the database at ``store`` (reads only; GC as a dry run).

    Reads go through the stack a reader uses (retries, metrics, and the disk cache where the
    settings enable it: on by default for s3://, gs://, az://), so the report ends with the
    requests it cost and the cache's hit rate for this run. The properties of up to ``limit``
    L0 SSTs are read from their footers: one ranged GET each when not cached.
    """
    settings = settings or Settings()
    store = open_stack(with_external(store, settings), settings)
    lines: list[str] = [f"database: {store.url}"]
    stored = ManifestStore(store).load()
    if stored is None:
        lines.append("no manifest: this location holds no slatepy database")
        return "\n".join(lines)
    tables = TableReader(store, cache_bytes=1 << 20)
    m = stored.manifest
    lines += [
        f"manifest {stored.id} (format {m.format_version})",
        f"  writer_epoch={m.writer_epoch} compactor_epoch={m.compactor_epoch}",
        f"  wal_id_last_compacted={m.wal_id_last_compacted} wal_id_last_seen={m.wal_id_last_seen}",
        f"  max_parallel_writes={m.max_parallel_writes}",
        f"  snapshots: {len(m.snapshots)}",
    ]
    for s in m.snapshots:
        expiry = (
            "never"
            if s.expire_time_s == 0
            else dt.datetime.fromtimestamp(s.expire_time_s, dt.UTC).isoformat()
        )
        kind = f" checkpoint {s.name!r} wal_id={s.wal_id}" if s.kind == "checkpoint" else ""
        held = ""
        if s.kind == CHECKPOINT and (clone := clone_of(s.name)) is not None:
            held = (
                f" (held by the clone {clone}: its GC releases it once the clone's compactions "
                "have rewritten every SST it shares)"
            )
        lines.append(f"    {s.id}{kind} manifest={s.manifest_id} expires={expiry}{held}")
    lines.append(f"L0: {len(m.l0)} SSTs")
    for n, h in enumerate(m.l0):
        lines.append(f"  {h.id} {handles_summary((h,))}")
        if n < limit:
            lines.append(f"    {sst_summary(tables, compacted_path(h.id), size=h.object_size)}")
    referenced = {h.id for h in (*m.l0, *(h for run in m.sorted_runs for h in run.ssts))}
    for e in m.external_dbs:
        used = len(referenced.intersection(e.sst_ids))
        if used:
            lines.append(
                f"  shares {used} SSTs of {e.url} (its checkpoint {e.checkpoint_id}, "
                f"manifest {e.manifest_id})"
            )
        else:  # RFC 0017, "Releasing the source"
            lines.append(
                f"  shares no SST of {e.url} any more: GC releases its checkpoint "
                f"{e.checkpoint_id} there once no active manifest (older ones in their "
                "gc_min_age grace, snapshots, checkpoints) reads one either"
            )
    lines.append(f"sorted runs: {len(m.sorted_runs)} (newest first)")
    lines += [f"  run {run.id}: {handles_summary(run.ssts)}" for run in m.sorted_runs]
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    entries = wal.entries()
    total = sum(meta.size for _, meta in entries)
    if entries:
        lines.append(
            f"WAL: {len(entries)} SSTs, ids {entries[0][0]}..{entries[-1][0]}, {total} bytes"
        )
    else:
        lines.append("WAL: empty")
    shown = entries[-limit:] if limit else []
    if len(entries) > len(shown):
        lines.append(f"  (showing the last {len(shown)})")
    for wal_id, meta in shown:
        lines.append(f"  {wal_id:>8} {sst_summary(tables, meta.path, size=meta.size)}")
    report = GarbageCollector(store, settings=settings).collect(dry_run=True)
    lines.append(
        f"GC would delete {len(report.deletions)} objects, {report.bytes} bytes "
        f"(active manifests {report.active_manifests})"
    )
    reasons = Counter(d.reason for d in report.deletions)
    lines += [f"  {count} x {reason}" for reason, count in sorted(reasons.items())]
    lines += [
        f"GC would release checkpoint {checkpoint_id} in {url} (the clone reads nothing there)"
        for url, checkpoint_id in report.released
    ]
    lines.append(
        f"GC live: {report.live_objects} objects, {human_bytes(report.live_bytes)}; "
        f"{report.held_summary()}"
    )
    lines += run_summary(store, settings)
    return "\n".join(lines)


def verify(store: ObjectStore, *, settings: Settings | None = None) -> tuple[str, int]:
    """``inspect --verify``: read every object reachable from the newest intact manifest,
    the WAL after it and every manifest, check every checksum, and list each bad object with
    the reason. Returns the report and the exit status (1 when anything is bad).

    Reads bypass the disk cache (the store's own bytes are what is checked).

    Raises:
        NotASlatepyDatabase: the location holds someone else's data.
    """
    settings = settings or Settings()
    found = checks.survey(checks.uncached(open_stack(with_external(store, settings), settings)))
    lines = checks.describe(found)
    if not found.manifest_ids:
        lines.append("no manifest: this location holds no slatepy database")
        return "\n".join(lines), 1
    if found.damage:  # not for a newer slatepy's manifest: upgrading is the answer
        lines.append("run `slatepy doctor URL` for what this means and what a repair would give up")
    return "\n".join(lines), 0 if found.healthy else 1


def manifest_summary(store: ObjectStore) -> dict[str, Any] | None:
    """The current manifest's numbers for ``inspect --json`` and ``doctor --json`` (None: no
    manifest there, or none that reads: the report says why)."""
    try:
        stored = ManifestStore(store).load()
    except SlatepyError:  # a damaged database: the doctor's report is the answer
        return None
    if stored is None:
        return None
    m = stored.manifest
    return {
        "id": stored.id,
        "format_version": m.format_version,
        "writer_epoch": m.writer_epoch,
        "compactor_epoch": m.compactor_epoch,
        "wal_id_last_compacted": m.wal_id_last_compacted,
        "wal_id_last_seen": m.wal_id_last_seen,
        "l0": len(m.l0),
        "sorted_runs": len(m.sorted_runs),
        "snapshots": len(m.snapshots),
    }
