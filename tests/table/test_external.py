"""``ExternalSsts`` (RFC 0017): reads of a clone's shared SSTs go where they live; everything
else, every write and delete, stays on the own store; the map is learnt on the first miss."""

from __future__ import annotations

import pytest

from slatepy.errors import NotFound, StoreUnavailable
from slatepy.store import ObjectStore, open_store
from slatepy.table.external import ExternalSsts


def test_reads_of_external_ssts_go_to_their_store_and_nothing_else_does() -> None:
    own, source = open_store("memory://"), open_store("memory://")
    source.put("compacted/shared.sst", b"0123456789")
    own.put("compacted/mine.sst", b"mine")
    calls: list[int] = []

    def locate() -> dict[str, ObjectStore]:
        calls.append(1)
        return {"shared": source}

    store = ExternalSsts(own, locate)
    assert store.get("compacted/mine.sst") == b"mine"
    assert calls == []  # a database that is not a clone never looks
    assert store.get_range("compacted/shared.sst", 2, 5) == b"234"
    assert store.get_ranges("compacted/shared.sst", [(0, 1), (8, 10)]) == [b"0", b"89"]
    assert store.head("compacted/shared.sst").size == 10
    assert store.get("compacted/shared.sst") == b"0123456789"
    assert calls == [1]  # learnt once
    store.delete("compacted/shared.sst")  # goes to the own store: the source keeps it
    assert source.get("compacted/shared.sst") == b"0123456789"
    store.put("compacted/new.sst", b"x")
    assert [m.path for m in source.list("")] == ["compacted/shared.sst"]
    with pytest.raises(NotFound):
        store.get("compacted/absent.sst")
    with pytest.raises(NotFound):
        store.get("wal/00000000000000000001.sst")  # only compacted SSTs are ever external


def test_a_store_failure_while_locating_is_that_failure_not_a_miss() -> None:
    """A miss while the map cannot be loaded may be an external SST: answering NotFound made
    a clone's reader report its shared SSTs lost on a transient fault (found by the torture
    state machine); the store's failure is retried instead."""
    own = open_store("memory://")
    attempts: list[int] = []

    def locate() -> dict[str, ObjectStore]:
        attempts.append(1)
        raise StoreUnavailable("flaky", definite=True)

    store = ExternalSsts(own, locate)
    with pytest.raises(StoreUnavailable):
        store.get("compacted/x.sst")
    with pytest.raises(StoreUnavailable):
        store.get("compacted/x.sst")
    assert attempts == [1, 1]  # not cached: tried again on the next miss
