"""Change feed (``WalReader``, RFC 0018) cases the torture workload's state machine found:
settings it must accept, and how the feed shows the entry kinds of RFC 0019."""

from __future__ import annotations

import pytest

from slatepy import Db, Settings, WalReader
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import ObjectStore, open_store

SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=2, target_sst_bytes=4096)


def test_a_feed_that_does_not_follow_accepts_a_long_reader_poll_interval() -> None:
    """``reader_poll_interval`` (a ``DbReader`` setting, often minutes for idle readers) is
    only the default of a follower's poll interval, capped at 60 s: a feed that does not
    follow must not refuse it. It raised ``InvalidArgument`` before."""
    store = open_store("memory://")
    settings = Settings(compactor="off", reader_poll_interval=3600.0)
    with Db.open(store, settings=settings) as db:
        db.put(b"k", b"v")
    feed = WalReader(store, settings=settings)
    assert [(r.key, r.value) for r in feed.iter("oldest")] == [(b"k", b"v")]


def _compact_and_collect(store: ObjectStore, settings: Settings) -> None:
    Compactor(store, settings=settings, policy=SMALL).run_until_idle()
    gc = GarbageCollector(store, settings=settings, min_age=0)
    gc.collect()
    gc.collect()


def test_a_checkpoint_s_wal_island_does_not_cut_the_feed() -> None:
    """A checkpoint keeps the WAL from its manifest's ``wal_id_last_compacted`` to its
    ``wal_id`` and GC deletes the compacted WAL after it (RFC 0017), leaving an island of old
    WAL SSTs below a hole. The feed follows the run that reaches the live WAL: "oldest" never
    raises, and a start at a recent seq reads on. Both raised ``WalHistoryGone`` before
    (the feed started at the island and stopped at the hole)."""
    store = open_store("memory://")
    settings = Settings(compactor="off", flush_interval=60)
    with Db.open(store, settings=settings) as db:
        db.put(b"a", b"1")
        db.create_checkpoint(name="island")
        for i in range(6):
            db.put(b"b%d" % i, b"2")
        _compact_and_collect(store, settings)
        feed = WalReader(store, settings=settings)
        mark = feed.last_seq()
        db.put(b"c", b"3")
        assert [r.key for r in WalReader(store, settings=settings).iter(mark + 1)] == [b"c"]
        oldest = [r.key for r in WalReader(store, settings=settings).iter("oldest")]
        assert oldest[-1] == b"c"


@pytest.mark.xfail(
    strict=True,
    reason="known gap (RFC 0018 vs 0019): range tombstones live in a WAL SST's properties, "
    "not its entries, so the feed never shows a delete_range and a replica keeps the keys",
)
def test_a_delete_range_is_in_the_feed() -> None:
    store = open_store("memory://")
    settings = Settings(compactor="off", flush_interval=60)
    with Db.open(store, settings=settings) as db:
        db.put(b"a", b"1")
        db.put(b"b", b"2")
        db.delete_range(b"a", b"c")
    replica: dict[bytes, bytes] = {}
    for record in WalReader(store, settings=settings).iter("oldest"):
        if record.value is None:
            replica.pop(record.key, None)
        else:
            replica[record.key] = record.value
    assert replica == {}


@pytest.mark.xfail(
    strict=True,
    reason="known gap (RFC 0018 vs 0019): a TTL put's record carries the encoded entry "
    "(Expiring: 8 bytes of expiry, then the value) and a merge's the encoded operands, and "
    "WalRecord says neither",
)
def test_a_ttl_put_and_a_merge_read_as_what_was_written() -> None:
    store = open_store("memory://")
    settings = Settings(compactor="off", flush_interval=60)

    def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
        return b",".join(([] if existing is None else [existing]) + operands)

    with Db.open(store, settings=settings, merge_operator=concat) as db:
        db.put(b"t", b"v", ttl=100)
        db.merge(b"m", b"x")
    feed = WalReader(store, settings=settings).iter("oldest")
    assert [(r.key, bytes(r.value or b"")) for r in feed] == [(b"t", b"v"), (b"m", b"x")]
