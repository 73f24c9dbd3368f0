"""The asyncio facade: the same calls as :class:`slatepy.Db` and :class:`slatepy.DbReader`,
awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop is never blocked by object-store I/O; group commit still applies because the
waiting happens in those threads. A scan is both awaitable (``await db.scan()``: one list,
one thread hop) and an async iterator (``async for key, value in db.scan()``: one batch of
rows per hop, for results too large to hold at once); :meth:`Db.scan_batches` yields the
batches themselves. ``open`` is awaitable and an async context manager: ``db = await
Db.open(url)`` or ``async with Db.open(url) as db:``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar

from slatepy.config import SettingsLike
from slatepy.engine.batch import WriteBatch
from slatepy.engine.checkpoint import Checkpoint
from slatepy.engine.clone import clone as sync_clone
from slatepy.engine.db import Db as SyncDb
from slatepy.engine.iterator import DEFAULT_BATCH_SIZE, BatchFormat
from slatepy.engine.reader import DbReader as SyncDbReader
from slatepy.engine.snapshot import Snapshot as SyncSnapshot
from slatepy.engine.surface import KeyValue
from slatepy.engine.txn import Isolation
from slatepy.engine.txn import Transaction as SyncTransaction
from slatepy.engine.wal_reader import StartAt, WalRecord
from slatepy.engine.wal_reader import WalReader as SyncWalReader
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import StoreMetrics
from slatepy.table.merge_operator import MergeOperator

_END = object()
P = ParamSpec("P")
R = TypeVar("R")


class _Closable(Protocol):
    async def close(self) -> None: ...


H = TypeVar("H", bound=_Closable)


class Opening(Generic[H]):
    """What ``open`` returns: ``await`` it for the handle, or ``async with`` it to have the
    handle closed when the block ends (as ``aiosqlite.connect``)."""

    def __init__(self, opening: Coroutine[Any, Any, H]) -> None:
        """Wrap the coroutine that opens the handle (run once, by await or ``async with``)."""
        self._opening = opening
        self._handle: H | None = None

    def __await__(self) -> Generator[Any, None, H]:
        """``await Db.open(url)``: the open handle."""
        return self._opening.__await__()

    async def __aenter__(self) -> H:
        """``async with Db.open(url) as db``: open, and hand out the handle."""
        self._handle = await self._opening
        return self._handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the handle (quietly if the block raised, as the handle's own ``with``)."""
        assert self._handle is not None
        aexit = getattr(self._handle, "__aexit__", None)
        if aexit is not None:
            await aexit(exc_type, exc, tb)
        else:
            await self._handle.close()


class Rows:
    """A scan: ``await`` it for one list, or ``async for`` it for rows fetched a batch per
    worker-thread hop (the event loop never waits on the store)."""

    def __init__(self, rows: Callable[[], Iterator[tuple[bytes, bytes]]], batch_size: int) -> None:
        """``rows`` makes the sync scan (on a worker thread: taking the view may do I/O)."""
        self._rows = rows
        self._batch_size = batch_size

    def __await__(self) -> Generator[Any, None, list[tuple[bytes, bytes]]]:
        """``await db.scan()``: every row, as one list (one worker-thread hop)."""
        return asyncio.to_thread(lambda: list(self._rows())).__await__()

    async def __aiter__(self) -> AsyncIterator[tuple[bytes, bytes]]:
        """``async for key, value in db.scan()``: a batch of rows per worker-thread hop."""
        rows: Iterator[tuple[bytes, bytes]] = await asyncio.to_thread(self._rows)
        size = self._batch_size
        try:
            while batch := await asyncio.to_thread(lambda: list(itertools.islice(rows, size))):
                for row in batch:
                    yield row
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                await asyncio.to_thread(close)


