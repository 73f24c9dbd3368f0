"""Issue 32 item 4: the surface the anchors set (dict, rocksdict, plyvel, lmdb, sqlite3,
dbm). Each test here failed on the code before the change (checked against /work/base)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slatepy import Db, DbReader, InvalidArgument, Settings, WalReader, aio
from slatepy.store import open_store

OFF = Settings(compactor="off", flush_interval=0.02)
ROWS = {b"k%d" % i: b"v%d" % i for i in range(5)}


def test_keys_values_items_with_ranges_and_reverse_on_every_handle() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=OFF) as db:
        for key, value in ROWS.items():
            db[key] = value
        with DbReader.open(store, settings=OFF) as reader, db.snapshot() as snap:
            for handle in (db, reader, snap):
                assert dict(handle) == ROWS
                assert list(iter(handle)) == list(handle.keys()) == sorted(ROWS)
                assert list(handle.values()) == [ROWS[k] for k in sorted(ROWS)]
                assert list(handle.items(b"k1", b"k3")) == [(b"k1", b"v1"), (b"k2", b"v2")]
                assert list(handle.keys(reverse=True)) == sorted(ROWS, reverse=True)
                assert list(handle.values(b"k3", reverse=True)) == [b"v4", b"v3"]
                assert list(handle.items(prefix=b"k4")) == [(b"k4", b"v4")]
                # db.iter() is the seekable cursor: pairs, as items() (documented).
                assert list(handle.iter(b"k3")) == list(handle.items(b"k3"))


def test_keys_take_their_view_when_called() -> None:
    with Db.open("memory://", settings=OFF) as db:
        db[b"a"] = b"1"
        keys = db.keys()
        db[b"b"] = b"2"
        assert list(keys) == [b"a"]


def test_del_of_a_missing_key_raises_key_error() -> None:
    with Db.open("memory://", settings=OFF) as db:
        with pytest.raises(KeyError):
            del db[b"missing"]
        db[b"k"] = b"v"
        del db[b"k"]
        assert b"k" not in db
        db.delete(b"missing")  # the explicit call stays a blind write


@pytest.mark.parametrize(
    "call",
    [
        lambda db: db["str"],
        lambda db: db.put("str", b"v"),
        lambda db: db.put(b"k", "str"),
        lambda db: db.get(1),
        lambda db: db.__setitem__("str", b"v"),
        lambda db: list(db.scan("a")),
    ],
)
def test_wrong_types_raise_type_error_in_the_invalid_argument_family(call: object) -> None:
    with Db.open("memory://", settings=OFF) as db:
        with pytest.raises(TypeError) as raised:
            call(db)  # type: ignore[operator]
        assert isinstance(raised.value, InvalidArgument)
        with pytest.raises(InvalidArgument):  # empty keys are a value error, not a type one
            db.put(b"", b"v")


def test_constructors_point_to_open(tmp_path: Path) -> None:
    for cls in (Db, DbReader):
        with pytest.raises(TypeError, match=rf"use {cls.__name__}\.open\('memory://'\)"):
            cls("memory://")  # type: ignore[call-arg, arg-type]
    with pytest.raises(InvalidArgument, match=r"Db\.open"):
        Db(tmp_path)  # type: ignore[call-arg, arg-type]


def test_every_engine_handle_is_a_context_manager(tmp_path: Path) -> None:
    with Db.open(tmp_path, settings=OFF) as db:
        db[b"k"] = b"v"
        with db.snapshot() as snap, db.iter() as it, db.begin() as txn:
            assert snap[b"k"] == b"v" and next(it) == (b"k", b"v")
            txn.put(b"t", b"1")
    assert "closed" in repr(db)
    with WalReader.open(tmp_path) as feed:  # .open, as Db and DbReader (and a Path)
        assert [r.key for r in feed.iter()] == [b"k", b"t"]
    assert feed.closed
    with WalReader(tmp_path.as_uri()) as feed:  # the constructor still works
        assert feed.last_seq() > 0


def test_settings_say_did_you_mean_for_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match="did you mean 'flush_interval'") as raised:
        Settings(flush_intreval=1)  # type: ignore[call-arg]
    assert isinstance(raised.value, InvalidArgument)


def test_settings_repr_never_shows_secrets() -> None:
    settings = Settings(
        s3_access_key_id="AKIDEXAMPLE",
        s3_secret_access_key="wJalrXUtnFEMI-SECRET",
        s3_session_token="FwoGZXIvYXdz-TOKEN",
        azure_access_key="bXlrZXk-AZURE",
    )
    for text in (repr(settings), str(settings), f"{settings}", repr([settings])):
        assert "SECRET" not in text and "TOKEN" not in text and "AZURE" not in text
        assert "s3_secret_access_key='***'" in text and "flush_interval=0.1" in text
    assert "s3_session_token=None" in repr(Settings())
    rich = dict(settings.__rich_repr__())
    assert rich["s3_secret_access_key"] == "***" and rich["block_size"] == Settings().block_size


def test_aio_async_for_over_scans_and_async_with_open(tmp_path: Path) -> None:
    async def main() -> None:
        async with aio.Db.open(tmp_path, settings=OFF) as db:
            for key, value in ROWS.items():
                await db.put(key, value)
            assert [k async for k, _ in db.scan(b"k1", b"k3")] == [b"k1", b"k2"]
            assert await db.scan(limit=1) == [(b"k0", b"v0")]  # awaiting still gives a list
            assert [kv async for kv in db.scan_prefix(b"k4")] == [(b"k4", b"v4")]
            assert dict([kv async for kv in db.items()]) == ROWS
            async with db.begin() as txn:
                assert len([kv async for kv in txn.scan(reverse=True)]) == len(ROWS)
            async with aio.DbReader.open(tmp_path, settings=OFF) as reader:
                assert [k async for k, _ in reader.scan(reverse=True, limit=2)] == [b"k4", b"k3"]
            async with aio.WalReader.open(tmp_path) as feed:
                assert len([r async for r in feed.iter()]) == len(ROWS)
        assert "closed" in repr(db)
        plain = await aio.Db.open("memory://", settings=OFF)  # awaiting still works
        await plain.close()

    asyncio.run(main())
