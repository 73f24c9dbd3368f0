"""The asyncio facade behaves like the sync API, and concurrent awaits share WAL PUTs."""

from __future__ import annotations

import asyncio

from slatepy import Settings, WriteBatch, aio
from slatepy.store import open_store


def test_async_api_round_trip() -> None:
    store = open_store("memory://")

    async def scenario() -> None:
        async with await aio.Db.open(store, settings=Settings(flush_interval=60)) as db:
            await db.put(b"a", b"1")
            await db.write(WriteBatch().put(b"b", b"2").put(b"c", b"3"))
            await db.delete(b"c")
            assert await db.get(b"a") == b"1"
            assert await db.scan() == [(b"a", b"1"), (b"b", b"2")]
            puts = db.metrics.requests("put")
            await asyncio.gather(*(db.put(b"k%d" % i, b"v") for i in range(20)))
            assert db.metrics.requests("put") - puts <= 20
        async with await aio.Db.open(store) as db:
            assert await db.get(b"b") == b"2"
            assert await db.get(b"k19") == b"v"

    asyncio.run(scenario())