def _in_thread(
    method: Callable[Concatenate[Any, P], R],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """An async method that runs the sync handle's method of the same name on a worker
    thread: ``put = _in_thread(SyncDb.put)`` is ``async def put(self, ...)`` with
    ``SyncDb.put``'s parameters, result type and docstring (``help()`` and
    ``inspect.signature`` show them), so forwarding methods are not written out one by one.

    The method is looked up on ``self.sync`` at each call, so a subclass's override (e.g.
    ``CheckpointReader.refresh``) is the one that runs.
    """
    name = method.__name__

    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    functools.update_wrapper(
        call, method, assigned=("__name__", "__qualname__", "__doc__"), updated=()
    )
    return call


class _AsyncReads:
    """The reads every handle offers (writer, reader, snapshot), over ``self.sync``."""

    sync: SyncDb | SyncDbReader | SyncSnapshot

    async def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default`` if it is absent or deleted."""
        return await asyncio.to_thread(self.sync.get, key, default)

    async def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order (None where absent), from one consistent view."""
        return await asyncio.to_thread(self.sync.get_many, keys)

    async def get_key_value(self, key: bytes) -> KeyValue | None:
        """``KeyValue(key, value, seq)`` of a live key, or None."""
        return await asyncio.to_thread(self.sync.get_key_value, key)

    async def contains(self, key: bytes) -> bool:
        """Whether ``key`` has a live value (``in`` cannot be awaited)."""
        return await asyncio.to_thread(self.sync.__contains__, key)

    def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Rows:
        """``(key, value)`` with ``start <= key < end`` in key order (descending with
        ``reverse``, at most ``limit``) from one consistent view: ``await`` it for one list,
        or ``async for`` over it."""
        return Rows(
            lambda: self.sync.scan(start, end, reverse=reverse, limit=limit), DEFAULT_BATCH_SIZE
        )

    def scan_prefix(
        self, prefix: bytes, *, reverse: bool = False, limit: int | None = None
    ) -> Rows:
        """The ``(key, value)`` pairs whose key starts with ``prefix``: ``await`` it for one
        list, or ``async for`` over it."""
        return Rows(
            lambda: self.sync.scan_prefix(prefix, reverse=reverse, limit=limit),
            DEFAULT_BATCH_SIZE,
        )

    def items(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        prefix: bytes | None = None,
    ) -> Rows:
        """:meth:`slatepy.engine.surface.ReadSurface.items`: ``await`` or ``async for``."""
        return Rows(
            lambda: self.sync.items(start, end, reverse=reverse, prefix=prefix),
            DEFAULT_BATCH_SIZE,
        )

    async def scan_batches(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        reverse: bool = False,
        format: BatchFormat = "rows",
    ) -> AsyncIterator[Any]:
        """Batches of ``scan(start, end)`` (lists of pairs, or pyarrow ``RecordBatch``es
        with ``format="arrow"``), one worker-thread hop per batch."""
        batches: Iterator[Any] = await asyncio.to_thread(
            self.sync.scan_batches,
            start,
            end,
            batch_size=batch_size,
            reverse=reverse,
            format=format,
        )
        try:
            while True:
                batch = await asyncio.to_thread(next, batches, _END)
                if batch is _END:
                    return
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    async def close(self) -> None:
        """Close the handle (see the sync ``close``)."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> Self:
        """``async with`` the handle: closed when the block ends."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close, quietly if the block raised (as the sync ``with``)."""
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


class Db(_AsyncReads):
    """Async wrapper around :class:`slatepy.engine.db.Db`; open with ``await Db.open(...)``.

    Every method that does I/O is awaitable and runs the sync one on a worker thread, with
    its parameters and docstring; ``begin`` and the properties do no I/O and are plain.
    """

    sync: SyncDb

    def __init__(self, db: SyncDb) -> None:
        """Wrap an open sync ``Db`` (``await Db.open(...)`` opens one and wraps it)."""
        self.sync = db

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: SettingsLike = None,
        create_if_missing: bool = True,
        clock: Callable[[], float] | None = None,
        merge_operator: MergeOperator | None = None,
    ) -> Opening[Db]:
        """:meth:`slatepy.engine.db.Db.open` on a worker thread: ``await`` it, or ``async
        with`` it (closed when the block ends)."""

        async def opening() -> Db:
            return cls(
                await asyncio.to_thread(
                    SyncDb.open,
                    url,
                    settings=settings,
                    create_if_missing=create_if_missing,
                    clock=clock,
                    merge_operator=merge_operator,
                )
            )

        return Opening(opening())

    @property
    def url(self) -> str:
        """The database's location."""
        return self.sync.url

    @property
    def epoch(self) -> int:
        """This writer's epoch."""
        return self.sync.epoch

    @property
    def metrics(self) -> StoreMetrics:
        """Object-store requests made so far (no I/O: not awaitable)."""
        return self.sync.metrics

    @property
    def wal_id_last_compacted(self) -> int:
        """The WAL prefix that compaction has folded into the read view's SSTs."""
        return self.sync.wal_id_last_compacted

    @property
    def next_wal_id(self) -> int:
        """The WAL id the next flush writes."""
        return self.sync.next_wal_id

    async def snapshot(self) -> Snapshot:
        """A consistent, unchanging read view (see :meth:`slatepy.engine.db.Db.snapshot`)."""
        return Snapshot(await asyncio.to_thread(self.sync.snapshot))

    def begin(self, isolation: Isolation = "snapshot") -> Transaction:
        """Start an optimistic transaction (no I/O: not awaitable); ``async with`` it to
        commit on a clean exit and roll back on an exception."""
        return Transaction(self.sync.begin(isolation))

    put = _in_thread(SyncDb.put)
    merge = _in_thread(SyncDb.merge)
    delete = _in_thread(SyncDb.delete)
    delete_range = _in_thread(SyncDb.delete_range)
    write = _in_thread(SyncDb.write)
    flush = _in_thread(SyncDb.flush)
    refresh = _in_thread(SyncDb.refresh)
    create_checkpoint = _in_thread(SyncDb.create_checkpoint)
    list_checkpoints = _in_thread(SyncDb.list_checkpoints)
    refresh_checkpoint = _in_thread(SyncDb.refresh_checkpoint)
    delete_checkpoint = _in_thread(SyncDb.delete_checkpoint)

    def __repr__(self) -> str:
        """``aio.`` and the sync handle's repr."""
        return f"aio.{self.sync!r}"


