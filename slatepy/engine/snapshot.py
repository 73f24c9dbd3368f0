"""``Snapshot``: a consistent read view of a database that later writes, compaction and GC
leave as it was, until it is released (RFC 0020).

A snapshot is two things, both fixed when it is taken:

* a frozen copy of the handle's memtable (:meth:`Memtable.frozen_copy`: a dict copy; the
  memtable keeps one version per key, so later writes would otherwise overwrite the
  versions the snapshot must see), and
* the manifest whose SSTs hold the rest, *pinned* in the store the way a reader pins its
  view: a ``Snapshot`` record in the manifest (``manifest_id`` = that manifest), which the
  garbage collector honours, so compaction may replace those SSTs but GC cannot delete them
  while the snapshot lives.

The pin expires ``reader_snapshot_ttl`` after it was last renewed, so a process that dies
holding one does not protect its SSTs forever. Reads renew it once a third of the ttl has
passed; a snapshot left unused for longer than the ttl loses its protection (its reads may
then fail with ``CorruptionError``/``NotFound`` once GC ran). Release it with :meth:`close`
or ``with``.

Consistency: the writer takes a snapshot by first pinning the newest manifest, then adopting
it as its own view (which prunes the memtable of what it compacted) and copying the
memtable under the writer's lock, with a check that no newer view slipped in between. So
the copy holds exactly the writes the pinned manifest does not, up to the snapshot's
``seq``; later writes are in neither.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from slatepy.engine.batch import check_key, check_range
from slatepy.engine.batched_gets import get_many
from slatepy.engine.iterator import View
from slatepy.engine.memtable import Memtable, Version
from slatepy.engine.surface import ReadSurface, version_in
from slatepy.engine.view import missing_sst, view_ranges, visible
from slatepy.errors import ClosedError, NotFound, SlatepyError
from slatepy.manifest.record import Manifest
from slatepy.manifest.record import Snapshot as SnapshotRecord
from slatepy.manifest.store import ManifestStore, StoredManifest
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class Pin:
    """A snapshot record in the manifest that keeps manifest ``manifest_id`` (and so its
    SSTs) from the garbage collector until it expires or is released."""

    manifests: ManifestStore
    snapshot_id: str
    manifest_id: int
    ttl: float
    renewed_at: float = field(default_factory=time.monotonic)
    released: bool = False

    def renew_if_due(self) -> None:
        """Push the expiry out once a third of the ttl has passed (best effort: a failure
        is logged, and the next read tries again)."""
        if time.monotonic() - self.renewed_at <= self.ttl / 3:
            return
        expiry = int(time.time() + self.ttl) + 1
        record = SnapshotRecord(self.snapshot_id, self.manifest_id, expiry)
        try:
            self.manifests.update(
                lambda m, _: m.without_snapshot(self.snapshot_id).with_snapshot(record)
            )
            self.renewed_at = time.monotonic()
        except SlatepyError as exc:
            log.warning("renewing snapshot %s failed (retried on the next read): %s", self, exc)

    def release(self) -> None:
        """Remove the record (idempotent; a no-op when it expired and was dropped)."""
        if self.released:
            return
        self.released = True
        sid = self.snapshot_id
        self.manifests.update(
            lambda m, _: m.without_snapshot(sid) if any(s.id == sid for s in m.snapshots) else None
        )


def pin_manifest(
    manifests: ManifestStore, ttl: float, *, manifest_id: int | None = None
) -> tuple[Pin, StoredManifest]:
    """Register a snapshot of manifest ``manifest_id`` (default: the manifest this update
    writes, i.e. the newest state) in one manifest update; expired snapshots are dropped in
    the same update. Returns the pin and the manifest written."""
    snapshot_id = uuid.uuid4().hex
    pinned = 0

    def add(m: Manifest, next_id: int) -> Manifest:
        nonlocal pinned
        pinned = next_id if manifest_id is None else manifest_id
        now = time.time()
        record = SnapshotRecord(snapshot_id, pinned, int(now + ttl) + 1)
        return m.without_expired_snapshots(now).with_snapshot(record)

    stored = manifests.update(add)
    return Pin(manifests, snapshot_id, pinned, ttl), stored


class Snapshot(ReadSurface):
    """A consistent, unchanging read view; take one with ``Db.snapshot()`` or
    ``DbReader.snapshot()`` and release it with :meth:`close` (or ``with``).

    Offers the handles' reads: ``get``, ``get_many``, ``get_key_value``, ``scan`` (reverse,
    limit), ``scan_prefix``, ``scan_batches``, ``iter`` and the mapping protocol (``[]``,
    ``in``). Safe to share between threads.
    """

    def __init__(
        self,
        *,
        url: str,
        tables: TableReader,
        manifest: Manifest,
        memtable: Memtable,
        seq: int,
        pin: Pin | None,
        clock: Clock = time.time,
        merging: Merging = NO_MERGING,
    ) -> None:
        self._url = url
        self._clock = clock
        self._merging = merging.at(clock)  # a TTL'd base under operands: the same clock
        self._tables = tables
        self._manifest = manifest
        self._memtable = memtable
        self._seq = seq
        self._pin = pin
        self._lock = threading.Lock()  # Memtable.range sorts lazily: one caller at a time
        self._closed = False

    @property
    def seq(self) -> int:
        """The sequence number of the newest write the snapshot sees. It ends a WAL SST, so a
        change feed from ``seq + 1`` holds exactly the writes the snapshot lacks: copy the
        snapshot, then follow ``WalReader.iter(seq + 1)`` to start a replica."""
        return self._seq

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def snapshot_id(self) -> str:
        """The id of the pin in the manifest ("" when unpinned: a read-only reader's)."""
        return "" if self._pin is None else self._pin.snapshot_id

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order (None where absent or deleted)."""
        keys = [check_key(k) for k in keys]
        self._before_read()
        memtable = self._memtable
        return get_many(
            keys,
            memtable.get_many(keys),
            self._manifest,
            memtable.ranges,
            read=_read_pinned,
            tables=self._tables,
            clock=self._clock,
            merging=self._merging,
        )

    def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with ``start <= key < end`` in the snapshot, in key order
        (descending with ``reverse``), at most ``limit`` of them."""
        check_range(start, end)
        return self._scan_ordered(start, end, reverse, limit)

    def _version(self, key: bytes) -> Version | None:
        key = check_key(key)
        self._before_read()
        try:
            version = version_in(self._memtable, self._tables, self._manifest, key)
            if version is None or (version[1].__class__ is bytes and not self._has_ranges()):
                return version
            value = visible(
                key,
                version,
                self._memtable.ranges,
                self._manifest,
                self._clock,
                merging=self._merging,
                tables=self._tables,
            )
        except NotFound as exc:
            raise missing_sst(exc) from exc
        return version[0], value

    def _has_ranges(self) -> bool:
        """Whether range tombstones exist in the snapshot (reads then resolve them)."""
        return bool(self._memtable.ranges) or bool(view_ranges(self._manifest))

    def _view_for(self, start: bytes, end: bytes | None) -> View:
        self._before_read()
        with self._lock:
            entries = self._memtable.range(start, end)
        return View(
            self._tables,
            self._manifest,
            entries,
            start,
            end,
            self._memtable.ranges,
            self._clock,
            self._merging,
        )

    def _before_read(self) -> None:
        if self._closed:
            raise ClosedError(
                "the snapshot was released; take a new one (db.snapshot()) to read again"
            )
        if self._pin is not None:
            self._pin.renew_if_due()

    def close(self) -> None:
        """Release the snapshot: its pin leaves the manifest, so GC may collect what only it
        protected. Idempotent; reads afterwards raise ``ClosedError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._memtable = Memtable()
        if self._pin is not None:
            self._pin.release()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "released" if self._closed else f"seq={self._seq}"
        return f"Snapshot({self._url!r}, {state})"


def _read_pinned(read: Callable[[Manifest], T], view: Manifest) -> T:
    """``read(view)``: a snapshot's view is pinned, so a missing SST is damage."""
    try:
        return read(view)
    except NotFound as exc:
        raise missing_sst(exc) from exc
