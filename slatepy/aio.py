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
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from slatepy.config import SettingsLike
from slatepy.engine.batch import WriteBatch
from slatepy.engine.checkpoint import Checkpoint
from slatepy.engine.clone import clone as sync_clone
from slatepy.engine.db import Db as SyncDb
from slatepy.engine.iterator import DEFAULT_BATCH_SIZE, BatchFormat
from slatepy.engine.reader import DbReader as SyncDbReader
from slatepy.engine.snapshot import Snapshot as SyncSnapshot
from slatepy.engine.surface import KeyValue, ReadSurface
from slatepy.engine.txn import Transaction as SyncTransaction
from slatepy.engine.wal_reader import StartAt, WalRecord
from slatepy.engine.wal_reader import WalReader as SyncWalReader
from slatepy.facade import (
    ClosingFacade,
    ExitingFacade,
    Rows,
    attribute,
    in_thread,
    in_thread_as,
    plain,
    plain_as,
    rows,
)
from slatepy.store.base import ObjectStore
from slatepy.table.merge_operator import MergeOperator

_END = object()


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


class _AsyncReads(ClosingFacade[Any]):
    """The reads every handle offers (writer, reader, snapshot), over ``self.sync``."""

    get = in_thread(ReadSurface.get)
    get_many = in_thread(SyncSnapshot.get_many)
    get_key_value = in_thread(ReadSurface.get_key_value)
    scan = rows(ReadSurface.scan, DEFAULT_BATCH_SIZE)
    scan_prefix = rows(ReadSurface.scan_prefix, DEFAULT_BATCH_SIZE)
    items = rows(ReadSurface.items, DEFAULT_BATCH_SIZE)
    items_with_expiry = rows(ReadSurface.items_with_expiry, DEFAULT_BATCH_SIZE)

    async def contains(self, key: bytes) -> bool:
        """Whether ``key`` has a live value (``in`` cannot be awaited)."""
        result: bool = await asyncio.to_thread(self.sync.__contains__, key)
        return result

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


_CURSORS = {
    "iter": "a seekable cursor, sync by nature: use scan or items (awaitable, async-iterable)",
    "keys": "use items (awaitable, async-iterable) and take the keys",
    "values": "use items (awaitable, async-iterable) and take the values",
}


class Snapshot(_AsyncReads, wraps=SyncSnapshot, unmirrored=_CURSORS):
    """Async wrapper around :class:`slatepy.engine.snapshot.Snapshot`; release it with
    ``await snap.close()`` or ``async with``."""

    sync: SyncSnapshot

    seq = attribute(SyncSnapshot.seq)
    snapshot_id = attribute(SyncSnapshot.snapshot_id)
    manifest = attribute(SyncSnapshot.manifest, "The manifest the snapshot reads.")


class Transaction(ExitingFacade[SyncTransaction], wraps=SyncTransaction):
    """Async wrapper around :class:`slatepy.engine.txn.Transaction` (await one call at a
    time: a transaction is used by one task); ``async with`` it to commit on a clean exit
    and roll back on an exception."""

    isolation = attribute(SyncTransaction.isolation, """``"snapshot"`` or ``"serializable"``.""")
    start_seq = attribute(SyncTransaction.start_seq)
    get = in_thread(SyncTransaction.get)
    put = plain(SyncTransaction.put)
    delete = plain(SyncTransaction.delete)
    scan = rows(SyncTransaction.scan, DEFAULT_BATCH_SIZE)
    commit = in_thread(SyncTransaction.commit)
    rollback = in_thread(SyncTransaction.rollback)


class Db(
    _AsyncReads,
    wraps=SyncDb,
    unmirrored={
        **_CURSORS,
        "write_batch": "a sync with-block: build a WriteBatch and await write(batch)",
    },
):
    """Async wrapper around :class:`slatepy.engine.db.Db`; open with ``await Db.open(...)``.

    Every method that does I/O is awaitable and runs the sync one on a worker thread, with
    its parameters and docstring; ``begin`` and the properties do no I/O and are plain.
    """

    sync: SyncDb

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

    url = attribute(SyncDb.url, "The database's location.")
    epoch = attribute(SyncDb.epoch, "This writer's epoch.")
    metrics = attribute(
        SyncDb.metrics, "Object-store requests made so far (no I/O: not awaitable)."
    )
    wal_id_last_compacted = attribute(SyncDb.wal_id_last_compacted)
    next_wal_id = attribute(SyncDb.next_wal_id, "The WAL id the next flush writes.")
    snapshot = in_thread_as(Snapshot, SyncDb.snapshot)
    begin = plain_as(Transaction, SyncDb.begin)
    put = in_thread(SyncDb.put)
    merge = in_thread(SyncDb.merge)
    delete = in_thread(SyncDb.delete)
    delete_range = in_thread(SyncDb.delete_range)
    write = in_thread(SyncDb.write)
    flush = in_thread(SyncDb.flush)
    refresh = in_thread(SyncDb.refresh)
    create_checkpoint = in_thread(SyncDb.create_checkpoint)
    list_checkpoints = in_thread(SyncDb.list_checkpoints)
    refresh_checkpoint = in_thread(SyncDb.refresh_checkpoint)
    delete_checkpoint = in_thread(SyncDb.delete_checkpoint)


class DbReader(
    _AsyncReads,
    wraps=SyncDbReader,
    unmirrored={
        **_CURSORS,
        "at_checkpoint": "a constructor: open(url, checkpoint=...)",
        "view": "the manifest the reads use, an engine internal",
    },
):
    """Async wrapper around :class:`slatepy.engine.reader.DbReader`; open with
    ``await DbReader.open(...)``."""

    sync: SyncDbReader

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

    metrics = attribute(
        SyncDbReader.metrics, "Object-store requests made so far (no I/O: not awaitable)."
    )
    manifest_id = attribute(SyncDbReader.manifest_id)
    wal_id = attribute(SyncDbReader.wal_id)
    snapshot_id = attribute(SyncDbReader.snapshot_id)
    read_only = attribute(SyncDbReader.read_only)
    snapshot = in_thread_as(Snapshot, SyncDbReader.snapshot)
    refresh = in_thread(SyncDbReader.refresh)


class WalReader(
    ClosingFacade[SyncWalReader],
    wraps=SyncWalReader,
    unmirrored={"iter_ssts": "iter, record by record (one worker-thread hop per WAL SST)"},
):
    """Async form of :class:`slatepy.engine.wal_reader.WalReader` (change data capture):
    ``async with await WalReader.open(url) as feed: async for record in feed.iter(...)``.

    Each WAL SST is read, and each poll of a follower waited out, on a worker thread, so the
    event loop never blocks; records come out one WAL SST at a time. ``close`` ends a
    following iterator at its next poll (within ``poll_interval``).
    """

    @classmethod
    def open(
        cls, url: str | os.PathLike[str] | ObjectStore, *, settings: SettingsLike = None
    ) -> Opening[WalReader]:
        """:meth:`slatepy.engine.wal_reader.WalReader.open` on a worker thread: ``await``
        it, or ``async with`` it."""

        async def opening() -> WalReader:
            return cls(await asyncio.to_thread(SyncWalReader.open, url, settings=settings))

        return Opening(opening())

    closed = attribute(SyncWalReader.closed, "Whether the feed was closed.")
    last_seq = in_thread(SyncWalReader.last_seq)

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
