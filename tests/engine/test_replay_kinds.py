"""WAL replay with RFC 0019 kinds (found by the torture state machine): a merge written after
a range delete, in the same WAL SST, stacks on nothing when the WAL is replayed, as it does
in the live writer's memtable."""

from __future__ import annotations

from slatepy import Db, DbReader, Settings
from slatepy.store import open_store

SETTINGS = Settings(compactor="off", flush_interval=60)


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join(([] if existing is None else [existing]) + operands)


def test_a_merge_after_a_range_delete_in_one_wal_sst_replays_over_nothing() -> None:
    """Replay applied a WAL SST's entries before its range tombstones: the merge after the
    delete stacked on the operands the delete removed, and the stack (newer than the
    tombstone) brought them back: readers and a reopened writer read ``9,27,38``."""
    store = open_store("memory://")
    db = Db.open(store, settings=SETTINGS, merge_operator=concat)
    db.merge(b"m", b"9")
    db.merge(b"m", b"27")
    db.delete_range(b"a", b"z", await_durable=False)
    db.merge(b"m", b"38")  # durable: one WAL SST with the range delete and this merge
    assert db.get(b"m") == b"38"
    with DbReader.open(store, settings=SETTINGS, merge_operator=concat) as reader:
        assert reader.get(b"m") == b"38"
    db._crash()
    with Db.open(store, settings=SETTINGS, merge_operator=concat) as db:
        assert db.get(b"m") == b"38"
