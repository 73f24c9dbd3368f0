"""The asyncio facade: the same calls as :class:`slatepy.Db`, awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop is never blocked by object-store I/O; group commit still applies because the
waiting happens in those threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Self

from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db as SyncDb
from slatepy.store.base import ObjectStore
from slatepy.store.metrics import StoreMetrics
from slatepy.table.merge_operator import MergeOperator


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
        return self.sync.epoch

    @property
    def metrics(self) -> StoreMetrics:
        return self.sync.metrics

    async def put(
        self,
        key: bytes,
        value: bytes,
        *,
        await_durable: bool = True,
        ttl: float | None = None,
    ) -> None:
        await asyncio.to_thread(self.sync.put, key, value, await_durable=await_durable, ttl=ttl)

    async def merge(self, key: bytes, operand: bytes, *, await_durable: bool = True) -> None:
        await asyncio.to_thread(self.sync.merge, key, operand, await_durable=await_durable)

    async def delete_range(self, start: bytes, end: bytes, *, await_durable: bool = True) -> None:
        await asyncio.to_thread(self.sync.delete_range, start, end, await_durable=await_durable)

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


__all__ = ["Db", "WriteBatch"]