class DbReader(_AsyncReads):
    """Async wrapper around :class:`slatepy.engine.reader.DbReader`; open with
    ``await DbReader.open(...)``."""

    sync: SyncDbReader

    def __init__(self, reader: SyncDbReader) -> None:
        """Wrap an open sync ``DbReader`` (``await DbReader.open(...)`` opens one)."""
        self.sync = reader

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: SettingsLike = None,
        read_only: bool = False,
        checkpoint: str | None = None,
        clock: Callable[[], float] | None = None,
        merge_operator: MergeOperator | None = None,
    ) -> Opening[DbReader]:
        """:meth:`slatepy.engine.reader.DbReader.open` on a worker thread (``checkpoint``:
        read that checkpoint, a fixed view): ``await`` it, or ``async with`` it."""

        async def opening() -> DbReader:
            return cls(
                await asyncio.to_thread(
                    SyncDbReader.open,
                    url,
                    settings=settings,
                    read_only=read_only,
                    checkpoint=checkpoint,
                    clock=clock,
                    merge_operator=merge_operator,
                )
            )

        return Opening(opening())

    @property
    def metrics(self) -> StoreMetrics:
        """Object-store requests made so far (no I/O: not awaitable)."""
        return self.sync.metrics

    @property
    def manifest_id(self) -> int:
        """The manifest this reader's snapshot holds."""
        return self.sync.manifest_id

    @property
    def wal_id(self) -> int:
        """The last WAL SST applied (every SST up to it is visible)."""
        return self.sync.wal_id

    @property
    def snapshot_id(self) -> str:
        """The id of this reader's snapshot in the manifest ("" for a read-only reader)."""
        return self.sync.snapshot_id

    @property
    def read_only(self) -> bool:
        """Whether the reader writes nothing to the store (see the sync ``open``)."""
        return self.sync.read_only

    async def snapshot(self) -> Snapshot:
        """A read view fixed at what the reader sees now (see the sync ``snapshot``)."""
        return Snapshot(await asyncio.to_thread(self.sync.snapshot))

    refresh = _in_thread(SyncDbReader.refresh)

    def __repr__(self) -> str:
        """``aio.`` and the sync handle's repr."""
        return f"aio.{self.sync!r}"


class Snapshot(_AsyncReads):
    """Async wrapper around :class:`slatepy.engine.snapshot.Snapshot`; release it with
    ``await snap.close()`` or ``async with``."""

    sync: SyncSnapshot

    def __init__(self, snapshot: SyncSnapshot) -> None:
        """Wrap a sync ``Snapshot`` (``await db.snapshot()`` takes one)."""
        self.sync = snapshot

    @property
    def seq(self) -> int:
        """The sequence number of the newest write the snapshot sees."""
        return self.sync.seq

    @property
    def snapshot_id(self) -> str:
        """The id of the snapshot's pin in the manifest ("" when unpinned)."""
        return self.sync.snapshot_id

    def __repr__(self) -> str:
        """``aio.`` and the sync snapshot's repr."""
        return f"aio.{self.sync!r}"


