"""The asyncio facade: the same calls as :class:`slatepy.Db` and :class:`slatepy.DbReader`,
awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop is never blocked by object-store I/O; group commit still applies because the
waiting happens in those threads. Scans return lists (one thread hop for the whole result);
:meth:`Db.scan_batches` is an async iterator that fetches one batch per hop, for results too
large to hold at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Self

from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch
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

    async def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` with ``start <= key < end`` in key order (descending with
        ``reverse``, at most ``limit``), as one list from one consistent view."""
        return await asyncio.to_thread(
            lambda: list(self.sync.scan(start, end, reverse=reverse, limit=limit))
        )

    async def scan_prefix(
        self, prefix: bytes, *, reverse: bool = False, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """The ``(key, value)`` pairs whose key starts with ``prefix``, as one list."""
        return await asyncio.to_thread(
            lambda: list(self.sync.scan_prefix(prefix, reverse=reverse, limit=limit))
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
    """Async wrapper around :class:`slatepy.engine.db.Db`; open with ``await Db.open(...)``."""

    sync: SyncDb

    def __init__(self, db: SyncDb) -> None:
        self.sync = db

    @classmethod
    async def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: Settings | None = None,
        create_if_missing: bool = True,
        clock: Callable[[], float] | None = None,
        merge_operator: MergeOperator | None = None,
    ) -> Db:
        """:meth:`slatepy.engine.db.Db.open` on a worker thread."""
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

    @property
    def epoch(self) -> int:
        """This writer's epoch."""
        return self.sync.epoch

    @property
    def metrics(self) -> StoreMetrics:
        """Object-store requests made so far (no I/O: not awaitable)."""
        return self.sync.metrics

    async def snapshot(self) -> Snapshot:
        """A consistent, unchanging read view (see :meth:`slatepy.engine.db.Db.snapshot`)."""
        return Snapshot(await asyncio.to_thread(self.sync.snapshot))

    def begin(self, isolation: Isolation = "snapshot") -> Transaction:
        """Start an optimistic transaction (no I/O: not awaitable); ``async with`` it to
        commit on a clean exit and roll back on an exception."""
        return Transaction(self.sync.begin(isolation))

    async def put(
        self,
        key: bytes,
        value: bytes,
        *,
        await_durable: bool = True,
        ttl: float | None = None,
    ) -> None:
        """Set ``key`` to ``value`` (expiring after ``ttl`` seconds if given); with
        ``await_durable``, return once it is in the WAL."""
        await asyncio.to_thread(self.sync.put, key, value, await_durable=await_durable, ttl=ttl)

    async def merge(self, key: bytes, operand: bytes, *, await_durable: bool = True) -> None:
        """Add a merge operand for ``key`` (see :meth:`slatepy.engine.db.Db.merge`)."""
        await asyncio.to_thread(self.sync.merge, key, operand, await_durable=await_durable)

    async def delete_range(self, start: bytes, end: bytes, *, await_durable: bool = True) -> None:
        """Delete every key in ``[start, end)`` (see :meth:`slatepy.engine.db.Db.delete_range`)."""
        await asyncio.to_thread(self.sync.delete_range, start, end, await_durable=await_durable)

    async def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        """Remove ``key`` (a tombstone until compaction drops it)."""
        await asyncio.to_thread(self.sync.delete, key, await_durable=await_durable)

    async def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        """Apply ``batch`` atomically."""
        await asyncio.to_thread(self.sync.write, batch, await_durable=await_durable)

    async def flush(self) -> None:
        """Make every write made so far durable."""
        await asyncio.to_thread(self.sync.flush)

    async def refresh(self) -> None:
        """Adopt compactions published since open."""
        await asyncio.to_thread(self.sync.refresh)

    def __repr__(self) -> str:
        return f"aio.{self.sync!r}"


class DbReader(_AsyncReads):
    """Async wrapper around :class:`slatepy.engine.reader.DbReader`; open with
    ``await DbReader.open(...)``."""

    sync: SyncDbReader

    def __init__(self, reader: SyncDbReader) -> None:
        self.sync = reader

    @classmethod
    async def open(
        cls,
        url: str | os.PathLike[str] | ObjectStore,
        *,
        settings: Settings | None = None,
        read_only: bool = False,
    ) -> DbReader:
        """:meth:`slatepy.engine.reader.DbReader.open` on a worker thread."""
        return cls(
            await asyncio.to_thread(SyncDbReader.open, url, settings=settings, read_only=read_only)
        )

    @property
    def metrics(self) -> StoreMetrics:
        """Object-store requests made so far (no I/O: not awaitable)."""
        return self.sync.metrics

    async def snapshot(self) -> Snapshot:
        """A read view fixed at what the reader sees now (see the sync ``snapshot``)."""
        return Snapshot(await asyncio.to_thread(self.sync.snapshot))

    async def refresh(self) -> None:
        """Poll now: apply new WAL SSTs and adopt a newer compacted state."""
        await asyncio.to_thread(self.sync.refresh)

    def __repr__(self) -> str:
        return f"aio.{self.sync!r}"


class Snapshot(_AsyncReads):
    """Async wrapper around :class:`slatepy.engine.snapshot.Snapshot`; release it with
    ``await snap.close()`` or ``async with``."""

    sync: SyncSnapshot

    def __init__(self, snapshot: SyncSnapshot) -> None:
        self.sync = snapshot

    @property
    def seq(self) -> int:
        """The sequence number of the newest write the snapshot sees."""
        return self.sync.seq


class Transaction:
    """Async wrapper around :class:`slatepy.engine.txn.Transaction` (await one call at a
    time: a transaction is used by one task)."""

    def __init__(self, txn: SyncTransaction) -> None:
        self.sync = txn

    async def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` as the transaction sees it; see the sync ``get``."""
        return await asyncio.to_thread(self.sync.get, key, default)

    def put(self, key: bytes, value: bytes) -> None:
        """Buffer ``key = value`` (no I/O: not awaitable)."""
        self.sync.put(key, value)

    def delete(self, key: bytes) -> None:
        """Buffer the deletion of ``key`` (no I/O: not awaitable)."""
        self.sync.delete(key)

    async def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """The transaction's view of ``[start, end)`` as one list; see the sync ``scan``."""
        return await asyncio.to_thread(
            lambda: list(self.sync.scan(start, end, reverse=reverse, limit=limit))
        )

    async def commit(self, *, await_durable: bool = True) -> None:
        """Apply the writes atomically, or raise ``TransactionConflict``; with
        ``await_durable=False`` return before they are durable (see the sync ``commit``)."""
        await asyncio.to_thread(self.sync.commit, await_durable=await_durable)

    async def rollback(self) -> None:
        """Discard the writes."""
        await asyncio.to_thread(self.sync.rollback)

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


class WalReader:
    """Async form of :class:`slatepy.engine.wal_reader.WalReader` (change data capture):
    ``async with await WalReader.open(url) as feed: async for record in feed.iter(...)``.

    Each WAL SST is read, and each poll of a follower waited out, on a worker thread, so the
    event loop never blocks; records come out one WAL SST at a time. ``close`` ends a
    following iterator at its next poll (within ``poll_interval``).
    """

    def __init__(self, reader: SyncWalReader) -> None:
        self.sync = reader

    @classmethod
    async def open(cls, url: str | ObjectStore, *, settings: Settings | None = None) -> WalReader:
        """:class:`slatepy.engine.wal_reader.WalReader` constructed on a worker thread."""
        return cls(await asyncio.to_thread(SyncWalReader, url, settings=settings))

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


__all__ = ["Db", "DbReader", "KeyValue", "Snapshot", "Transaction", "WalReader", "WriteBatch"]
