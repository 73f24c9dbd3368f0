"""``Db``: the writer's public API (sync). See ``slatepy.aio`` for the asyncio facade.

This module opens and builds a ``Db``; its jobs live in modules of their own, one mixin each
over the fields :class:`~slatepy.engine.db_state.DbState` declares: writes
(:mod:`~slatepy.engine.db_writes`), reads, snapshots and transactions
(:mod:`~slatepy.engine.db_reads`), following the manifest and checkpoints
(:mod:`~slatepy.engine.db_manifest`), and flush/close/exit/fork
(:mod:`~slatepy.engine.db_lifecycle`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from slatepy.closing import Closing
from slatepy.config import Settings, SettingsLike, resolve_settings
from slatepy.engine import forking
from slatepy.engine.clone import with_external
from slatepy.engine.db_lifecycle import (
    OPEN_DATABASES,
    Lifecycle,
    weak_call,
    weak_callback,
    weak_sole_use,
)
from slatepy.engine.db_manifest import ManifestAdoption
from slatepy.engine.db_reads import Reads
from slatepy.engine.db_writes import Writes
from slatepy.engine.embedded import LiveViews, embedded_gc
from slatepy.engine.malloc import fix_mmap_threshold, limit_arenas
from slatepy.engine.startup import start_writer
from slatepy.engine.surface import ReadSurface, WriteSurface, as_url
from slatepy.engine.txn import ConflictTracker
from slatepy.engine.wal import WalWriter
from slatepy.errors import (
    NotFound,
)
from slatepy.manifest.store import ManifestStore
from slatepy.store.attach import Attachment, attachment_of
from slatepy.store.base import ObjectStore
from slatepy.store.disk_cache import DiskCachedStore
from slatepy.store.metrics import MetricsStore, StoreMetrics
from slatepy.store.numbered import NumberedObjects
from slatepy.store.stack import open_stack
from slatepy.store.url import open_store
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from slatepy.table.merge_operator import MergeOperator, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import Clock

if TYPE_CHECKING:
    from slatepy.compactor import BackgroundCompactor


log = logging.getLogger(__name__)


class Db(Lifecycle, Reads, Writes, ManifestAdoption, Closing, ReadSurface, WriteSurface):
    """An embedded key-value database whose state lives in an object store.

    There is one writer per database: opening a ``Db`` fences every older writer of the same
    URL (their later writes fail with ``FencedError``). Reads see this process's own writes,
    durable or not. Use :meth:`open`; the constructor is internal.
    """

    def __init__(
        self,
        store: MetricsStore,
        settings: Settings,
        manifests: ManifestStore,
        clock: Clock = time.time,
        merge_operator: MergeOperator | None = None,
        *,
        attachment: Attachment | None = None,
    ) -> None:
        if settings.malloc_mmap_threshold is not None:
            fix_mmap_threshold(settings.malloc_mmap_threshold)
        self._store = store
        self._attachment = attachment
        self._settings = settings
        self._clock = clock
        self._merging = Merging(merge_operator, clock)
        self._lock = threading.Lock()
        self._views = LiveViews()  # what this process reads, for its collector (RFC 0029)
        self._closed = False
        self._refused = False  # closed, or the writer failed: reads check why (_check_readable)
        self._forked_from = 0  # the parent's pid, in a child of os.fork()
        store.recover()  # finish writes a crashed process left half done (two-phase CAS)
        start = start_writer(store, manifests, settings, self._merging)
        self._manifests = manifests
        self._tables = TableReader(
            store,
            block_cache_bytes=settings.block_cache_bytes,
            meta_cache_bytes=settings.meta_cache_bytes,
            scan_read_ahead_bytes=settings.scan_read_ahead_bytes,
            scan_requests_in_flight=settings.scan_requests_in_flight,
        )
        self._view = start.manifest
        self._view_time = time.monotonic()
        self._stale_view_seconds = settings.gc_min_age / 4
        self._replayed_max_seq = dict(start.wal_max_seq)
        self._memtable = start.memtable
        self._memtable.compacted_version = self._compacted_version
        # Writers assign even seqs only, so an ingestion's (odd) global seq fits strictly
        # between the writes before it and after it (RFC 0016): start at an even number.
        self._seq = start.last_seq + start.last_seq % 2
        self.replayed_ssts = start.replayed_ssts
        self._wal = WalWriter(
            NumberedObjects(store, WAL_DIR, WAL_SUFFIX),
            epoch=start.epoch,
            next_id=start.fence_id + 1,
            settings=settings,
            merging=self._merging,
        )
        self._wal.on_failure = weak_call(self._writer_failed)
        self._txns = ConflictTracker()  # newest write seqs while transactions are open
        budget, retain = settings.max_unflushed_bytes, settings.memtable_retain_bytes
        self._retain_bytes = budget // 2 if retain is None else retain
        # See _backpressure: half of what kept versions leave of the budget. Kept versions
        # never pass retain_bytes, so beyond this much at least a quarter is not compacted.
        self._wake_bytes = self._retain_bytes + (budget - self._retain_bytes) // 2
        self._pruned = threading.Event()  # set when a new view pruned the memtable
        self._compactor: BackgroundCompactor | None = None
        if settings.compactor == "in-process":
            # The one upward import: the writer composes a compactor when asked to
            # (RFC 0003). Imported lazily so the engine does not depend on it otherwise.
            from slatepy.compactor import BackgroundCompactor, Compactor
            from slatepy.gc import GarbageCollector

            self._compactor = BackgroundCompactor(
                # Compaction reads what it is about to replace: not worth the disk cache.
                Compactor(
                    store.uncached() if isinstance(store, DiskCachedStore) else store,
                    settings=embedded_gc(settings, attachment),
                    expiry_clock=clock,
                    merge_operator=merge_operator,
                ),
                gc=GarbageCollector(store, settings=settings, sole_use=weak_sole_use(self)),
                on_publish=weak_callback(self._adopt_published),
            )
        OPEN_DATABASES.add(self)
        forking.track(self)

    _opened = False
    """Set once :meth:`open` returned the database to a caller (``__del__`` warns only then)."""

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: SettingsLike = None,
        create_if_missing: bool = True,
        clock: Clock | None = None,
        merge_operator: MergeOperator | None = None,
    ) -> Db:
        """Open the database at ``url`` and become its writer, creating it if allowed.

        This is the only call that creates a database (its first manifest, and for
        ``file://`` the directory): readers, the compactor, the garbage collector and the
        CLI's admin commands refuse a location without one.

        Logs at INFO when done: the epoch, the WAL SSTs replayed and the time taken.

        Args:
            url: ``memory://`` (a new store private to this call), ``file:///abs/path``,
                ``s3://bucket/prefix``, ``gs://…``, ``az://…``, or an ``ObjectStore``
                instance (pass the same instance to readers to share a ``memory://`` store),
                or a local directory as a ``pathlib.Path``.
            settings: A ``Settings``, a dict of options or a TOML file path, layered over
                ``SLATEPY_*`` variables and ``$SLATEPY_CONFIG`` (docs/configuration.md).
            clock: Wall-clock seconds since the epoch that TTLs are counted on (RFC 0019);
                ``time.time`` by default (tests inject one). Not a setting: a callable has
                no TOML or environment form.
            merge_operator: ``(key, existing, operands) -> bytes``, what :meth:`merge`
                operands become (RFC 0019; ``slatepy.table.merge_operator``). Readers and
                compactors of the database need the same one. Not a setting, for the same
                reason as ``clock``.
            create_if_missing: With False, a location holding no database raises
                ``NotFound`` instead of getting a new, empty one (a mistyped URL stays a
                mistake).

        Raises:
            InvalidArgument: the URL or settings are unusable.
            NotFound: the bucket does not exist, or there is no database and
                ``create_if_missing`` is False.
            StoreUnavailable: the store did not answer within ``store_timeout`` (or failed
                ``request_attempts`` times); the message names the request and the store.
            FencedError: a newer writer opened the database while this one was starting.
        """
        started = time.monotonic()
        settings = resolve_settings(settings)
        if settings.malloc_arena_max is not None:
            limit_arenas(settings.malloc_arena_max)  # before the store starts its threads
        url = as_url(url)
        target = url
        if not isinstance(url, ObjectStore):
            target = open_store(url, settings, create=create_if_missing)
        # A clone reads the SSTs it shares from its source's store (RFC 0017).
        store = open_stack(with_external(target, settings), settings)
        manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
        if not create_if_missing and manifests.load() is None:
            raise NotFound(
                f"no slatepy database at {store.url} (no manifest); "
                "open with create_if_missing=True to create one",
                path="manifest/",
            )
        db = cls(
            store,
            settings,
            manifests,
            clock or time.time,
            merge_operator,
            # Only a store this call opened: one the caller passed may be shared in-process.
            attachment=None
            if isinstance(url, ObjectStore) or not settings.gc_when_alone
            else attachment_of(target),
        )
        db._opened = True
        if db._attachment is not None:
            db._attachment.adopt()
        log.info(
            "opened %s%s as writer epoch %d in %.3f s: replayed %d WAL SSTs "
            "(%d keys; wal_id_last_compacted=%d), next WAL id %d",
            db.url,
            " (new database)" if db.epoch == 1 else "",
            db.epoch,
            time.monotonic() - started,
            db.replayed_ssts,
            len(db._memtable),
            db.wal_id_last_compacted,
            db.next_wal_id,
        )
        return db

    @property
    def url(self) -> str:
        return self._store.url

    @property
    def epoch(self) -> int:
        """This writer's epoch."""
        return self._wal.epoch

    @property
    def metrics(self) -> StoreMetrics:
        """Object-store requests made by this database so far."""
        return self._store.metrics

    @property
    def wal_id_last_compacted(self) -> int:
        """The WAL prefix that compaction has folded into the read view's SSTs."""
        return self._view.wal_id_last_compacted

    @property
    def next_wal_id(self) -> int:
        return self._wal.next_id

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch={self.epoch}"
        return f"Db({self.url!r}, {state})"
