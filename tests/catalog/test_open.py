"""``open_catalog`` URLs, typed accessors, the shadow catching a difference, and the stash's
nonce catching a catalog dropped and made again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from slatepy.catalog import (
    Database,
    ShadowMismatch,
    Sink,
    Source,
    StorageUsage,
    open_catalog,
    open_shadow,
    persist_catalog,
)
from slatepy.catalog.objects import ShardKey, strip_password
from slatepy.catalog.open import sqlite_path
from slatepy.errors import FencedError, InvalidArgument
from slatepy.persist import PersistClient
from tests.catalog.conftest import Place


def test_sqlite_urls_follow_sqlalchemy() -> None:
    assert sqlite_path("sqlite:////abs/path.db") == "/abs/path.db"
    assert sqlite_path("sqlite:///rel/path.db") == "rel/path.db"
    for bad in ("sqlite://", "sqlite:///", "sqlite:/x.db", "sqlite:////x.db?mode=ro"):
        with pytest.raises(InvalidArgument):
            sqlite_path(bad)


def test_strip_password() -> None:
    assert strip_password("postgresql://u:p@h:5432/d?sslmode=require&password=x") == (
        "postgresql://u@h:5432/d?sslmode=require"
    )
    assert strip_password("s3://bucket/prefix") == "s3://bucket/prefix"
    assert strip_password("/a/path") == "/a/path"


def test_a_relative_sqlite_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_catalog("sqlite:///rel.db") as state:
        state.open()
    assert (tmp_path / "rel.db").exists()


def test_postgres_descriptions_hold_no_password() -> None:
    state = open_catalog("postgresql://u:secret@127.0.0.1:1/db")
    assert "secret" not in state.description
    state.close()


def test_two_states_on_one_memory_client_share_the_catalog() -> None:
    with PersistClient.open("memory://") as client:
        first, second = persist_catalog(client), persist_catalog(client)
        first.open()
        second.open()
        assert second.epoch == 2
        assert len(first.entries("databases")) == 0  # cached: served from memory
        with pytest.raises(FencedError, match="epoch 1 fenced by new catalog epoch 2"):
            first.entries("audit_log")  # uncached: a leader reads it only while it leads
        with pytest.raises(FencedError):
            first.confirm_leadership()
        first.close()
        second.close()


def test_typed_accessors(single: Place) -> None:
    state = single.state()
    state.open()
    tx = state.transaction()
    tx.create_database("a", "memory://")
    tx.create_source(Source("s", "postgres"))
    tx.create_sink(Sink("k", "kv", "memory://"))
    tx.register_shard("memory://", "d", "data", owner="s")
    tx.record_storage_usage(StorageUsage("d", "memory://", 5, 7))
    tx.set_system_configuration("max", "3")
    state.commit_transaction(tx)
    assert state.databases() == [(1, Database("a", "memory://"))]
    assert [s.name for _, s in state.sources()] == ["s"]
    assert [s.name for _, s in state.sinks()] == ["k"]
    assert state.shards()[0][0] == ShardKey("memory://", "d")
    assert state.storage_usage() == [(1, StorageUsage("d", "memory://", 5, 7))]
    assert state.system_configurations() == {"max": "3"}
    assert state.id_allocators()["database"] == 2
    assert [e.event_type for _, e in state.audit_log()][-1] == "create"


def test_the_shadow_raises_on_a_difference(tmp_path: Path) -> None:
    primary = open_catalog(f"sqlite:///{tmp_path}/a.db")
    secondary = open_catalog(f"file://{tmp_path}/p")
    shadow = open_shadow(primary, secondary)
    shadow.open()
    other = open_catalog(f"file://{tmp_path}/p")
    other.debug_commit(lambda tx: tx.set_setting("only", "here"), user="test")
    other.close()
    with pytest.raises(ShadowMismatch, match="raised FencedError"):
        shadow.confirm_leadership()
    with pytest.raises(ShadowMismatch, match="settings"):
        shadow.entries("settings")
    shadow.close()


def _drop(place: Place) -> None:
    tables = [f"{place.shard}_{t}" for t in ("fence", "collections", "data", "uppers")]
    if place.name == "sqlite":
        with sqlite3.connect(place.url.removeprefix("sqlite:///")) as conn:
            for table in tables:
                conn.execute(f"DROP TABLE {table}")
    else:
        with psycopg.connect(place.url, autocommit=True) as conn:
            for table in tables:
                conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]


@pytest.mark.parametrize("single", ["sqlite", "postgres"], indirect=True)
def test_the_stash_nonce_fences_a_leader_of_a_dropped_catalog(single: Place) -> None:
    old = single.state()
    old.open()
    _drop(single)
    new = single.state()
    new.open()
    assert (new.epoch, new.upper) == (old.epoch, old.upper)  # only the nonce tells them apart
    tx = old.transaction()
    tx.set_setting("a", "b")
    with pytest.raises(FencedError, match="unexpected fence epoch 1, expected 1"):
        old.commit_transaction(tx)
    assert new.settings() == {}


def _data_rows(place: Place) -> int:
    table = f"{place.shard}_data"
    if place.name == "sqlite":
        with sqlite3.connect(place.url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    with psycopg.connect(place.url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("single", ["sqlite", "postgres"], indirect=True)
def test_an_open_compacts_the_stash(single: Place) -> None:
    state = single.state()
    state.open()
    for i in range(5):
        tx = state.transaction()
        tx.set_setting("churn", str(i))
        state.commit_transaction(tx)
    before = _data_rows(single)
    single.state().open()
    after = _data_rows(single)
    # Gone: four retracted setting values (8 rows) and six retracted audit allocator values
    # (12 rows); added: the open's retraction of the last one, its new value and the
    # open's audit event (3 rows). The fence's epoch change leaves no data rows.
    assert before - after == 17
    reopened = single.state()
    reopened.open_read_only()
    assert reopened.settings() == {"churn": "4"}
    assert len(reopened.audit_log()) == 7
