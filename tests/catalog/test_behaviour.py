"""One behaviour suite over every implementation and the shadow (issue 31)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slatepy.catalog import (
    CATALOG_VERSION,
    InvalidCatalogObject,
    ReadOnlyCatalog,
    Sink,
    Source,
    StorageUsage,
    UninitializedCatalog,
)
from slatepy.catalog.storage import Contents, Row
from slatepy.errors import FencedError, TransactionConflict
from tests.catalog.conftest import Place


def test_an_uninitialized_catalog_is_only_read(place: Place) -> None:
    state = place.make()
    assert not state.is_initialized()
    assert state.epoch is None
    assert state.check_open() == (0, CATALOG_VERSION)
    with pytest.raises(UninitializedCatalog):
        state.open_read_only()
    with pytest.raises(UninitializedCatalog):
        state.dump()
    assert state.config("catalog_version") is None
    assert not place.make().is_initialized()  # none of it wrote anything


def test_open_initializes_then_each_open_bumps_the_epoch(place: Place) -> None:
    first = place.make()
    first.open()
    assert first.epoch == 1
    assert first.is_initialized()
    assert first.config("catalog_version") == CATALOG_VERSION
    assert first.config("deploy_generation") == 0
    second = place.make()
    assert second.epoch is None
    second.open()
    assert second.epoch == 2
    assert json.loads(second.dump())["epoch"] == 2
    second.confirm_leadership()


def test_reads_see_own_writes_and_names_are_unique(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction(user="alice")
    db = tx.create_database("orders", "file:///data/orders")
    assert tx.get("databases", {"id": db}) == {
        "name": "orders",
        "url": "file:///data/orders",
        "owner": "",
    }
    allocated = tx.get("id_allocators", {"name": "database"})
    with pytest.raises(InvalidCatalogObject, match="'orders' is taken"):
        tx.create_database("orders", "file:///elsewhere")
    assert tx.get("id_allocators", {"name": "database"}) == allocated  # changed nothing
    tx.set("databases", {"id": db}, {"name": "orders2", "url": "file:///data/orders"})
    tx.create_database("orders", "file:///data/orders-new")  # the rename freed the name
    src = tx.create_source(Source("pg", "postgres", data_shard="d1", remap_shard="r1"))
    tx.create_sink(Sink("out", "persist", "file:///sink"))
    tx.register_shard("file:///data", "d1", "data", owner="pg")
    tx.set_setting("mode", "fast")
    tx.set_system_configuration("max_sources", "10")
    assert [v["name"] for _, v in tx.entries("databases")] == ["orders2", "orders"]
    state.commit_transaction(tx)
    assert [v["name"] for _, v in state.entries("databases")] == ["orders2", "orders"]
    assert state.entries("sources")[0][0] == {"id": src}
    tx = state.transaction()
    with pytest.raises(InvalidCatalogObject, match="taken"):
        tx.create_source(Source("pg", "other"))
    assert tx.delete("sources", {"id": src}) is not None
    tx.create_source(Source("pg", "other"))
    state.commit_transaction(tx)
    reopened = place.make()
    reopened.open()
    assert reopened.entries("databases") == state.entries("databases")
    assert [v["kind"] for _, v in reopened.entries("sources")] == ["other"]
    assert reopened.entries("shards") == [
        ({"location": "file:///data", "shard": "d1"}, {"purpose": "data", "owner": "pg"})
    ]
    assert reopened.entries("settings") == [({"name": "mode"}, {"value": "fast"})]


def test_every_change_is_audited_and_the_audit_log_is_append_only(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction(user="bob")
    tx.create_database("a", "memory://")
    tx.set_setting("k", "v")
    state.commit_transaction(tx)
    tx = state.transaction(user="carol")
    tx.delete("settings", {"name": "k"})
    state.commit_transaction(tx)
    events = [(v["event_type"], v["collection"], v["user"]) for _, v in state.entries("audit_log")]
    assert events == [
        ("initialize", "config", ""),
        ("update", "id_allocators", "bob"),  # every committed change: allocators too
        ("create", "databases", "bob"),
        ("create", "settings", "bob"),
        ("delete", "settings", "carol"),
    ]
    place.make().open()  # an open changes the epoch: audited too
    (_, last), = place.make().entries("audit_log")[-1:]  # fmt: skip
    assert (last["event_type"], last["key"]["epoch"]) == ("open", 2)
    tx = state.transaction()
    for call in (
        lambda: tx.set("audit_log", {"id": 99}, {}),
        lambda: tx.delete("audit_log", {"id": 1}),
        lambda: tx.set("storage_usage", {"id": 1}, {}),
        lambda: tx.get("audit_log", {"id": 1}),
    ):
        with pytest.raises(InvalidCatalogObject):
            call()


def test_no_secrets_are_stored(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction()
    tx.create_database("a", "s3://key:secret@bucket/x")
    tx.create_source(Source("s", "postgres", connection="postgresql://u:pw@h/db?password=pw2"))
    tx.create_sink(Sink("k", "kv", "postgresql://u:pw@h/db"))
    tx.register_shard("postgresql://u:pw@h/db", "s1", "data")
    tx.record_storage_usage(StorageUsage("s1", "s3://a:b@bucket/x", 10, 0))
    state.commit_transaction(tx)
    dumped = state.dump()
    assert "secret" not in dumped
    assert "pw" not in dumped
    assert state.entries("storage_usage") == [
        (
            {"id": 1},
            {"shard": "s1", "location": "s3://a@bucket/x", "bytes": 10, "collected_at_ms": 0},
        )
    ]


def test_read_only_refuses_every_mutation(place: Place) -> None:
    writer = place.make()
    writer.open()
    tx = writer.transaction()
    tx.create_database("a", "memory://")
    writer.commit_transaction(tx)
    reader = place.make()
    reader.open_read_only()
    assert reader.is_read_only
    assert reader.epoch == 1
    assert [v["name"] for _, v in reader.entries("databases")] == ["a"]
    tx = reader.transaction()
    assert tx.get("databases", {"id": 1}) is not None
    for mutation in (
        lambda: tx.set("settings", {"name": "a"}, {"value": "b"}),
        lambda: tx.delete("databases", {"id": 1}),
        lambda: tx.create_database("b", "memory://"),
        lambda: tx.allocate_ids("database"),
        lambda: tx.record_storage_usage(StorageUsage("s", "memory://", 1, 0)),
        lambda: reader.commit_transaction(writer.transaction()),
        reader.confirm_leadership,
    ):
        with pytest.raises(ReadOnlyCatalog):
            mutation()
    writer.confirm_leadership()  # the read-only open fenced nobody


def test_a_transaction_made_before_another_commit_conflicts(place: Place) -> None:
    state = place.make()
    state.open()
    first, second = state.transaction(), state.transaction()
    first.set_setting("a", "1")
    second.set_setting("b", "2")
    state.commit_transaction(first)
    with pytest.raises(TransactionConflict):
        state.commit_transaction(second)
    assert state.entries("settings") == [({"name": "a"}, {"value": "1"})]


def test_an_older_leaders_commit_is_fenced_and_writes_nothing(place: Place) -> None:
    old = place.make()
    old.open()
    tx = old.transaction()
    tx.create_database("lost", "memory://")
    new = place.make()
    new.open()
    with pytest.raises(FencedError, match=r"fenced|fence epoch"):
        old.commit_transaction(tx)
    with pytest.raises(FencedError):
        old.confirm_leadership()
    with pytest.raises(FencedError):
        old.transaction()
    assert new.entries("databases") == []
    check = place.make()
    check.open_read_only()
    assert check.entries("databases") == []
    # Only the two opens are in the audit log: the fenced commit's events are not.
    assert [v["event_type"] for _, v in check.entries("audit_log")] == ["initialize", "open"]


def test_the_dump_is_json_of_every_collection(place: Place) -> None:
    state = place.make()
    state.open()
    tx = state.transaction()
    tx.create_database("a", "memory://")
    state.commit_transaction(tx)
    dumped = json.loads(state.dump())
    assert dumped["epoch"] == 1
    assert dumped["collections"]["databases"] == [
        {"key": {"id": 1}, "value": {"name": "a", "url": "memory://", "owner": ""},
         "time": 1, "diff": 1}
    ]  # fmt: skip
    assert len(dumped["collections"]["audit_log"]) == 3  # initialize, allocator, database
    small = json.loads(state.dump(ignore_large_collections=True))
    assert "audit_log" not in small["collections"]
    assert "storage_usage" not in small["collections"]
    assert set(small["collections"]) >= {"config", "id_allocators", "system_configurations"}


def test_an_open_that_loses_the_race_to_another_open_reads_again(single: Place) -> None:
    single.state().open()  # epoch 1
    loser, winner = single.state(), single.state()
    storage = loser._storage
    real_read = storage.read
    calls = []

    def read_then_lose() -> Contents:
        contents = real_read()
        calls.append(contents.epoch)
        if len(calls) == 1:
            winner.open()  # between the loser's read and its write
        return contents

    storage.read = read_then_lose  # type: ignore[method-assign]
    loser.open()
    # The first write was fenced; the open read again (persist also reads for the message).
    assert calls[0] == 1 and calls[-1] == 2
    assert (winner.epoch, loser.epoch) == (2, 3)
    with pytest.raises(FencedError):
        winner.confirm_leadership()
    loser.confirm_leadership()


def test_a_debug_edit_that_loses_a_race_reads_again_and_retries(single: Place) -> None:
    leader = single.state()
    leader.open()
    tool = single.state()
    storage = tool._storage
    real_write = storage.write
    attempts = []

    def lose_once(rows: list[Row], **kwargs: Any) -> int:
        attempts.append(kwargs["expected_upper"])
        if len(attempts) == 1:
            tx = leader.transaction()
            tx.set_setting("leader", "1")
            leader.commit_transaction(tx)  # moves the upper under the edit
        return real_write(rows, **kwargs)

    storage.write = lose_once  # type: ignore[method-assign]
    previous = tool.debug_commit(lambda tx: tx.set_setting("tool", "2"), user="tool")
    assert previous is None
    assert attempts == [1, 2, 3]  # lost; the empty write fencing the leader (addendum E); won
    check = single.state()
    check.open_read_only()
    assert check.settings() == {"leader": "1", "tool": "2"}
    assert check.epoch == 1  # edits never bump the epoch
