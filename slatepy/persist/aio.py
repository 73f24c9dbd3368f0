"""The asyncio facade of persist shards: the same calls as :mod:`slatepy.persist`, awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop never blocks on the object store or consensus; a :class:`Listen` is an async
iterator. Properties that need no I/O (``upper``, ``since``, ``opaque``) stay plain.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from slatepy.config import Settings, SettingsLike
from slatepy.persist import client as sync_client
from slatepy.persist import critical, read, write
from slatepy.persist.codec import Update
from slatepy.persist.config import PersistSettings
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.read import Event
from slatepy.store.base import ObjectStore


class _SyncClosable(Protocol):
    def close(self) -> None: ...


class _Closing:
    """``await handle.close()`` and ``async with handle:`` for a wrapper of a sync handle
    (the release it does, e.g. a reader's expire, runs on a worker thread)."""

    sync: _SyncClosable

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
        await self.close()


class PersistClient(_Closing):
    """Async wrapper of :class:`slatepy.persist.PersistClient`; ``await PersistClient.open``."""

    sync: sync_client.PersistClient

    def __init__(self, client: sync_client.PersistClient) -> None:
        self.sync = client

    @classmethod
    async def open(
        cls,
        url: str | ObjectStore,
        *,
        consensus: str | Consensus | None = None,
        settings: SettingsLike | PersistSettings = None,
        persist_settings: PersistSettings | Mapping[str, Any] | None = None,
        store_settings: Settings | None = None,
    ) -> PersistClient:
        """:meth:`slatepy.persist.PersistClient.open` on a worker thread."""
        return cls(
            await asyncio.to_thread(
                sync_client.PersistClient.open,
                url,
                consensus=consensus,
                settings=settings,
                persist_settings=persist_settings,
                store_settings=store_settings,
            )
        )

    async def open_writer(self, shard_id: str, *, purpose: str = "") -> WriteHandle:
        handle = await asyncio.to_thread(self.sync.open_writer, shard_id, purpose=purpose)
        return WriteHandle(handle)

    async def open_leased_reader(self, shard_id: str, *, purpose: str = "") -> ReadHandle:
        handle = await asyncio.to_thread(self.sync.open_leased_reader, shard_id, purpose=purpose)
        return ReadHandle(handle)

    async def open_critical_since(self, shard_id: str, reader_id: str) -> SinceHandle:
        handle = await asyncio.to_thread(self.sync.open_critical_since, shard_id, reader_id)
        return SinceHandle(handle)

    async def finalize_shard(self, shard_id: str) -> None:
        await asyncio.to_thread(self.sync.finalize_shard, shard_id)

    async def list_shards(self) -> list[str]:
        return await asyncio.to_thread(self.sync.list_shards)


class WriteHandle(_Closing):
    """Async wrapper of :class:`slatepy.persist.WriteHandle` (``async with`` closes it)."""

    sync: write.WriteHandle

    def __init__(self, handle: write.WriteHandle) -> None:
        self.sync = handle
        self.shard_id = handle.shard_id
        self.writer_id = handle.writer_id

    @property
    def upper(self) -> int | None:
        return self.sync.upper

    async def fetch_recent_upper(self) -> int | None:
        return await asyncio.to_thread(self.sync.fetch_recent_upper)

    async def compare_and_append(
        self, updates: Iterable[Update], expected_upper: int, new_upper: int | None
    ) -> None:
        await asyncio.to_thread(self.sync.compare_and_append, updates, expected_upper, new_upper)

    async def append(self, updates: Iterable[Update], lower: int, upper: int | None) -> None:
        await asyncio.to_thread(self.sync.append, updates, lower, upper)

    async def batch(self, updates: Iterable[Update], lower: int, upper: int | None) -> write.Batch:
        return await asyncio.to_thread(self.sync.batch, updates, lower, upper)

    def builder(self, lower: int) -> BatchBuilder:
        return BatchBuilder(self.sync.builder(lower))

    def batch_from_bytes(self, data: bytes) -> write.Batch:
        return self.sync.batch_from_bytes(data)

    async def compare_and_append_batch(
        self, batches: Sequence[write.Batch], expected_upper: int, new_upper: int | None
    ) -> None:
        await asyncio.to_thread(
            self.sync.compare_and_append_batch, batches, expected_upper, new_upper
        )

    async def expire(self) -> None:
        await asyncio.to_thread(self.sync.expire)


class BatchBuilder:
    """Async wrapper of :class:`slatepy.persist.write.BatchBuilder` (a full buffer is
    written out inside ``add``, so it is awaitable too)."""

    def __init__(self, builder: write.BatchBuilder) -> None:
        self.sync = builder

    async def add(self, key: bytes, value: bytes, time: int, diff: int) -> None:
        await asyncio.to_thread(self.sync.add, key, value, time, diff)

    async def finish(self, upper: int | None) -> write.Batch:
        return await asyncio.to_thread(self.sync.finish, upper)


class ReadHandle(_Closing):
    """Async wrapper of :class:`slatepy.persist.ReadHandle` (``async with`` closes it)."""

    sync: read.ReadHandle

    def __init__(self, handle: read.ReadHandle) -> None:
        self.sync = handle
        self.shard_id = handle.shard_id
        self.reader_id = handle.reader_id

    @property
    def since(self) -> int | None:
        return self.sync.since

    async def downgrade_since(self, new_since: int | None) -> int | None:
        return await asyncio.to_thread(self.sync.downgrade_since, new_since)

    async def snapshot(self, as_of: int, *, timeout: float | None = None) -> list[Update]:
        return await asyncio.to_thread(self.sync.snapshot, as_of, timeout=timeout)

    async def listen(self, as_of: int) -> Listen:
        return Listen(await asyncio.to_thread(self.sync.listen, as_of))

    async def subscribe(self, as_of: int, *, timeout: float | None = None) -> Listen:
        return Listen(await asyncio.to_thread(self.sync.subscribe, as_of, timeout=timeout))

    async def expire(self) -> None:
        await asyncio.to_thread(self.sync.expire)


class Listen(_Closing):
    """Async wrapper of :class:`slatepy.persist.Listen`: ``async for event in listen``
    (``async with`` closes it)."""

    sync: read.Listen

    def __init__(self, listen: read.Listen) -> None:
        self.sync = listen

    @property
    def frontier(self) -> int | None:
        return self.sync.frontier

    async def fetch_next(self, timeout: float | None = None) -> list[Event]:
        return await asyncio.to_thread(self.sync.fetch_next, timeout)

    async def __aiter__(self) -> AsyncIterator[Event]:
        """Events until the listen ends (``Progress(None)``) or is closed."""
        while not self.sync.ended:
            for event in await asyncio.to_thread(self.sync.fetch_next):
                yield event


class SinceHandle(_Closing):
    """Async wrapper of :class:`slatepy.persist.SinceHandle` (``async with`` closes it)."""

    sync: critical.SinceHandle

    def __init__(self, handle: critical.SinceHandle) -> None:
        self.sync = handle
        self.shard_id = handle.shard_id
        self.reader_id = handle.reader_id

    @property
    def since(self) -> int | None:
        return self.sync.since

    @property
    def opaque(self) -> bytes:
        return self.sync.opaque

    async def compare_and_downgrade_since(
        self, expected_opaque: bytes, new_opaque: bytes, new_since: int | None
    ) -> int | None:
        return await asyncio.to_thread(
            self.sync.compare_and_downgrade_since, expected_opaque, new_opaque, new_since
        )

    async def expire(self) -> None:
        await asyncio.to_thread(self.sync.expire)