class Transaction:
    """Async wrapper around :class:`slatepy.engine.txn.Transaction` (await one call at a
    time: a transaction is used by one task)."""

    def __init__(self, txn: SyncTransaction) -> None:
        """Wrap a sync ``Transaction`` (``db.begin()`` starts one)."""
        self.sync = txn

    @property
    def isolation(self) -> Isolation:
        """``"snapshot"`` or ``"serializable"``."""
        return self.sync.isolation

    @property
    def start_seq(self) -> int:
        """The transaction's snapshot: it sees every write up to this seq, none after."""
        return self.sync.start_seq

    get = _in_thread(SyncTransaction.get)

    def put(self, key: bytes, value: bytes) -> None:
        """Buffer ``key = value`` (no I/O: not awaitable)."""
        self.sync.put(key, value)

    def delete(self, key: bytes) -> None:
        """Buffer the deletion of ``key`` (no I/O: not awaitable)."""
        self.sync.delete(key)

    def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Rows:
        """The transaction's view of ``[start, end)`` (see the sync ``scan``): ``await`` it
        for one list, or ``async for`` over it."""
        return Rows(
            lambda: self.sync.scan(start, end, reverse=reverse, limit=limit), DEFAULT_BATCH_SIZE
        )

    commit = _in_thread(SyncTransaction.commit)
    rollback = _in_thread(SyncTransaction.rollback)

    async def __aenter__(self) -> Self:
        """``async with`` the transaction: committed on a clean exit, else rolled back."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Commit, or roll back when the block raised."""
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)

    def __repr__(self) -> str:
        """``aio.`` and the sync transaction's repr."""
        return f"aio.{self.sync!r}"


class WalReader:
    """Async form of :class:`slatepy.engine.wal_reader.WalReader` (change data capture):
    ``async with await WalReader.open(url) as feed: async for record in feed.iter(...)``.

    Each WAL SST is read, and each poll of a follower waited out, on a worker thread, so the
    event loop never blocks; records come out one WAL SST at a time. ``close`` ends a
    following iterator at its next poll (within ``poll_interval``).
    """

    def __init__(self, reader: SyncWalReader) -> None:
        """Wrap a sync ``WalReader`` (``await WalReader.open(url)`` makes one)."""
        self.sync = reader

    @classmethod
    def open(
        cls, url: str | os.PathLike[str] | ObjectStore, *, settings: SettingsLike = None
    ) -> Opening[WalReader]:
        """:meth:`slatepy.engine.wal_reader.WalReader.open` on a worker thread: ``await``
        it, or ``async with`` it."""

        async def opening() -> WalReader:
            return cls(await asyncio.to_thread(SyncWalReader.open, url, settings=settings))

        return Opening(opening())

    async def iter(
        self,
        from_seq: StartAt = "oldest",
        *,
        follow: bool = False,
        poll_interval: float | None = None,
    ) -> AsyncIterator[WalRecord]:
        """:meth:`slatepy.engine.wal_reader.WalReader.iter`, awaitable record by record."""
        ssts = self.sync.iter_ssts(from_seq, follow=follow, poll_interval=poll_interval)
        try:
            while (records := await asyncio.to_thread(next, ssts, None)) is not None:
                for record in records:
                    yield record
        finally:
            # Still running in its thread if the consumer was cancelled mid-poll: it ends
            # at its next poll after close(); otherwise end it now.
            with contextlib.suppress(ValueError):
                ssts.close()

    async def close(self) -> None:
        """Stop the feed: a following iterator ends at its next poll."""
        self.sync.close()

    async def __aenter__(self) -> Self:
        """``async with``: the reader itself."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close on leaving the block."""
        await self.close()


async def clone(
    src: str | ObjectStore,
    dst: str | ObjectStore,
    *,
    checkpoint: str | None = None,
    settings: SettingsLike = None,
) -> Checkpoint:
    """:func:`slatepy.clone` on a worker thread: a new database at ``dst`` holding the
    source's data (its durable state now, or ``checkpoint``), sharing its SSTs; returns the
    checkpoint registered in the source for the clone."""
    return await asyncio.to_thread(sync_clone, src, dst, checkpoint=checkpoint, settings=settings)


__all__ = [
    "Checkpoint",
    "Db",
    "DbReader",
    "KeyValue",
    "Opening",
    "Rows",
    "Snapshot",
    "Transaction",
    "WalReader",
    "WriteBatch",
    "clone",
]
