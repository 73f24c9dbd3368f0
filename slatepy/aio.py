"""The asyncio facade: the same calls as :class:`slatepy.Db`, awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop is never blocked by object-store I/O; group commit still applies because the
waiting happens in those threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db as SyncDb
from slatepy.engine.wal_reader import StartAt, WalRecord
from slatepy.engine.wal_reader import WalReader as SyncWalReader
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import StoreMetrics


class Db:
    """Async wrapper around :class:`slatepy.engine.db.Db`; open with ``await Db.open(...)``."""

    def __init__(self, db: SyncDb) -> None:
        self.sync = db

    @classmethod
    async def open(
        cls,
        url: str | ObjectStore,
        *,
        settings: Settings | None = None,
        create_if_missing: bool = True,
    ) -> Db:
        """:meth:`slatepy.engine.db.Db.open` on a worker thread."""
        return cls(
            await asyncio.to_thread(
                SyncDb.open, url, settings=settings, create_if_missing=create_if_missing
            )
        )

    @property
    def epoch(self) -> int:
        return self.sync.epoch

    @property
    def metrics(self) -> StoreMetrics:
        return self.sync.metrics

    async def put(self, key: bytes, value: bytes, *, await_durable: bool = True) -> None:
        await asyncio.to_thread(self.sync.put, key, value, await_durable=await_durable)

    async def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        await asyncio.to_thread(self.sync.delete, key, await_durable=await_durable)

    async def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        await asyncio.to_thread(self.sync.write, batch, await_durable=await_durable)

    async def get(self, key: bytes) -> bytes | None:
        return await asyncio.to_thread(self.sync.get, key)

    async def scan(self, start: bytes = b"", end: bytes | None = None) -> list[tuple[bytes, bytes]]:
        return await asyncio.to_thread(lambda: list(self.sync.scan(start, end)))

    async def flush(self) -> None:
        await asyncio.to_thread(self.sync.flush)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
        self.sync.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = ["Db", "WalReader", "WriteBatch"]
