"""The Pythonic surface (RFC 0020): mapping protocol, defaults, ``with db.write_batch()``,
``pathlib.Path`` URLs, reprs, and the asyncio facade of the writer and the reader."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slatepy import Db, DbReader, InvalidArgument, Settings, TransactionConflict, aio
from slatepy.store import open_store

OFF = Settings(compactor="off", flush_interval=0.02)


def test_mapping_protocol_and_defaults() -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"a"] = b"1"
        assert db[b"a"] == b"1"
        assert b"a" in db and b"b" not in db
        with pytest.raises(KeyError):
            db[b"b"]
        assert db.get(b"b") is None
        assert db.get(b"b", b"fallback") == b"fallback"
        assert db.get(b"a", b"fallback") == b"1"
        del db[b"a"]
        assert b"a" not in db
        with pytest.raises(KeyError):
            del db[b"never"]  # the mapping protocol's promise (dict, dbm); delete() is blind
        db.delete(b"never")
        db[b"x"], db[b"y"] = b"1", b"2"
        assert list(db) == [b"x", b"y"]
        with pytest.raises(InvalidArgument):
            db["str"] = b"x"  # type: ignore[index]


def test_write_batch_context_writes_on_exit_only_without_exception() -> None:
    with Db.open("memory://", settings=OFF) as db:
        with db.write_batch() as batch:
            batch.put(b"a", b"1").put(b"b", b"2").delete(b"c")
            assert db.get(b"a") is None  # nothing before the block ends
        assert db[b"a"] == b"1" and db[b"b"] == b"2"
        with pytest.raises(RuntimeError), db.write_batch() as batch:
            batch.put(b"x", b"1")
            raise RuntimeError("abandon")
        assert b"x" not in db


def test_path_urls_and_reprs(tmp_path: Path) -> None:
    location = tmp_path / "db"
    with Db.open(location, settings=OFF) as db:
        db[b"k"] = b"v"
        assert repr(db) == f"Db({location.as_uri()!r}, epoch=1)"
        with DbReader.open(location, settings=OFF) as reader:
            assert reader[b"k"] == b"v"
            assert location.as_uri() in repr(reader) and "epoch=1" in repr(reader)
    assert "closed" in repr(db)


def test_aio_writer_and_reader() -> None:
    store = open_store("memory://")

    async def scenario() -> None:
        async with await aio.Db.open(store, settings=OFF) as db:
            for i in range(30):
                await db.put(b"k%02d" % i, b"v%d" % i)
            assert await db.get(b"zz", b"d") == b"d"
            assert await db.scan(reverse=True, limit=2) == [(b"k29", b"v29"), (b"k28", b"v28")]
            assert await db.scan_prefix(b"k1") == [(b"k1%d" % i, b"v1%d" % i) for i in range(10)]
            kv = await db.get_key_value(b"k03")
            assert kv is not None and kv.value == b"v3"
            assert await db.contains(b"k03")
            async with await aio.DbReader.open(store, settings=OFF) as reader:
                assert "aio.DbReader" in repr(reader)
                rows = [r async for b in reader.scan_batches(batch_size=7) for r in b]
                assert rows == await db.scan()
                assert await reader.get_many([b"k00", b"nope"]) == [b"v0", None]

    asyncio.run(scenario())


def test_aio_snapshot_and_transaction() -> None:
    async def scenario() -> None:
        async with await aio.Db.open("memory://", settings=OFF) as db:
            await db.put(b"a", b"1")
            async with await db.snapshot() as snap:
                await db.put(b"a", b"2")
                assert await snap.get(b"a") == b"1" and snap.seq > 0
                assert await snap.scan() == [(b"a", b"1")]
            async with db.begin("serializable") as txn:
                txn.put(b"b", (await txn.get(b"a")) or b"")
                assert await txn.scan() == [(b"a", b"2"), (b"b", b"2")]
            assert await db.get(b"b") == b"2"
            loser, winner = db.begin(), db.begin()
            for txn in (loser, winner):
                txn.put(b"a", b"x")
            await winner.commit()
            with pytest.raises(TransactionConflict):
                await loser.commit()

    asyncio.run(scenario())


def test_every_aio_method_has_a_docstring() -> None:
    for cls in (aio.Db, aio.DbReader, aio.Snapshot, aio.Transaction):
        for name in dir(cls):
            if name.startswith("_") and name not in ("__aenter__", "__aexit__"):
                continue
            member = getattr(cls, name)
            if callable(member) or isinstance(member, property):
                assert (member.__doc__ or "").strip(), f"{cls.__name__}.{name}"
