"""The garbage collector's I/O: list, read the active manifests, select, delete.

Each deletion is safe on its own, so a collector that crashes half way leaves a database
that is still whole; the next pass finishes the job. Deleting a missing object succeeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from slatepy.config import Settings
from slatepy.errors import CorruptionError, NotFound
from slatepy.gc.describe import describe_held
from slatepy.gc.holds import Hold, HoldSummary, explain_holds, manifest_holds, summarize
from slatepy.gc.rules import (
    Deletion,
    Listing,
    active_manifest_ids,
    checkpoint_wal_limits,
    compacted_id,
    referenced_ssts,
    select_garbage,
    spare_published,
)
from slatepy.gc.shared import OpenSource, Released, needed_shared, prune_shared, to_release
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectMeta, ObjectStore
from slatepy.store.retry import with_retries
from slatepy.store.url import open_store
from slatepy.table.layout import COMPACTED_DIR, WAL_DIR

log = logging.getLogger(__name__)

MANIFEST_CACHE_BYTES = 16 * 1024 * 1024
"""Decoded active manifests a collector keeps between passes: every pass reads each manifest
superseded within ``gc_min_age`` (hundreds, with readers renewing snapshots), and they never
change, so a long-lived collector reads each once."""

Clock = Callable[[], dt.datetime]
SoleUse = Callable[[], AbstractContextManager[Sequence[Manifest] | None]]
"""See ``GarbageCollector``'s ``sole_use`` (RFC 0029)."""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one collection pass found: what it deleted (or would, in a dry run), what it
    held back and why, and what is live.

    ``fence_manifest`` is the manifest the pass wrote before deleting compacted SSTs (None if
    it deleted none); ``current_manifest`` is the one it chose the deletions from. ``holds``
    are the objects the current manifest does not need but the rules keep (RFC 0017);
    ``live_objects``/``live_bytes`` count what the current state needs (referenced by the
    current manifest, WAL not yet compacted). ``now`` is the pass's clock reading.
    """

    current_manifest: int
    active_manifests: list[int]
    deletions: list[Deletion] = field(default_factory=list)
    dry_run: bool = False
    fence_manifest: int | None = None
    holds: tuple[Hold, ...] = ()
    live_objects: int = 0
    live_bytes: int = 0
    now: dt.datetime | None = None
    shared: tuple[tuple[str, int, int], ...] = ()
    """A clone's SSTs that live in other stores: ``(source url, SSTs, bytes)`` the current
    manifest references there (RFC 0017). Not this store's to collect."""
    released: tuple[Released, ...] = ()
    """A clone's checkpoints in its sources that the pass released (a dry run: would
    release), ``(source url, checkpoint id)``: no active manifest reads an SST there any
    more (:mod:`slatepy.gc.shared`)."""

    @property
    def bytes(self) -> int:
        return sum(d.size for d in self.deletions)

    @property
    def held_bytes(self) -> int:
        return sum(h.size for h in self.holds)

    def held(self) -> tuple[HoldSummary, ...]:
        """The holds per reason (per snapshot or checkpoint), see :func:`summarize`."""
        return summarize(self.holds)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """``{kind: (objects, bytes)}`` of the deletions, kinds in a fixed order
        (``wal``, ``compacted``, ``manifest``, ``stray``), kinds with none left out."""
        totals: dict[str, tuple[int, int]] = {}
        for kind in ("wal", "compacted", "manifest", "stray"):
            chosen = [d.size for d in self.deletions if d.kind == kind]
            if chosen:
                totals[kind] = (len(chosen), sum(chosen))
        return totals

    def summary(self) -> str:
        """One line: how many objects and bytes of each kind were (or would be) deleted."""
        verb = "would delete" if self.dry_run else "deleted"
        kinds = ", ".join(
            f"{kind} {count} ({size} B)" for kind, (count, size) in self.by_kind().items()
        )
        return f"{verb} {len(self.deletions)} objects, {self.bytes} bytes" + (
            f": {kinds}" if kinds else ""
        )

    def held_summary(self) -> str:
        """One line: what was held back, by reason, and when it becomes collectable
        (:func:`slatepy.gc.describe.describe_held`)."""
        return describe_held(self.held(), now=self.now)


def shared_ssts(manifest: Manifest) -> tuple[tuple[str, int, int], ...]:
    """``(source url, SSTs, bytes)`` of the SSTs ``manifest`` references in other stores."""
    handles = {h.id: h for h in (*manifest.l0, *(h for r in manifest.sorted_runs for h in r.ssts))}
    found = []
    for external in manifest.external_dbs:
        sizes = [handles[i].object_size for i in external.sst_ids if i in handles]
        if sizes:
            found.append((external.url, len(sizes), sum(sizes)))
    return tuple(found)


