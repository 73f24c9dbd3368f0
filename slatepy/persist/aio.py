"""The asyncio facade of persist shards: the same calls as :mod:`slatepy.persist`, awaitable.

Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``), so
an event loop never blocks on the object store or consensus; a :class:`Listen` is an async
iterator. Properties that need no I/O (``upper``, ``since``, ``opaque``) stay plain. The
twins are declared with :mod:`slatepy.facade` (RFC 0033), as :mod:`slatepy.aio`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from slatepy.config import Settings, SettingsLike
from slatepy.facade import (
    Attribute,
    ClosingFacade,
    Facade,
    attribute,
    in_thread,
    in_thread_as,
    plain,
    plain_as,
)
from slatepy.persist import client as sync_client
from slatepy.persist import critical, read, write
from slatepy.persist.config import PersistSettings
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.read import Event
from slatepy.store.base import ObjectStore

_SHARD_ID: Attribute[str] = Attribute("shard_id", "The shard this handle works on.")
_READER_ID: Attribute[str] = Attribute("reader_id", "This reader's id in the shard's state.")


class BatchBuilder(Facade[write.BatchBuilder], wraps=write.BatchBuilder):
    """Async wrapper of :class:`slatepy.persist.write.BatchBuilder` (a full buffer is
    written out inside ``add``, so it is awaitable too)."""

    add = in_thread(write.BatchBuilder.add)
    extend = in_thread(write.BatchBuilder.extend)
    finish = in_thread(write.BatchBuilder.finish)
    max_time = attribute(write.BatchBuilder.max_time)


_WRITE_STEPS = "a step of the write path (slatepy.persist.writing), not for callers"


class WriteHandle(
    ClosingFacade[write.WriteHandle],
    wraps=write.WriteHandle,
    unmirrored={
        "check_range": "a static argument check of the write path",
        "delete_runs": _WRITE_STEPS,
        "new_batch": _WRITE_STEPS,
        "write_run": _WRITE_STEPS,
        "now_ms": "the client's clock, read by the write path",
        "settings": "the shard's settings, read by the write path",
    },
):
    """Async wrapper of :class:`slatepy.persist.WriteHandle` (``async with`` closes it)."""

    shard_id = _SHARD_ID
    writer_id: Attribute[str] = Attribute("writer_id", "This writer's id in the shard's state.")
    upper = attribute(write.WriteHandle.upper)
    closed = attribute(write.WriteHandle.closed)
    fetch_recent_upper = in_thread(write.WriteHandle.fetch_recent_upper)
    compare_and_append = in_thread(write.WriteHandle.compare_and_append)
    append = in_thread(write.WriteHandle.append)
    batch = in_thread(write.WriteHandle.batch)
    builder = plain_as(BatchBuilder, write.WriteHandle.builder)
    batch_from_bytes = plain(write.WriteHandle.batch_from_bytes)
    compare_and_append_batch = in_thread(write.WriteHandle.compare_and_append_batch)
    heartbeat = in_thread(write.WriteHandle.heartbeat)
    expire = in_thread(write.WriteHandle.expire)


class Listen(ClosingFacade[read.Listen], wraps=read.Listen):
    """Async wrapper of :class:`slatepy.persist.Listen`: ``async for event in listen``
    (``async with`` closes it)."""

    frontier: Attribute[int | None] = Attribute(
        "frontier", "Every update before it has been delivered (None: the shard is sealed)."
    )
    ended = attribute(read.Listen.ended)
    fetch_next = in_thread(read.Listen.fetch_next)

    async def __aiter__(self) -> AsyncIterator[Event]:
        """Events until the listen ends (``Progress(None)``) or is closed."""
        while not self.sync.ended:
            for event in await asyncio.to_thread(self.sync.fetch_next):
                yield event


class ReadHandle(
    ClosingFacade[read.ReadHandle],
    wraps=read.ReadHandle,
    unmirrored={"snapshot_iter": "a sync stream in bounded memory: use snapshot or listen"},
):
    """Async wrapper of :class:`slatepy.persist.ReadHandle` (``async with`` closes it)."""

    shard_id = _SHARD_ID
    reader_id = _READER_ID
    since = attribute(read.ReadHandle.since)
    closed = attribute(read.ReadHandle.closed)
    downgrade_since = in_thread(read.ReadHandle.downgrade_since)
    snapshot = in_thread(read.ReadHandle.snapshot)
    listen = in_thread_as(Listen, read.ReadHandle.listen)
    subscribe = in_thread_as(Listen, read.ReadHandle.subscribe)
    heartbeat = in_thread(read.ReadHandle.heartbeat)
    expire = in_thread(read.ReadHandle.expire)


class SinceHandle(ClosingFacade[critical.SinceHandle], wraps=critical.SinceHandle):
    """Async wrapper of :class:`slatepy.persist.SinceHandle` (``async with`` closes it)."""

    shard_id = _SHARD_ID
    reader_id = _READER_ID
    since = attribute(critical.SinceHandle.since)
    opaque = attribute(critical.SinceHandle.opaque)
    closed = attribute(critical.SinceHandle.closed)
    compare_and_downgrade_since = in_thread(critical.SinceHandle.compare_and_downgrade_since)
    expire = in_thread(critical.SinceHandle.expire)


class PersistClient(
    ClosingFacade[sync_client.PersistClient],
    wraps=sync_client.PersistClient,
    unmirrored={"machine": "the shard's shared state machine, a persist internal"},
):
    """Async wrapper of :class:`slatepy.persist.PersistClient`; ``await PersistClient.open``."""

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

    open_writer = in_thread_as(WriteHandle, sync_client.PersistClient.open_writer)
    open_leased_reader = in_thread_as(ReadHandle, sync_client.PersistClient.open_leased_reader)
    open_critical_since = in_thread_as(SinceHandle, sync_client.PersistClient.open_critical_since)
    snapshot_latest = in_thread(sync_client.PersistClient.snapshot_latest)
    finalize_shard = in_thread(sync_client.PersistClient.finalize_shard)
    list_shards = in_thread(sync_client.PersistClient.list_shards)
    wait_maintenance = in_thread(sync_client.PersistClient.wait_maintenance)
