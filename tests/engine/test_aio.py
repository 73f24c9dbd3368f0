"""The asyncio facade behaves like the sync API, and concurrent awaits share WAL PUTs."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy import NotFound, Settings, TransactionConflict, WriteBatch, aio
from slatepy.engine.txn import Transaction as SyncTransaction
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
            await db.put(b"t", b"x", ttl=60)
            rows = await db.items_with_expiry()
            assert [row[:2] for row in rows] == [(b"a", b"1"), (b"b", b"2"), (b"t", b"x")]
            assert rows[0][2] is None and rows[2][2] is not None
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


def test_async_checkpoints_checkpoint_readers_and_clones(tmp_path: Path) -> None:
    source, target = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    fast = Settings(compactor="off", flush_interval=0.02)

    async def scenario() -> None:
        async with await aio.Db.open(source, settings=fast) as db:
            await db.put(b"a", b"1")
            await db.put(b"b", b"1", await_durable=False)  # create_checkpoint flushes it
            cp = await db.create_checkpoint(lifetime=600, name="before")
            await db.put(b"a", b"2")
            assert [c.id for c in await db.list_checkpoints()] == [cp.id]
            renewed = await db.refresh_checkpoint(cp.id, None)
            assert renewed.id == cp.id and renewed.expire_time is None
            async with await aio.DbReader.open(source, checkpoint=cp.id) as reader:
                assert reader.read_only
                assert await reader.scan() == [(b"a", b"1"), (b"b", b"1")]
                await reader.refresh()  # a checkpoint reader stays where it is
                assert await reader.get(b"a") == b"1"
            made = await aio.clone(source, target, checkpoint=cp.id, settings=fast)
            assert made.name.startswith("clone:")
            await db.delete_checkpoint(cp.id)
            assert [c.id for c in await db.list_checkpoints()] == [made.id]
            with pytest.raises(NotFound):
                await db.delete_checkpoint(cp.id)
        async with await aio.Db.open(target, settings=fast) as cloned:
            assert await cloned.scan() == [(b"a", b"1"), (b"b", b"1")]

    asyncio.run(scenario())


def public_callables() -> Iterator[tuple[str, object]]:
    """Every function, method and property the aio module offers, by qualified name."""
    for name in aio.__all__:
        member = getattr(aio, name)
        if getattr(member, "__module__", None) != aio.__name__:
            continue  # re-exported (WriteBatch, KeyValue, Checkpoint): documented at home
        if not inspect.isclass(member):
            yield name, member
            continue
        for klass in member.__mro__:
            if klass.__module__ != aio.__name__:
                continue
            for attr, value in vars(klass).items():
                function = value.__func__ if isinstance(value, classmethod) else value
                if callable(function) or isinstance(function, property):
                    if attr.startswith("_") and not attr.startswith("__"):
                        continue
                    yield f"{name}.{attr}", function


def test_every_aio_method_has_a_docstring() -> None:
    members = dict(public_callables())
    assert {"Db.put", "Db.create_checkpoint", "DbReader.open", "Transaction.commit"} <= set(members)
    assert "clone" in members
    missing = [name for name, member in members.items() if not (member.__doc__ or "").strip()]
    assert missing == []
    # The forwarding methods are coroutines with the sync method's parameters.
    assert inspect.iscoroutinefunction(aio.Db.create_checkpoint)
    assert "lifetime" in inspect.signature(aio.Db.create_checkpoint).parameters
    assert aio.Transaction.commit.__doc__ == SyncTransaction.commit.__doc__
