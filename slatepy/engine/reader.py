"""``DbReader``: a read-only view of a database, from any process on any machine.

The seed's reader protocol ("Readers"):

1. Read the current manifest; 2. list the WAL for its contiguous prefix after
``wal_id_last_compacted``; 3-4. write the next manifest with ``wal_id_last_seen`` raised to
that prefix and a new snapshot of that very manifest (start over on a lost CAS: steps 1-2 run
again inside the update, so the listing is never older than the manifest it goes with);
5-6. read compacted SSTs on demand and load the WAL prefix into a memtable.

Then a poller thread, every ``reader_poll_interval`` while it finds something and backing
off to ``reader_max_poll_interval`` while idle (RFC 0021): GETs the next WAL SST by id and
applies the SSTs in id order, stopping at the first missing one (the seed's "wait for the
gap to fill"; a listing now and then, or on :meth:`DbReader.refresh`, finds SSTs beyond a
gap and reports one that never fills); GETs the next manifest by id; when the compacted state
changed, or a third of ``reader_snapshot_ttl`` has passed, registers a new snapshot of the
newest manifest in the same update that removes the old one, adopts it and drops memtable
entries it now covers. ``close`` removes the snapshot; a reader that dies stops protecting
its SSTs when the snapshot expires.

A *read-only* reader (``read_only=True``) is for locations it may not write (read-only
credentials, a read-only mount): it writes nothing at all, so it registers no snapshot and
does not raise ``wal_id_last_seen``. It reads the newest manifest and the WAL after it, and
polls the same way, adopting each newly published compacted state. The cost is the
protection a snapshot gives: only GC's grace period (``gc_min_age``, 1 hour by default)
keeps the garbage collector from deleting SSTs of a manifest it still reads, counted from
when that manifest was superseded. A read-only reader that keeps polling adopts new
manifests within ``reader_poll_interval``, well inside that; one that stops polling (a long
pause, a poll failing for longer than ``gc_min_age``) or a single scan that runs longer may
find SSTs gone. Then ``get`` adopts the newest manifest and retries once, and a scan fails
with ``NotFound``: start it again.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import ClassVar, Protocol, TypeVar

import msgspec

from slatepy.closing import Closing
from slatepy.config import Settings, SettingsLike, resolve_settings
from slatepy.engine import forking
from slatepy.engine.batch import check_key
from slatepy.engine.batched_gets import get_many
from slatepy.engine.clone import with_external
from slatepy.engine.fencing import check_gap
from slatepy.engine.forking import forked_error
from slatepy.engine.iterator import View
from slatepy.engine.malloc import limit_arenas
from slatepy.engine.memtable import Version
from slatepy.engine.snapshot import Snapshot as ReadSnapshot
from slatepy.engine.snapshot import pin_manifest
from slatepy.engine.startup import decode_wal_sst, replay
from slatepy.engine.surface import ReadSurface, as_url
from slatepy.engine.view import (
    get_compacted,
    missing_sst,
    newer_version,
    visible,
)
from slatepy.errors import ClosedError, NotFound, SlatepyError
from slatepy.format.kinds import Operands
from slatepy.manifest.record import Manifest, Snapshot
from slatepy.manifest.store import ManifestStore, StoredManifest
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import MetricsStore, StoreMetrics
from slatepy.store.numbered import NumberedObjects
from slatepy.store.polling import IdleBackoff
from slatepy.store.stack import open_stack
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.merge_operator import MergeOperator, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import Clock, frozen_clock

T = TypeVar("T")

log = logging.getLogger(__name__)


class _AtCheckpoint(Protocol):
    """The constructor of the reader fixed at a checkpoint (``CheckpointReader``)."""

    def __call__(
        self,
        store: MetricsStore,
        settings: Settings,
        checkpoint_id: str,
        /,
        *,
        clock: Clock,
        merge_operator: MergeOperator | None,
    ) -> DbReader: ...


class DbReader(Closing, ReadSurface):
    """Consistent, refreshing reads of a database someone else writes. Use :meth:`open`."""

    at_checkpoint: ClassVar[_AtCheckpoint | None] = None
    """What ``open(..., checkpoint=id)`` builds: ``CheckpointReader``, which registers itself
    here (it subclasses this class, so this module cannot import it without a circle)."""

    def __init__(
        self,
        store: MetricsStore,
        settings: Settings,
        *,
        read_only: bool = False,
        clock: Clock = time.time,
        merge_operator: MergeOperator | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._merging = Merging(merge_operator, clock)
        self._settings = settings
        self._read_only = read_only
        self._manifests = ManifestStore(
            store,
            attempts=settings.manifest_update_attempts,
            probe_window=settings.gc_min_age / 2,
        )
        self._backoff = IdleBackoff(
            settings.reader_poll_interval, settings.reader_max_poll_interval
        )
        self._gap_list_interval = max(3 * settings.reader_gap_timeout, self._backoff.ceiling)
        self._listed_at = time.monotonic()
        self._wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
        self._tables = TableReader(
            store,
            block_cache_bytes=settings.block_cache_bytes,
            meta_cache_bytes=settings.meta_cache_bytes,
            scan_read_ahead_bytes=settings.scan_read_ahead_bytes,
            scan_requests_in_flight=settings.scan_requests_in_flight,
        )
        self._lock = threading.Lock()  # view, memtable and WAL position change together
        self._poll_lock = threading.Lock()
        self._closed = False
        self._forked_from = 0  # the parent's pid, in a child of os.fork()
        self._snapshot_id = ""
        self._registered_at = 0.0
        self._unconfirmed: set[str] = set()
        self._manifest_id = self._checked_manifest_id = 0
        self.error: SlatepyError | None = None
        self._gap_seen: tuple[int, float] | None = None  # (first missing id, first seen)
        if self._manifests.load() is None:
            raise NotFound(f"no slatepy database at {store.url}", path="manifest/")
        stored, tail = self._register()
        first = stored.manifest.wal_id_last_compacted + 1
        try:
            self._view = stored.manifest
            self._memtable, self._wal_max_seq = replay(
                self._wal,
                first,
                tail + 1,
                merging=self._merging,
                ingest_seq=stored.manifest.last_ingest_seq,
                compacted_version=self._compacted_version,
            )
        except SlatepyError:
            self._forget_snapshot()  # a failed open leaves nothing behind (best effort)
            raise
        self._wal_tail = max(tail, first - 1)
        self._adopt(stored)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._run, name="slatepy-reader", daemon=True)
        self._poller.start()
        forking.track(self)

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: SettingsLike = None,
        read_only: bool = False,
        checkpoint: str | None = None,
        clock: Clock | None = None,
        merge_operator: MergeOperator | None = None,
    ) -> DbReader:
        """Open a reader of the database at ``url`` (it must exist; nothing is created).

        Args:
            url: The database's location, or a store instance.
            settings: A ``Settings``, a dict of options or a TOML file path, layered over
                ``SLATEPY_*`` variables and ``$SLATEPY_CONFIG`` (docs/configuration.md).
            read_only: Write nothing to the store: no snapshot is registered, so the reader
                works with read-only access, but what it reads is protected from the garbage
                collector only by ``gc_min_age`` (see the module docstring). Without it the
                reader registers a snapshot (a manifest write on open, on refreshes and on
                close), which protects its view for as long as it lives.
            checkpoint: Read the checkpoint with this id (``Db.create_checkpoint``): a view
                fixed at its manifest and WAL prefix that never polls and writes nothing
                (the checkpoint protects it). ``read_only`` is implied.
            clock: Wall-clock seconds that expiry is judged by (RFC 0019); ``time.time``.
            merge_operator: The database's merge operator (RFC 0019): reading a key that
                holds merge operands without it raises ``InvalidArgument``.

        Raises:
            NotFound: no database (or no bucket) at ``url``; no such live checkpoint.
            InvalidArgument: the URL or settings are unusable.
        """
        settings = resolve_settings(settings)
        if settings.malloc_arena_max is not None:
            limit_arenas(settings.malloc_arena_max)  # before the store starts its threads
        store = open_stack(with_external(as_url(url), settings), settings)  # a clone's SSTs
        clock = clock or time.time
        if checkpoint is not None:
            at_checkpoint = DbReader.at_checkpoint
            assert at_checkpoint is not None, "slatepy.engine registers CheckpointReader"
            return at_checkpoint(
                store, settings, checkpoint, clock=clock, merge_operator=merge_operator
            )
        return cls(store, settings, read_only=read_only, clock=clock, merge_operator=merge_operator)

    @property
    def manifest_id(self) -> int:
        """The manifest this reader's snapshot holds."""
        return self._manifest_id

    @property
    def snapshot_id(self) -> str:
        """The id of this reader's snapshot in the manifest ("" for a read-only reader)."""
        return self._snapshot_id

    @property
    def read_only(self) -> bool:
        """Whether this reader writes nothing (and so holds no snapshot)."""
        return self._read_only

    @property
    def wal_id(self) -> int:
        """The last WAL SST applied (every SST up to it is visible)."""
        return self._wal_tail

    @property
    def view(self) -> Manifest:
        return self._view

    @property
    def metrics(self) -> StoreMetrics:
        return self._store.metrics

    def _compacted_version(self, key: bytes) -> Version | None:
        """The newest version of ``key`` in the view's SSTs (the memtable asks for merge
        operands applied over a version older than an ingestion; rare)."""
        try:
            return get_compacted(self._tables, self._view, key)
        except NotFound as exc:
            raise missing_sst(exc) from exc

    def _version(self, key: bytes) -> tuple[int, bytes] | None:
        """``(seq, value)`` of what a read of ``key`` returns (None: absent, deleted or
        expired); ``seq`` is the newest version's."""
        key = check_key(key)
        self._check_open()
        memtable = self._memtable
        ranges = memtable.ranges  # before the version: see Db._get (no half batch)
        version = memtable.get(key)  # a WAL SST (a batch) is seen whole
        view = self._view
        if version is None or version[0] <= view.last_ingest_seq:
            # No version, or one older than an ingestion, which may hold a newer one.
            found = self._read(lambda v: get_compacted(self._tables, v, key))
            version, view = newer_version(version, found), self._view
        if version is not None and version[1].__class__ is Operands:
            # Merge operands: the memtable and the view taken together (adopting a view
            # prunes the memtable under the same lock), so no operand counts twice.
            with self._lock:
                memtable = self._memtable
                version, view, ranges = memtable.get(key), self._view, memtable.ranges
            found = self._read(lambda v: get_compacted(self._tables, v, key), view)
            version = newer_version(version, found)
            value = visible(
                key, version, ranges, view, self._clock, merging=self._merging, tables=self._tables
            )
        else:
            value = visible(key, version, ranges, view, self._clock)
        return None if value is None or version is None else (version[0], value)

    def _view_for(self, start: bytes, end: bytes | None) -> View:
        with self._lock:
            self._check_open()
            entries = self._memtable.range(start, end)
            view, ranges = self._view, self._memtable.ranges
        return View(self._tables, view, entries, start, end, ranges, self._clock, self._merging)

    def snapshot(self) -> ReadSnapshot:
        """A consistent read view of what this reader sees now, unchanged by its later
        refreshes until released (``close()`` or ``with``).

        It pins the reader's current manifest with a snapshot record of its own (a manifest
        update); a read-only reader writes nothing, so its snapshot is protected from GC
        only by ``gc_min_age``, like the reader itself.
        """
        with self._poll_lock:  # no refresh adopts another view meanwhile
            self._check_open()
            pin = None
            if not self._read_only:
                pin, _ = pin_manifest(
                    self._manifests,
                    self._settings.reader_snapshot_ttl,
                    manifest_id=self._manifest_id,
                )
            with self._lock:
                memtable, view = self._memtable.frozen_copy(), self._view
                seq = max(
                    [view.max_compacted_seq(), view.last_ingest_seq, *self._wal_max_seq.values()]
                )
        return ReadSnapshot(
            url=self._store.url,
            tables=self._tables,
            manifest=view,
            memtable=memtable,
            seq=seq,
            pin=pin,
            clock=frozen_clock(self._clock),
            merging=self._merging,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"manifest_id={self._manifest_id}"
        return f"DbReader({self._store.url!r}, epoch={self._view.writer_epoch}, {state})"

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in the order given (None where absent), from one consistent
        view; each SST is asked once, in a few coalesced GETs (see :meth:`Db.get_many`)."""
        keys = [check_key(k) for k in keys]
        with self._lock:
            self._check_open()
            newer = self._memtable.get_many(keys)
            view = self._view
            ranges = self._memtable.ranges
        return get_many(
            keys,
            newer,
            view,
            ranges,
            read=self._read,
            tables=self._tables,
            clock=self._clock,
            merging=self._merging,
        )

    def _read(self, read: Callable[[Manifest], T], view: Manifest | None = None) -> T:
        """``read(view)`` (the current view by default; adopting one sets the view, then
        prunes the memtable). A missing SST is damage when our snapshot protects the view; a
        read-only reader has none, and GC may have collected a view older than
        ``gc_min_age``: it catches up once and reads again."""
        try:
            return read(self._view if view is None else view)
        except NotFound as exc:
            if not self._read_only:
                raise missing_sst(exc) from exc
        self.refresh()
        try:
            return read(self._view)
        except NotFound as exc:
            raise missing_sst(exc) from exc

    def refresh(self) -> None:
        """Poll now: apply new WAL SSTs and adopt a newer compacted state if there is one.

        Unlike the background poll it lists the manifests, and the WAL when the next SST is
        missing, so a gap (and a lost SST, once ``reader_gap_timeout`` has passed) is seen at
        once, and so is a newer manifest whose predecessors a collector run with a shorter
        ``gc_min_age`` than ours has already deleted."""
        self._check_open()
        self._poll(thorough=True)

    def _poll(self, *, thorough: bool) -> bool:
        """One poll; returns whether it found anything new (a WAL SST or a manifest)."""
        with self._poll_lock:
            # The compacted state first: it moves the WAL position past what was compacted
            # (and maybe collected), so the WAL read next starts where it must.
            # A renewal of our own snapshot is no news: it must not end an idle back-off.
            changed = self._compaction_published(thorough=thorough)
            if changed or self._snapshot_due():
                self._adopt(self._register(self._wal_tail)[0])
            applied = self._apply_new_wal(thorough=thorough)
            if applied is None:
                # Collected under us (our snapshot lapsed): a fresh snapshot covers it.
                self._adopt(self._register()[0])
                applied = self._apply_new_wal(thorough=True)
                if applied is None:
                    raise NotFound("WAL SSTs vanish faster than this reader can catch up")
            return changed or applied > 0

    def _apply_new_wal(self, *, thorough: bool) -> int | None:
        """Apply the contiguous WAL after the tail; return how many SSTs were applied, or
        None if a listed SST was collected before it could be read.

        The next SST is probed with a GET, so a poll that finds nothing costs one GET rather
        than a LIST. SSTs beyond a gap (a write still in flight, or one that was lost) can only
        be found by listing: done when the probe misses and ``thorough``, while a gap is
        being watched, or every ``gap_list_interval`` otherwise."""
        applied = 0
        while (data := self._wal.probe(self._wal_tail + 1)) is not None:
            self._apply_sst(self._wal_tail + 1, data)
            applied += 1
        now = time.monotonic()
        if not (thorough or self._gap_seen or now - self._listed_at >= self._gap_list_interval):
            return applied
        self._listed_at = now
        expected = self._wal_tail + 1
        for wal_id in self._wal.ids(after=self._wal_tail):
            if wal_id != expected:
                self._check_gap(range(expected, wal_id))
                return applied  # a gap: a parallel write still in flight; wait for it
            try:
                data = self._wal.read(wal_id)
            except NotFound:
                return None
            self._apply_sst(wal_id, data)
            applied += 1
            expected += 1
        self._gap_seen = None
        return applied

    def _apply_sst(self, wal_id: int, data: bytes) -> None:
        # Decode (and so checksum) the whole SST before applying any of it: a damaged block
        # must not leave the blocks before it (part of a batch) applied.
        meta, entries = decode_wal_sst(self._wal.path(wal_id), data)
        with self._lock:  # one SST at a time, so a batch is seen whole or not at all
            # Before any of it is applied: a failed lookup leaves the SST to the next poll.
            bases = self._memtable.ingested_bases(entries)
            self._memtable.apply(entries, meta.props.range_tombstones, bases)
            self._wal_max_seq[wal_id] = meta.props.max_seq
            self._wal_tail = wal_id

    def _check_gap(self, gap: range) -> None:
        """Wait for a WAL gap a writer may still be filling; report one that nobody can
        (:func:`~slatepy.engine.fencing.check_gap`, timed from when this gap was first seen).

        Raises:
            CorruptionError: naming the first missing WAL SST.
        """
        now = time.monotonic()
        if self._gap_seen is None or self._gap_seen[0] != gap.start:
            self._gap_seen = (gap.start, now)
        lasted, timeout = now - self._gap_seen[1], self._settings.reader_gap_timeout
        check_gap(self._wal, gap, self._view, self._manifests, lasted=lasted, timeout=timeout)

    def _snapshot_due(self) -> bool:
        if self._read_only:
            return False  # no snapshot to renew; published compactions are adopted anyway
        return time.monotonic() - self._registered_at > self._settings.reader_snapshot_ttl / 3

    def _compaction_published(self, *, thorough: bool) -> bool:
        stored = self._manifests.load() if thorough else self._manifests.poll()
        if stored is None or stored.id == self._checked_manifest_id:
            return False
        self._checked_manifest_id = stored.id
        m = stored.manifest
        v = self._view
        return (m.wal_id_last_compacted, m.l0, m.sorted_runs) != (
            v.wal_id_last_compacted,
            v.l0,
            v.sorted_runs,
        )

    def _register(self, applied: int | None = None) -> tuple[StoredManifest, int]:
        """Steps 1-4: a snapshot of the newest manifest; returns it and the WAL prefix end.

        ``applied`` is the WAL tail a running reader has applied: a contiguous prefix it has
        read, so a renewal reports it as seen instead of listing the WAL again (the poll that
        follows finds anything newer). The update also removes every snapshot of ours whose
        registration had an unknown outcome: if such a write landed, it removed our previous
        snapshot, so until a registration is confirmed the next refresh registers again. A
        read-only reader only reads the newest manifest and lists the WAL after it (steps
        1-2).
        """
        if self._read_only:
            return self._observe(applied)
        new_id, old_ids = uuid.uuid4().hex, {self._snapshot_id, *self._unconfirmed}
        tail = 0

        def add_snapshot(m: Manifest, next_id: int) -> Manifest:
            nonlocal tail
            if applied is not None:
                tail = max(applied, m.wal_id_last_compacted)
            else:
                found = self._wal.contiguous_tail(m.wal_id_last_compacted)
                tail = m.wal_id_last_compacted if found is None else found
            now = time.time()
            expiry = int(now + self._settings.reader_snapshot_ttl) + 1
            m = m.without_expired_snapshots(now)
            for old_id in old_ids:
                m = m.without_snapshot(old_id)
            m = m.with_snapshot(Snapshot(new_id, next_id, expiry))
            return msgspec.structs.replace(m, wal_id_last_seen=max(m.wal_id_last_seen, tail))

        try:
            stored = self._manifests.update(add_snapshot)
        except SlatepyError:
            self._unconfirmed.add(new_id)
            self._registered_at = -math.inf  # register again on the next refresh
            raise
        self._unconfirmed.clear()
        self._snapshot_id = new_id
        self._registered_at = time.monotonic()
        return stored, tail

    def _observe(self, applied: int | None = None) -> tuple[StoredManifest, int]:
        """The newest manifest and the end of the contiguous WAL after it, writing nothing.

        Listed after the manifest was read, so the listing is never older than the manifest
        it goes with (as in ``_register``); a running reader passes its ``applied`` tail
        instead of listing.
        """
        stored = self._manifests.poll()
        if stored is None:
            raise NotFound(f"no slatepy database at {self._store.url}", path="manifest/")
        first = stored.manifest.wal_id_last_compacted
        if applied is not None:
            self._registered_at = time.monotonic()
            return stored, max(applied, first)
        found = self._wal.contiguous_tail(first)
        self._registered_at = time.monotonic()
        return stored, first if found is None else found

    def _adopt(self, stored: StoredManifest) -> None:
        """Make ``stored`` the view; drop memtable entries it has compacted and skip the WAL
        SSTs it covers that were never applied."""
        cutoff = stored.manifest.wal_id_last_compacted
        with self._lock:
            self._view = stored.manifest
            self._manifest_id = self._checked_manifest_id = stored.id
            compacted = [i for i in self._wal_max_seq if i <= cutoff]
            if compacted:
                self._memtable.prune(max(self._wal_max_seq[i] for i in compacted))
                for i in compacted:
                    del self._wal_max_seq[i]
            try:
                self._memtable.adopt_ingestion(stored.manifest.last_ingest_seq)
            except SlatepyError as exc:  # tried again at the next adoption
                log.warning("re-folding merges over a new ingestion failed: %s", exc)
            self._wal_tail = max(self._wal_tail, cutoff)

    def _run(self) -> None:
        while not self._stop.wait(self._backoff.current):
            try:
                self._check_open()
                self._backoff.polled(changed=self._poll(thorough=False))
                self.error = None
            except ClosedError:
                return
            except SlatepyError as exc:
                self.error = exc
                log.warning("reader poll failed, retrying next interval: %s", exc)

    def close(self) -> None:
        """Stop polling and remove the snapshot, if any (so GC may collect what it protected)."""
        if self._forked_from:
            return  # the parent's reader: the parent closes it
        forking.untrack(self)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if threading.current_thread() is not self._poller:
            self._poller.join()
        with self._poll_lock:
            self._forget_snapshot()
        self._store.drain()

    def _forget_snapshot(self) -> None:
        """Remove our snapshot from the manifest (a read-only reader has none)."""
        snapshot_id = self._snapshot_id
        if not self._read_only:
            self._manifests.update(
                lambda m, _: (
                    m.without_snapshot(snapshot_id)
                    if any(s.id == snapshot_id for s in m.snapshots)
                    else None
                )
            )

    def _mark_forked(self, parent_pid: int) -> None:
        """In a child of ``os.fork()`` (:mod:`slatepy.engine.forking`): unusable here, and
        closing it must not remove the parent's snapshot."""
        self._forked_from = parent_pid
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            if self._forked_from:
                raise forked_error(f"the reader of {self._store.url}", self._forked_from)
            raise ClosedError("the reader is closed; open a new one")
