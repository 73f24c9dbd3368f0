"""``Db``: the writer's public API (sync). See ``slatepy.aio`` for the asyncio facade."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch, check_key, check_value
from slatepy.engine.fencing import WAL_DIR, WAL_SUFFIX
from slatepy.engine.startup import start_writer
from slatepy.engine.wal import WalWriter
from slatepy.errors import ClosedError, InvalidArgument, SlatepyError
from slatepy.format.block import Entry
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import MetricsStore, StoreMetrics
from slatepy.store.numbered import NumberedObjects
from slatepy.store.url import open_store


class Db:
    """An embedded key-value database whose state lives in an object store.

    There is one writer per database: opening a ``Db`` fences every older writer of the same
    URL (their later writes fail with ``FencedError``). Reads see this process's own writes,
    durable or not. Use :meth:`open`; the constructor is internal.
    """

    def __init__(self, store: MetricsStore, settings: Settings, manifests: ManifestStore) -> None:
        self._store = store
        self._settings = settings
        self._lock = threading.Lock()
        self._closed = False
        start = start_writer(store, manifests, settings)
        self._memtable = start.memtable
        self._seq = start.last_seq
        self.replayed_ssts = start.replayed_ssts
        self._wal = WalWriter(
            NumberedObjects(store, WAL_DIR, WAL_SUFFIX),
            epoch=start.epoch,
            next_id=start.fence_id + 1,
            settings=settings,
        )

    @classmethod
    def open(cls, url: str | ObjectStore, *, settings: Settings | None = None) -> Db:
        """Open (creating if needed) the database at ``url`` and become its writer.

        Args:
            url: ``memory://``, ``file:///abs/path``, ``s3://bucket/prefix``, ``gs://…``,
                ``az://…``, or an ``ObjectStore`` instance.
            settings: Tunables; defaults to ``Settings()``.

        Raises:
            InvalidArgument: the URL or settings are unusable.
            NotFound: the bucket does not exist.
            FencedError: a newer writer opened the database while this one was starting.
        """
        settings = settings or Settings()
        inner = url if isinstance(url, ObjectStore) else open_store(url, settings)
        store = MetricsStore(inner)
        return cls(
            store, settings, ManifestStore(store, attempts=settings.manifest_update_attempts)
        )

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
    def next_wal_id(self) -> int:
        return self._wal.next_id

    def put(self, key: bytes, value: bytes, *, await_durable: bool = True) -> None:
        """Set ``key`` to ``value``; with ``await_durable`` return only once it is in the WAL."""
        self._apply([(check_key(key), check_value(value))], await_durable)

    def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        """Remove ``key`` (a tombstone until compaction drops it)."""
        self._apply([(check_key(key), None)], await_durable)

    def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        """Apply a batch atomically: after a crash either all of it is there or none."""
        if not isinstance(batch, WriteBatch):
            raise InvalidArgument(f"write() takes a WriteBatch, got {type(batch).__name__}")
        if len(batch):
            self._apply(batch.ops, await_durable)

    def _apply(self, ops: list[tuple[bytes, bytes | None]], await_durable: bool) -> None:
        with self._lock:
            self._check_open()
            self._wal.check()
            self._seq += 1
            seq = self._seq
            entries: list[Entry] = [(key, seq, value) for key, value in ops]
            # One WAL generation holds the whole batch, so it lands in one SST (atomic).
            generation = self._wal.append(entries, awaited=await_durable)
            for key, _, value in entries:
                self._memtable.put(key, seq, value)
        if await_durable:
            self._wal.flush(generation)

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None if it is absent or deleted."""
        key = check_key(key)
        self._check_open()
        version = self._memtable.get(key)
        return None if version is None else version[1]

    def scan(self, start: bytes = b"", end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in key order (end None = all).

        The result is a consistent view taken when ``scan`` is called.
        """
        if not isinstance(start, bytes) or not (end is None or isinstance(end, bytes)):
            raise InvalidArgument("scan bounds must be bytes (end may be None)")
        if end is not None and end < start:
            raise InvalidArgument(f"scan start {start!r} is after end {end!r}")
        with self._lock:
            self._check_open()
            entries = self._memtable.range(start, end)
        return iter([(key, value) for key, _, value in entries if value is not None])

    def flush(self) -> None:
        """Make every write made so far durable.

        Raises the writer's fatal error (``FencedError``, ``StoreUnavailable``) if any write
        so far could not be made durable; that report covers unawaited writes too.
        """
        self._check_open()
        try:
            self._wal.flush()
        except SlatepyError:
            self._wal.lost_unawaited = False
            raise

    def close(self) -> None:
        """Flush outstanding writes and stop background work; idempotent.

        Raises the flush error if writes made with ``await_durable=False`` could not be made
        durable: they are lost and nobody else was told. Failures already raised to the
        writers that awaited them are not raised again.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._wal.flush()
        except SlatepyError:
            if self._wal.lost_unawaited:
                raise
        finally:
            self._wal.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the database is closed; open it again to use it")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the exception propagating says what went wrong
            self.close()
