"""The asyncio facade behaves like the sync API, and concurrent awaits share WAL PUTs."""

from __future__ import annotations

import asyncio

import pytest

from slatepy import Settings, TransactionConflict, WriteBatch, aio
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


def test_async_transactions_commit_awaited_or_not() -> None:
    store = open_store("memory://")
    idle = Settings(compactor="off", flush_interval=60)

    async def scenario() -> None:
        db = await aio.Db.open(store, settings=idle)
        async with db.begin() as txn:
            txn.put(b"a", b"1")
        txn2 = db.begin("serializable")
        assert await txn2.get(b"a") == b"1"
        txn2.put(b"a", b"2")
        txn2.put(b"b", b"2")
        puts = db.metrics.requests("put")
        await txn2.commit(await_durable=False)
        assert await db.get_many([b"a", b"b"]) == [b"2", b"2"]
        assert db.metrics.requests("put") == puts  # not written yet
        late, early = db.begin(), db.begin()
        late.put(b"b", b"3")
        early.put(b"b", b"4")
        await late.commit(await_durable=False)
        with pytest.raises(TransactionConflict):
            await early.commit(await_durable=False)
        db.sync._crash()  # before any flush: both unawaited transactions are gone
        async with await aio.Db.open(store, settings=idle) as db:
            assert await db.scan() == [(b"a", b"1")]

    asyncio.run(scenario())
