"""``Db``'s reads: point and batched gets over memtable and compacted state, views for
scans, snapshots and transactions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from slatepy.config import MAX_KEY_SIZE
from slatepy.engine.batch import (
    check_key,
)
from slatepy.engine.batched_gets import get_many
from slatepy.engine.db_state import DbState
from slatepy.engine.embedded import TrackedView, alone
from slatepy.engine.iterator import View
from slatepy.engine.memtable import Version
from slatepy.engine.snapshot import Snapshot, pin_manifest
from slatepy.engine.txn import Isolation, Transaction, check_isolation
from slatepy.engine.view import (
    get_compacted,
    missing_sst,
    newer_version,
    view_ranges,
    visible,
)
from slatepy.errors import (
    ManifestConflictError,
    NotFound,
    SlatepyError,
)
from slatepy.format.kinds import Operands
from slatepy.manifest.record import Manifest
from slatepy.table.visibility import EMPTY, Clock, frozen_clock

T = TypeVar("T")

SNAPSHOT_ATTEMPTS = 5


class Reads(DbState):
    """The read half of :class:`~slatepy.engine.db.Db` (see there)."""

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

    def _view_for(self, start: bytes, end: bytes | None, clock: Clock | None = None) -> View:
        """A view of ``[start, end)`` now, judging expiry by ``clock`` (a transaction's,
        stopped at its start) or the database's."""
        self._refresh_stale_view()
        with self._lock:
            self._check_readable()
            entries = self._memtable.range(start, end)
            view, ranges = self._view, self._memtable.ranges
            return self._views.track(
                TrackedView(
                    self._tables,
                    view,
                    entries,
                    start,
                    end,
                    ranges,
                    self._clock if clock is None else clock,
                    self._merging,
                )
            )

    def _sole_use(self) -> contextlib.AbstractContextManager[list[Manifest] | None]:
        """For the collector: while this process alone has the database open, the
        manifests it reads (RFC 0029)."""
        return alone(self._attachment, self._lock, lambda: [self._view, *self._views.manifests()])

    def _version(self, key: bytes, clock: Clock | None = None) -> Version | None:
        """The newest version of ``key``, resolved (an entry kind as get does), judging
        expiry by ``clock`` (a transaction's, stopped at its start) or the database's."""
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
            key,
            version,
            ranges,
            view,
            self._clock if clock is None else clock,
            merging=self._merging if clock is None else self._merging.at(clock),
            tables=self._tables,
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
        # Expiry is judged as of the start, for every read (one view, one clock: RFC 0026).
        return Transaction(
            self,
            self._txns,
            self._lock,
            isolation=isolation,
            start_seq=start,
            token=token,
            clock=frozen_clock(self._clock),
        )