class GarbageCollector:
    """Deletes what no active manifest can reach (see :mod:`slatepy.gc.rules`).

    Args:
        min_age: Seconds an unreferenced compacted SST or a temporary must have existed, and a
            superseded manifest must have been superseded, before it is collected. Defaults
            to ``settings.gc_min_age``. It must be at least the ``gc_min_age`` of every
            compactor of the database (a compactor publishes outputs up to half of its own
            ``gc_min_age`` old); a smaller value is only safe when no compactor is running.
        clock: Returns the current UTC time (tests move it forward).
        open_source: How a clone's collector opens its source by URL to release its
            checkpoint there (default: ``open_store`` with these settings, with retries).
        sole_use: For a writer's in-process collector (RFC 0029): a context that yields,
            while no other process can use the database, the manifests its own process
            still reads (its views), else None. Then a pass keeps no grace period for
            superseded manifests and deletes the compacted SSTs they alone named.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        settings: Settings | None = None,
        min_age: float | None = None,
        clock: Clock = utc_now,
        open_source: OpenSource | None = None,
        sole_use: SoleUse | None = None,
    ) -> None:
        settings = settings or Settings()
        self._sole_use = sole_use
        self.store = with_retries(
            store, settings.request_attempts, give_up_after=settings.store_timeout
        )
        self._settings = settings
        self._open_source = open_source or self._open
        self.min_age = settings.gc_min_age if min_age is None else min_age
        self._clock = clock
        self._manifests = ManifestStore(
            self.store, attempts=settings.manifest_update_attempts, cache_bytes=MANIFEST_CACHE_BYTES
        )

    def collect(self, *, dry_run: bool = False) -> GcReport:
        """Run one pass; a real pass logs one INFO line with what it deleted, by kind.

        A location holding no database gets an empty report: the collector writes nothing
        there (it never creates a database).

        Raises:
            CorruptionError: an active manifest is unreadable; nothing is deleted.
        """
        started = time.monotonic()
        # Pending two-phase writes first, so no temporary object a record still needs is old
        # enough to look like a stray. Then time, the current manifest and the listings: an
        # object listed after the manifest was read is either referenced by it or younger
        # than ``now`` says.
        self.store.recover()
        sole = self._sole_use() if self._sole_use and not dry_run else contextlib.nullcontext()
        with sole as in_use:
            return self._collect(dry_run, started, in_use)

    def _collect(
        self, dry_run: bool, started: float, in_use: Sequence[Manifest] | None
    ) -> GcReport:
        now = self._clock()
        current = self._manifests.load()
        if current is None:
            return GcReport(0, [], dry_run=dry_run)
        listing = Listing(
            manifests=self.store.list(self._manifests.objects.directory + "/"),
            wal=self.store.list(WAL_DIR + "/"),
            compacted=self.store.list(COMPACTED_DIR + "/"),
        )
        numbered = [
            (manifest_id, meta)
            for meta in listing.manifests
            if (manifest_id := self._manifests.objects.parse(meta.path)) is not None
        ]
        # Alone (RFC 0029), no other process holds a manifest: no grace for superseded ones.
        grace = self.min_age if in_use is None else 0.0
        active_ids = active_manifest_ids(
            current.id, current.manifest, numbered, now=now, min_age=grace
        )
        active = {i: self._read_active(i, current.id) for i in sorted(active_ids)}
        limits = checkpoint_wal_limits(
            current.id, current.manifest, numbered, now=now, min_age=self.min_age
        )
        deletions = select_garbage(
            listing, current.id, active, now=now, min_age=self.min_age, wal_limits=limits
        )
        if in_use is not None:
            chosen = {d.path for d in deletions}
            deletions += [
                d
                for d in self._superseded_ssts(listing, numbered, current.id, active, in_use)
                if d.path not in chosen
            ]
        fence: int | None = None
        if not dry_run and any(d.kind == "compacted" for d in deletions):
            fence, deletions = self._fence(current.id, deletions)
        holders = manifest_holds(
            current.id, current.manifest, numbered, now=now, min_age=self.min_age
        )
        holds, live = explain_holds(
            listing,
            current.id,
            active,
            holders,
            deletions,
            now=now,
            min_age=self.min_age,
            wal_limits=limits,
        )
        report = GcReport(
            current.id,
            sorted(active),
            deletions,
            dry_run,
            fence,
            tuple(holds),
            len(live),
            sum(m.size for m in live),
            now,
            shared_ssts(current.manifest),
            tuple(to_release(current.manifest, needed_shared(active))) if dry_run else (),
        )
        if not dry_run:
            for deletion in deletions:
                self.store.delete(deletion.path)
            if in_use is None or needed_shared(dict(enumerate(in_use))) <= needed_shared(active):
                # (A view of this process may still read a shared SST: release next pass.)
                report = self._release_sources(report, active, now)
            log.info(
                "gc pass on %s: %s in %.2f s (current manifest %d, %d active%s); %s",
                self.store.url,
                report.summary(),
                time.monotonic() - started,
                current.id,
                len(active),
                "" if fence is None else f", fence manifest {fence}",
                report.held_summary(),
            )
        return report

    def _release_sources(
        self, report: GcReport, active: dict[int, Manifest], now: dt.datetime
    ) -> GcReport:
        """A clone's pass: stop sharing what no active manifest reads and release the
        source checkpoints nothing needs (:mod:`slatepy.gc.shared`). Free for a database
        that is not a clone (no manifest of it has ``external_dbs``)."""
        if not active[report.current_manifest].external_dbs:
            return report
        released = prune_shared(
            self._manifests,
            active,
            decided_on=report.current_manifest,
            now_s=now.timestamp(),
            open_source=self._open_source,
            attempts=self._settings.manifest_update_attempts,
        )
        return dataclasses.replace(report, released=released)

    def _open(self, url: str) -> ObjectStore:
        settings = self._settings
        return with_retries(
            open_store(url, settings),
            settings.request_attempts,
            give_up_after=settings.store_timeout,
        )

    def _fence(self, decided_on: int, deletions: list[Deletion]) -> tuple[int, list[Deletion]]:
        """Write a fence manifest, then spare what the manifests since ``decided_on`` publish.

        A compactor checks its deadline after reading the latest manifest ``n`` and then PUTs
        ``n + 1``, and that PUT may land any time later. Once the fence (a copy of the latest
        manifest) holds id ``f``, every later publish read ``f`` or newer first, so it checked
        its deadline after our clock reading and abandons outputs old enough for us to
        delete; every manifest below ``f`` already exists, and we read those after
        ``decided_on`` here (RFC 0003, "A publish in flight").

        Returns:
            The fence's id and ``deletions`` without what a newer manifest references.
        """
        fenced = self._manifests.update(lambda latest, _: latest)
        newer: list[Manifest] = []
        for manifest_id in range(decided_on + 1, fenced.id):
            try:
                newer.append(self._manifests.read(manifest_id))
            except NotFound:
                # Collected by a concurrent pass: what it referenced is unknown, so this
                # pass deletes no compacted SST (the next one will).
                log.info("gc: manifest %d vanished; keeping compacted SSTs", manifest_id)
                return fenced.id, [d for d in deletions if d.kind != "compacted"]
        return fenced.id, spare_published(deletions, newer)

    def _superseded_ssts(
        self,
        listing: Listing,
        numbered: Sequence[tuple[int, ObjectMeta]],
        current_id: int,
        active: Mapping[int, Manifest],
        in_use: Sequence[Manifest],
    ) -> list[Deletion]:
        """Compacted SSTs that inactive manifests (deleted by this pass) name and nothing
        active or in use does: published, then compacted away, so no compaction or ingest
        is still writing them, and their age does not matter (RFC 0029). SSTs never named
        by a manifest keep the ``min_age`` rule (they may be outputs not yet published)."""
        named: set[str] = set()
        for manifest_id, _ in numbered:
            if manifest_id < current_id and manifest_id not in active:
                with contextlib.suppress(NotFound, CorruptionError):
                    named |= referenced_ssts([self._manifests.read(manifest_id)])
        keep = referenced_ssts([*active.values(), *in_use])
        return [
            Deletion(
                meta.path, meta.size, "compacted SST only superseded manifests used", "compacted"
            )
            for meta in listing.compacted
            if (sst := compacted_id(meta.path)) is not None and sst in named and sst not in keep
        ]

    def _read_active(self, manifest_id: int, current_id: int) -> Manifest:
        try:
            return self._manifests.read(manifest_id)
        except NotFound as exc:
            raise CorruptionError(
                f"gc: active manifest {manifest_id} (current {current_id}) is missing; "
                "refusing to delete anything it might reference"
            ) from exc
