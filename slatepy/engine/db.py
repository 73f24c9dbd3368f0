"""``Db``: the writer's public API (sync). See ``slatepy.aio`` for the asyncio facade."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, TypeVar

from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE, Settings, SettingsLike, resolve_settings
from slatepy.engine import checkpoint as checkpoints
from slatepy.engine import forking
from slatepy.engine.batch import (
    PutColumns,
    WriteBatch,
    check_delete_range,
    check_key,
    check_ttl,
    check_value,
    expiring,
)
from slatepy.engine.checkpoint import Checkpoint
from slatepy.engine.clone import with_external
from slatepy.engine.closing import Closing
from slatepy.engine.embedded import LiveViews, TrackedView, alone, embedded_gc
from slatepy.engine.forking import forked_error
from slatepy.engine.iterator import View
from slatepy.engine.locks import acquire
from slatepy.engine.memtable import Memtable, Version
from slatepy.engine.snapshot import Snapshot, pin_manifest
from slatepy.engine.startup import start_writer
from slatepy.engine.surface import ReadSurface, WriteSurface, as_url
from slatepy.engine.txn import ConflictTracker, Isolation, Transaction, check_isolation
from slatepy.engine.view import (
    get_compacted,
    get_many_compacted,
    missing_sst,
    newer_version,
    values_of,
    view_ranges,
    visible,
)
from slatepy.engine.wal import WalWriter
from slatepy.errors import (
    ClosedError,
    InvalidArgument,
    ManifestConflictError,
    NotFound,
    SlatepyError,
    WritesLost,
    WriteStalled,
)
from slatepy.format.block import Entry
from slatepy.format.kinds import Operands, RangeTombstone
from slatepy.manifest.record import Manifest
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
from slatepy.table.visibility import EMPTY, Clock, frozen_clock, now_ms

if TYPE_CHECKING:
    from slatepy.compactor import BackgroundCompactor

T = TypeVar("T")

_KEY, _VALUE = itemgetter(0), itemgetter(1)
_TOMBSTONE = type(None)

STALL_POLL_SECONDS = 0.05
SNAPSHOT_ATTEMPTS = 5
SEQ_STEP = 2
"""Writers assign even seqs only; ingestions take the odd ones between (RFC 0016)."""

log = logging.getLogger(__name__)
_OPEN: weakref.WeakSet[Db] = weakref.WeakSet()
"""Databases not closed yet, so that interpreter exit can flush what they buffered."""


@atexit.register
def _flush_open_databases() -> None:
    for db in list(_OPEN):
        db._flush_at_exit()


class Db(Closing, ReadSurface, WriteSurface):
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
        self._wal.on_failure = _weak_call(self._writer_failed)
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
                gc=GarbageCollector(store, settings=settings, sole_use=_weak_sole_use(self)),
                on_publish=_weak_callback(self._adopt_published),
            )
        _OPEN.add(self)
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

    def put(
        self,
        key: bytes,
        value: bytes,
        *,
        await_durable: bool = True,
        ttl: float | None = None,
    ) -> None:
        """Set ``key`` to ``value``; with ``await_durable`` return only once it is in the WAL.

        With ``ttl`` (seconds; else ``Settings.default_ttl``) the value reads as absent once
        that much time has passed on the database's clock, and compaction drops it
        (RFC 0019).
        """
        # check_key/check_value's fast paths inlined: the single put is the hottest call.
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_SIZE:
            key = check_key(key)
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE:
            value = check_value(value)
        ttl = self._settings.default_ttl if ttl is None else check_ttl(ttl)
        if ttl is not None:
            value = expiring(value, ttl, now_ms(self._clock))
        self._apply_one(key, value, await_durable)

    def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        """Remove ``key`` (a tombstone until compaction drops it)."""
        self._apply_one(check_key(key), None, await_durable)

    def merge(self, key: bytes, operand: bytes, *, await_durable: bool = True) -> None:
        """Add ``operand`` to ``key``: reads see the merge operator's result of every operand
        written since the key's last put or delete, over that value (RFC 0019).

        Raises:
            InvalidArgument: no merge operator was given to :meth:`open`.
        """
        key, operand = check_key(key), check_value(operand)
        if self._merging.operator is None:
            raise InvalidArgument(
                "merge() needs a merge operator: open the database with "
                "Db.open(url, merge_operator=fn), fn(key, existing, operands) -> bytes"
            )
        self._apply([(key, Operands.of([operand]))], await_durable)

    def delete_range(self, start: bytes, end: bytes, *, await_durable: bool = True) -> None:
        """Remove every key ``start <= key < end`` (a range tombstone until compaction at the
        bottom level drops it with what it covers; RFC 0019).

        Raises:
            InvalidArgument: ``start >= end``, or a bound is not a valid key.
        """
        self._apply([], await_durable, check_delete_range(start, end))

    def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        """Apply a batch atomically: after a crash either all of it is there or none."""
        if not isinstance(batch, WriteBatch):
            raise InvalidArgument(f"write() takes a WriteBatch, got {type(batch).__name__}")
        if len(batch):
            written_ms, default_ttl = now_ms(self._clock), self._settings.default_ttl
            # Puts alone (the common batch) go as columns: no merges to look for, no ops to
            # split again (see _append_puts).
            puts = batch.puts_at(written_ms, default_ttl)
            if puts is not None:
                self._apply(puts, await_durable)
                return
            if batch.has_merges and self._merging.operator is None:
                raise InvalidArgument(
                    "the batch merges, which needs a merge operator: open the database with "
                    "Db.open(url, merge_operator=fn)"
                )
            ops = batch.ops_at(written_ms, default_ttl)
            self._apply(ops, await_durable, *batch.ranges)

    def _apply(
        self,
        ops: Sequence[tuple[bytes, bytes | None]],
        await_durable: bool,
        *ranges: tuple[bytes, bytes],
        check: Callable[[], None] | None = None,
    ) -> None:
        """Write ``ops`` and the range deletes ``ranges`` as one atomic batch; ``check`` (a
        transaction's validation) runs under the writer's lock just before, so no write lands
        between it and the batch."""
        self._backpressure()
        acquire(self._lock)  # not ``with``: see slatepy.engine.locks
        try:
            self._check_open()
            self._wal.check()
            if check is not None:
                check()
            self._seq += SEQ_STEP
            seq = self._seq
            if self._txns.open:
                self._txns.record(ops, seq)
                if ranges:
                    self._txns.record_ranges(ranges, seq)
            generation = None
            if not ranges and len(ops) > 1:
                generation = self._append_puts(ops, seq, await_durable)
            if generation is None:
                entries: list[Entry] = [(key, seq, value) for key, value in ops]
                # Before the WAL has it: a failed lookup must fail the write whole.
                bases = self._memtable.ingested_bases(entries)
                if ranges:
                    tombstones = [RangeTombstone(start, end, seq) for start, end in ranges]
                    generation = self._wal.append(entries, awaited=await_durable, ranges=tombstones)
                    self._memtable.apply(entries, tombstones, bases)
                else:
                    # One WAL generation holds the whole batch, so it lands in one SST.
                    generation = self._wal.append(entries, awaited=await_durable)
                    self._memtable.apply(entries, (), bases)
        finally:
            self._lock.release()
        if await_durable:
            self._wal.flush(generation, only_this=True)

    def _append_puts(
        self, ops: Sequence[tuple[bytes, bytes | None]], seq: int, await_durable: bool
    ) -> int | None:
        """Add a batch to the WAL buffer and the memtable if it holds only puts (no deletes
        or merges): one dict of versions updates both at C speed, the last op on a key
        winning as entry by entry. Returns the WAL generation, or None (not only puts:
        nothing done). Called under the writer's lock."""
        if isinstance(ops, PutColumns):  # puts alone, split already (WriteBatch.puts_at)
            keys, values = ops.keys, ops.values
        else:
            values = list(map(_VALUE, ops))
            kinds = set(map(type, values))
            if _TOMBSTONE in kinds or Operands in kinds:
                return None
            keys = list(map(_KEY, ops))
        versions: dict[bytes, Version] = dict(
            zip(keys, zip(repeat(seq), values))  # noqa: B905 (repeat is endless)
        )
        payload = sum(map(len, keys)) + sum(map(len, values))
        generation = self._wal.append_versions(versions, len(keys), payload, awaited=await_durable)
        # Without a key written twice, the versions hold every key and value: their payload.
        self._memtable.apply_versions(versions, payload if len(versions) == len(keys) else None)
        return generation

    def _apply_one(self, key: bytes, value: bytes | None, await_durable: bool) -> None:
        """:meth:`_apply` of one put or delete (not a merge, not in a transaction's commit),
        without building a batch: the path of every single write, whose one version tuple
        goes to both the WAL buffer and the memtable."""
        compactor, memtable = self._compactor, self._memtable
        # _backpressure's conditions, tested here first: most writes have nothing to do.
        if (compactor is not None and compactor.backoff.idle) or (
            memtable.size_bytes >= self._wake_bytes
        ):
            self._backpressure()
        lock = self._lock
        if not lock.acquire(False):  # acquire()'s first try, inlined: this path is hot
            acquire(lock)
        try:
            if self._closed:
                self._check_open()
            seq = self._seq + SEQ_STEP
            version = (seq, value)
            # Before anything changes: raises the WAL's fatal error, as _apply's check does.
            generation = self._wal.append_version(key, version, await_durable)
            self._seq = seq
            if self._txns.open:
                self._txns.record(((key, value),), seq)
            memtable.put_version(key, version)
        finally:
            lock.release()
        if await_durable:
            self._wal.flush(generation, only_this=True)

    def _backpressure(self) -> None:
        """Before a write: keep the compactor busy while writes come, and wait while the
        memtable holds ``max_unflushed_bytes`` or more."""
        unflushed = self._memtable.size_bytes
        compactor = self._compactor
        if compactor is not None:
            if compactor.backoff.idle:  # writes again after an idle spell: compact soon
                compactor.note_activity()
            if unflushed >= self._wake_bytes:
                # Half the budget left by kept versions used: compact now rather than at the
                # next interval, so writes seldom reach the bound and wait (the compactor
                # wakes at most once per flush_interval, when WAL SSTs it can compact may
                # exist).
                compactor.wake(min_interval=self._settings.flush_interval)
        if unflushed >= self._settings.max_unflushed_bytes:
            self._wait_for_compaction()

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default`` if it is absent or deleted."""
        value = self._get(key)
        return default if value is None else value

    def _get(self, key: bytes) -> bytes | None:
        # The hottest read: check_key's, _check_open's and _refresh_stale_view's fast paths
        # inlined, as put does.
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_SIZE:
            key = check_key(key)
        if self._refused:
            self._check_readable()
        if time.monotonic() - self._view_time > self._stale_view_seconds:
            self.refresh()
        # The range tombstones before the version: a batch [delete_range, put] landing
        # between the two must not leave the old version under the new tombstone (a half
        # batch, issue 29); an older set of tombstones with a newer version is a whole state.
        ranges = self._memtable.ranges
        version = self._memtable.get(key)  # a batch is seen whole (Memtable.apply)
        # The view is read after the memtable: a refresh installs the new view before it
        # prunes the memtable, so a pruned key is always in the view read here.
        view = self._view
        if version is not None and version[0] > view.last_ingest_seq:
            value = version[1]
            if value.__class__ is bytes and ranges is EMPTY and view_ranges(view) is EMPTY:
                return value
            if value.__class__ is not Operands:
                return visible(key, version, ranges, view, self._clock)
            return self._get_merged(key)
        # No version, or one older than an ingestion, which may hold a newer one. Read
        # directly (no closure per get); a gone SST goes through _read's refresh and retry.
        try:
            found = get_compacted(self._tables, view, key)
        except NotFound:
            found = self._read(lambda v: get_compacted(self._tables, v, key), view)
        # close() empties the memtable: a get it raced may have missed a key there.
        if self._closed:
            self._check_open()
        if found is not None and (version is None or found[0] > version[0]):
            version = found  # newer_version, inlined
        if version is not None:
            value = version[1]
            if value.__class__ is bytes and ranges is EMPTY and view_ranges(self._view) is EMPTY:
                return value  # a plain value nothing can cover: what visible() would return
            if value.__class__ is Operands:
                return self._get_merged(key)
        return visible(key, version, ranges, self._view, self._clock)

    def _get_merged(self, key: bytes) -> bytes | None:
        """A get of a key holding merge operands: its versions folded (RFC 0019). The
        memtable and the view are taken together, under the lock that adopting a view and
        pruning the memtable hold, so no operand is counted in both."""
        with self._lock:
            self._check_readable()
            version = self._memtable.get(key)
            view = self._view
            ranges = self._memtable.ranges
        found = self._read(lambda v: get_compacted(self._tables, v, key), view)
        return visible(
            key,
            newer_version(version, found),
            ranges,
            view,
            self._clock,
            merging=self._merging,
            tables=self._tables,
        )

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in the order given (None where absent or deleted), all from
        one consistent view (a write batch is seen whole or not at all).

        Cheaper than a :meth:`get` per key when the keys miss the caches: each SST is asked
        once for all of its keys, and the index partitions and blocks they need are read in
        a few coalesced ranged GETs sent together, not one or two GETs per key.
        """
        keys = [check_key(k) for k in keys]
        self._refresh_stale_view()
        with self._lock:
            self._check_readable()
            newer = self._memtable.get_many(keys)
            view = self._view
            ranges = self._memtable.ranges
        rest = sorted(
            {
                k
                for k, v in zip(keys, newer, strict=True)
                if v is None or v[0] < view.last_ingest_seq
            }
        )
        found = self._read(lambda v: get_many_compacted(self._tables, v, rest), view)
        return values_of(
            keys,
            newer,
            found,
            ranges=ranges,
            view=view,
            clock=self._clock,
            merging=self._merging,
            tables=self._tables,
        )

    def _read(self, read: Callable[[Manifest], T], view: Manifest) -> T:
        """``read(view)``; if an SST of ``view`` is gone (a view older than GC's grace period),
        adopt the current manifest and read again. Gone from that one too: damage."""
        try:
            return read(view)
        except NotFound:
            self.refresh()
        try:
            return read(self._view)
        except NotFound as exc:
            raise missing_sst(exc) from exc

    def _view_for(self, start: bytes, end: bytes | None) -> View:
        self._refresh_stale_view()
        with self._lock:
            self._check_readable()
            entries = self._memtable.range(start, end)
            view, ranges = self._view, self._memtable.ranges
            return self._views.track(
                TrackedView(
                    self._tables, view, entries, start, end, ranges, self._clock, self._merging
                )
            )

    def _sole_use(self) -> contextlib.AbstractContextManager[list[Manifest] | None]:
        """For the collector: while this process alone has the database open, the
        manifests it reads (RFC 0029)."""
        return alone(self._attachment, self._lock, lambda: [self._view, *self._views.manifests()])

    def _version(self, key: bytes) -> Version | None:
        key = check_key(key)
        self._check_readable()
        self._refresh_stale_view()
        # The version, the range tombstones and the view together, under the lock writes,
        # view adoption and pruning take: no half batch, no operand counted twice.
        with self._lock:
            self._check_readable()
            memtable = self._memtable
            version, ranges, view = memtable.get(key), memtable.ranges, self._view
        value = None if version is None else version[1]
        if version is None or version[0] <= view.last_ingest_seq or value.__class__ is Operands:
            found = self._read(lambda v: get_compacted(self._tables, v, key), view)
            self._check_open()
            version = newer_version(version, found)
        if version is None or version[1] is None:
            return version
        if version[1].__class__ is bytes and not ranges and not view_ranges(view):
            return version
        value = visible(
            key, version, ranges, view, self._clock, merging=self._merging, tables=self._tables
        )
        return version[0], value  # an entry kind (RFC 0019): resolved as get does

    def snapshot(self) -> Snapshot:
        """A consistent read view that later writes, compaction and GC leave unchanged until
        it is released (``close()`` or ``with``); see :mod:`slatepy.engine.snapshot`.

        Its ``seq`` ends a WAL SST: the writes it sees are all in WAL SSTs before the writes
        it does not, so a change feed from ``seq + 1`` (``WalReader.iter``) holds exactly the
        writes missing from it, each once. A replica copies the snapshot, then follows the
        feed from there, and merges are applied once (a feed started at a seq inside a WAL
        SST repeats that SST's merges, which the WAL stacks into one record).

        Costs a manifest update (it pins the view in the store), a copy of the memtable's
        index (a dict copy), and the writing of the WAL writes buffered so far, if any, as
        their own WAL SST (what makes the boundary).

        Raises:
            ClosedError: the database is closed.
            ManifestConflictError: compactions kept publishing while the view was pinned.
            SlatepyError: the writer failed (writing the WAL, or before): its memtable may
                hold writes the database lost.
        """
        self._check_readable()
        for _ in range(SNAPSHOT_ATTEMPTS):
            pin, stored = pin_manifest(self._manifests, self._settings.reader_snapshot_ttl)
            self._apply_manifest(stored.manifest)
            sealed, reserved = None, True
            self._wal.reserve()  # a write slot for the seal, waited for outside the lock
            try:
                with self._lock:
                    same = self._view is stored.manifest and not self._closed
                    if same:
                        memtable, seq = self._memtable.frozen_copy(), self._seq
                        reserved = False
                        sealed = self._wal.seal()  # no write between it and the seq read
            finally:
                if reserved:
                    self._wal.unreserve()
            if sealed is not None:
                self._wal.write_sealed(sealed)
            if same:
                try:
                    # Every write the copy holds is durable, or the writer failed: a snapshot
                    # holds no write the database lost (issue 29).
                    self._wal.settle()
                except SlatepyError:
                    with contextlib.suppress(SlatepyError):  # else the pin expires on its own
                        pin.release()
                    raise
                return Snapshot(
                    url=self.url,
                    tables=self._tables,
                    manifest=stored.manifest,
                    memtable=memtable,
                    seq=seq,
                    pin=pin,
                    clock=frozen_clock(self._clock),
                    merging=self._merging,
                )
            pin.release()  # a newer view was adopted in between: pin that one
            self._check_open()
        raise ManifestConflictError(
            f"compactions published faster than a snapshot could pin one ({SNAPSHOT_ATTEMPTS} "
            "tries); try again"
        )

    def begin(self, isolation: Isolation = "snapshot") -> Transaction:
        """Start an optimistic transaction (see :mod:`slatepy.engine.txn`).

        Args:
            isolation: ``"snapshot"``: commit fails if a key it writes was written by
                someone else since it began; ``"serializable"``: also if a key it read, or
                any key in a range it scanned, was.

        Raises:
            InvalidArgument: an unknown isolation level.
            ClosedError: the database is closed.
        """
        isolation = check_isolation(isolation)
        self._check_readable()
        # Without the writer's lock when no write holds it: a lock hand-off per begin is
        # what several threads' transactions queue on (RFC 0020, "Several threads"). The
        # token goes in first, under a seq no later than the start: every write that checks
        # for open transactions after this line records its keys.
        token = self._txns.begin(self._seq)
        start = self._seq
        if self._lock.locked():
            # A write may hold a seq above ``start`` it has not applied, or may have passed
            # its check for open transactions before the token went in: the start is taken
            # once it is done, as a write's seq and its effects go together under the lock.
            with self._lock:
                start = self._seq
        return Transaction(
            self, self._txns, self._lock, isolation=isolation, start_seq=start, token=token
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch={self.epoch}"
        return f"Db({self.url!r}, {state})"

    def refresh(self) -> None:
        """Pick up compactions published since open (and release compacted memtable data)."""
        self._check_open()
        stored = self._manifests.load()
        if stored is not None:
            self._apply_manifest(stored.manifest)

    def _compacted_version(self, key: bytes) -> Version | None:
        """The newest version of ``key`` in the view's SSTs: what merge operands written over
        a memtable version older than an ingestion fold over if it is newer (the memtable
        asks, under the writer's lock, before the write is in the WAL; rare)."""
        try:
            return get_compacted(self._tables, self._view, key)
        except NotFound as exc:
            raise missing_sst(exc) from exc

    def _wait_for_compaction(self) -> None:
        """Backpressure: block until compaction shrinks the memtable below the limit."""
        deadline = time.monotonic() + self._settings.write_stall_timeout
        while time.monotonic() < deadline:
            self._check_open()
            self._pruned.clear()
            self.refresh()  # adopts compactions published by any compactor
            if self._memtable.size_bytes < self._settings.max_unflushed_bytes:
                return
            # The in-process compactor's publication prunes the memtable (_apply_manifest)
            # and ends the wait at once; another compactor's is found by the next refresh.
            # A wait that short may end before the wake before it can be repeated, so the
            # stalled writer keeps its compactor awake (still once per flush_interval).
            if self._compactor is not None:
                self._compactor.wake(min_interval=self._settings.flush_interval)
            self._pruned.wait(min(STALL_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        raise WriteStalled(
            f"{self._memtable.size_bytes} bytes are written but not compacted "
            f"(max_unflushed_bytes={self._settings.max_unflushed_bytes}) and compaction did "
            f"not catch up in {self._settings.write_stall_timeout} s; is a compactor running?"
        )

    def _refresh_stale_view(self) -> None:
        """Keep the read view younger than a quarter of GC's grace period (RFC 0003)."""
        if time.monotonic() - self._view_time > self._stale_view_seconds:
            self.refresh()

    def _adopt_published(self, manifest: Manifest) -> None:
        if not self._closed:
            self._apply_manifest(manifest)

    def _apply_manifest(self, manifest: Manifest) -> None:
        """Adopt ``manifest`` as the read view and prune what it has compacted."""
        with self._lock:
            if manifest.wal_id_last_compacted < self._view.wal_id_last_compacted:
                return  # an older manifest than the one we have
            self._view = manifest
            self._view_time = time.monotonic()
            cutoff = manifest.wal_id_last_compacted
            known = {**self._replayed_max_seq, **dict(list(self._wal.max_seq_by_id.items()))}
            compacted = [seq for wal_id, seq in known.items() if wal_id <= cutoff]
            if manifest.writer_epoch > self.epoch and self._retain_bytes:
                # A newer writer fenced this one: what it keeps may be overwritten or
                # deleted since, so it keeps nothing compacted from now on.
                self._retain_bytes = 0
                compacted.append(0)
            if compacted:
                self._memtable.prune(
                    max(compacted),
                    retain_bytes=self._retain_bytes,
                    floor_seq=manifest.last_ingest_seq,
                )
                self._pruned.set()
            for wal_id in [i for i in known if i <= cutoff]:
                self._replayed_max_seq.pop(wal_id, None)
                self._wal.max_seq_by_id.pop(wal_id, None)
            try:
                self._memtable.adopt_ingestion(manifest.last_ingest_seq)
            except SlatepyError as exc:  # tried again at the next refresh
                log.warning("re-folding merges over a new ingestion failed: %s", exc)

    def create_checkpoint(
        self, *, lifetime: float | None = None, name: str | None = None
    ) -> Checkpoint:
        """Flush the WAL, then register a checkpoint of the database (RFC 0017).

        The checkpoint holds the newest manifest and the WAL prefix after it, so it contains
        every write made before this call; GC keeps what it reaches until it is deleted or
        expires. Read it with ``DbReader.open(url, checkpoint=cp.id)``; clone from it with
        ``slatepy.clone``.

        Args:
            lifetime: Seconds until it expires (:meth:`refresh_checkpoint` extends it);
                None: it never expires.
            name: A label for humans.
        """
        self.flush()
        return checkpoints.create_checkpoint(
            self._store, self._settings, lifetime=lifetime, name=name
        )

    def list_checkpoints(self) -> list[Checkpoint]:
        """The database's unexpired checkpoints, oldest first."""
        self._check_open()
        return checkpoints.list_checkpoints(self._store, self._settings)

    def refresh_checkpoint(self, checkpoint_id: str, lifetime: float | None) -> Checkpoint:
        """Make a checkpoint expire ``lifetime`` seconds from now (None: never)."""
        self._check_open()
        return checkpoints.refresh_checkpoint(self._store, self._settings, checkpoint_id, lifetime)

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Remove a checkpoint (``NotFound`` if there is none); GC may then collect what only
        it held."""
        self._check_open()
        checkpoints.delete_checkpoint(self._store, self._settings, checkpoint_id)

    def flush(self) -> None:
        """Make every write made so far durable.

        Raises the writer's fatal error (``FencedError``, ``StoreUnavailable``) if any write
        so far could not be made durable; that report covers unawaited writes too.
        """
        self._check_open()
        try:
            self._wal.flush()
        except SlatepyError:
            self._wal.failure_reported()
            raise

    def close(self) -> None:
        """Flush outstanding writes and stop background work; idempotent.

        Raises:
            WritesLost: writes made with ``await_durable=False`` could not be made durable
                (the writer had failed; the failure is the ``__cause__``) and no ``flush()``
                reported it. Failures already raised to the writers that awaited them are
                not raised again.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = self._refused = True
        _OPEN.discard(self)
        forking.untrack(self)
        try:
            self._wal.flush()
        except SlatepyError as exc:
            lost = self._wal.unwritten_unawaited()
            if lost:
                raise WritesLost(
                    f"{lost} writes made with await_durable=False were never made durable "
                    f"and are lost: the writer failed ({exc})",
                    count=lost,
                ) from exc
        finally:
            if self._compactor is not None:
                self._compactor.close(drain=self._settings.close_compaction_wait)
            self._wal.close()
            self._store.drain()
            # A closed database keeps no data in memory, even while its object is referenced
            # (``with Db.open(...) as db:`` leaves ``db`` bound): everything here is durable.
            with self._lock:
                self._memtable = Memtable()
            self._tables.clear_caches()

    def _flush_at_exit(self) -> None:
        """At interpreter exit, make buffered writes of a database nobody closed durable.

        Only the WAL buffer is flushed (background threads are left to the interpreter), so a
        process that forgot ``close()`` loses nothing it wrote and says so; a store that is
        gone by then costs its request timeout, once.
        """
        buffered = 0 if self._closed else self._wal.buffered()
        if not buffered:
            return
        log.warning(
            "database %s was not closed: flushing %d buffered writes at exit (call close())",
            self.url,
            buffered,
        )
        try:
            self._wal.flush()
        except SlatepyError as exc:
            log.error("%d unawaited writes to %s are lost at exit: %s", buffered, self.url, exc)

    def __del__(self) -> None:
        """Warn (``ResourceWarning``) about a database garbage-collected without ``close()``,
        then close it, so buffered writes are flushed and its threads stop.

        Like an unclosed file: the warning names the bug (a missing ``close()`` or ``with``);
        closing here keeps it from also losing the writes. At interpreter exit the atexit
        flush has already run and nothing more is done.
        """
        if not self._opened or getattr(self, "_closed", True) or sys.is_finalizing():
            return
        try:
            warnings.warn(
                f"database {self.url} was garbage-collected without close(); closing it now "
                "(use `with Db.open(...)` or call close())",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
        finally:  # also when warnings are errors (-W error): the writes still get flushed
            if threading.current_thread().name.startswith("slatepy-"):
                # Dropped on one of our own threads (the compactor's callback held the last
                # reference): close() joins those threads, so it runs on a thread of its own.
                closer = threading.Thread(
                    target=self._close_quietly, name="slatepy-close", daemon=True
                )
                closer.start()
            else:
                self._close_quietly()

    def _close_quietly(self) -> None:
        try:
            self.close()
        except SlatepyError as exc:
            log.error("closing the unclosed database %s failed: %s", self.url, exc)

    def _crash(self) -> None:
        """Stop like a killed process: no flush, background threads stopped (crash tests)."""
        _OPEN.discard(self)
        forking.untrack(self)
        with self._lock:
            self._closed = self._refused = True
        if self._compactor is not None:
            self._compactor.close()
        self._wal.close()

    def _check_open(self) -> None:
        if self._closed:
            if self._forked_from:
                raise forked_error(f"the database {self.url}", self._forked_from)
            raise ClosedError("the database is closed; open it again to use it")

    def _check_readable(self) -> None:
        """Reads need an open database whose writer has not failed: after a failure the
        memtable may hold writes that were never made durable, and no read may return
        those once the failure was reported (RFC 0026). ``WalWriter.dead_error`` says so."""
        self._check_open()
        self._wal.check()

    def _writer_failed(self) -> None:
        self._refused = True

    def _mark_forked(self, parent_pid: int) -> None:
        """In a child of ``os.fork()`` (see :mod:`slatepy.engine.forking`): unusable here,
        and nothing to flush at the child's exit (the parent owns the buffered writes)."""
        _OPEN.discard(self)
        self._forked_from = parent_pid
        self._closed = self._refused = True


def _weak_callback(method: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    """``method`` as a callback that does not keep its object alive.

    The in-process compactor's thread holds its callback for as long as it runs; a bound
    method there would keep an unclosed ``Db`` reachable forever, so it could never be
    collected (nor warn that it was not closed).
    """
    ref = weakref.WeakMethod(method)

    def call(manifest: Manifest) -> None:
        target = ref()
        if target is not None:
            target(manifest)

    return call


def _weak_sole_use(
    db: Db,
) -> Callable[[], contextlib.AbstractContextManager[list[Manifest] | None]]:
    """``db._sole_use`` without keeping ``db`` alive (the collector outlives no writer)."""
    ref = weakref.ref(db)

    def call() -> contextlib.AbstractContextManager[list[Manifest] | None]:
        live = ref()
        return contextlib.nullcontext() if live is None else live._sole_use()

    return call


def _weak_call(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` as a callback that does not keep its object alive (the WAL's flusher
    thread holds the WAL writer, which holds this; see :func:`_weak_callback`)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        target = ref()
        if target is not None:
            target()

    return call
