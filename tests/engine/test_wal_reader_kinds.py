"""Change feed (``WalReader``, RFC 0018) cases the torture workload's state machine found:
settings it must accept, and how the feed shows the entry kinds of RFC 0019 (TTL puts,
merges, range deletes): each record says its kind, and a feed replayed record by record into
another database reproduces the source, whatever mix of kinds and batches it holds."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings, WalReader, WalRecord, WriteBatch
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.snapshot import Snapshot
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


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join(([] if existing is None else [existing]) + operands)


SETTINGS = Settings(compactor="off", flush_interval=60)
T0 = 1_700_000_000.0
"""A test clock's start (seconds): TTLs are judged on it, so they are deterministic."""


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def ms(self) -> int:
        return int(self.now * 1000)


def apply_feed(records: list[WalRecord], replica: Db, clock: Clock) -> None:
    """The consumer of the tests: each record applied through the public API on its own."""
    for record in records:
        replica.write(record.add_to(WriteBatch(), now_ms=clock.ms()))


def test_a_delete_range_is_in_the_feed() -> None:
    """Range tombstones live in a WAL SST's properties, not its entries: the feed never
    showed a ``delete_range``, and a replica kept the keys (a strict xfail before)."""
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS) as db:
        db.put(b"a", b"1")
        db.put(b"b", b"2")
        db.delete_range(b"a", b"c")
    records = list(WalReader(store, settings=SETTINGS).iter("oldest"))
    assert [(r.kind, r.key, r.end) for r in records] == [
        ("put", b"a", None),
        ("put", b"b", None),
        ("delete_range", b"a", b"c"),
    ]
    assert records[2].value is None and records[2].seq > records[1].seq
    replica: dict[bytes, bytes] = {}
    for record in records:
        if record.kind == "delete_range":
            assert record.end is not None
            for key in [k for k in replica if record.key <= k < record.end]:
                del replica[key]
        elif record.value is None:
            replica.pop(record.key, None)
        else:
            replica[record.key] = record.value
    assert replica == {}


def test_a_ttl_put_and_a_merge_read_as_what_was_written() -> None:
    """A TTL put's record carried the encoded ``Expiring`` (8 bytes of expiry, then the
    value) and a merge's the encoded ``Operands``, and ``WalRecord`` said neither (a strict
    xfail before)."""
    store = open_store("memory://")
    clock = Clock()
    with Db.open(store, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.put(b"t", b"v", ttl=100)
        db.merge(b"m", b"x")
    feed = list(WalReader(store, settings=SETTINGS).iter("oldest"))
    assert [(r.key, bytes(r.value or b"")) for r in feed] == [(b"t", b"v"), (b"m", b"x")]
    ttl_put, merge = feed
    assert (ttl_put.kind, ttl_put.expire_at_ms, ttl_put.operands) == (
        "put",
        clock.ms() + 100_000,
        (),
    )
    assert type(ttl_put.value) is bytes and type(merge.value) is bytes
    assert (merge.kind, merge.operands, merge.expire_at_ms) == ("merge", (b"x",), None)


def test_plain_puts_and_deletes_look_as_before() -> None:
    """Existing consumers read ``(seq, key, value, wal_id)`` with ``value`` None a delete;
    a record built from those four fields is still a put or a delete."""
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS) as db:
        db.put(b"k", b"v")
        db.delete(b"k")
    put, delete = WalReader(store, settings=SETTINGS).iter("oldest")
    assert put == WalRecord(put.seq, b"k", b"v", put.wal_id)
    assert delete == WalRecord(delete.seq, b"k", None, delete.wal_id)
    assert (put.kind, delete.kind) == ("put", "delete")
    assert put.expire_at_ms is None and put.operands == () and put.end is None
    assert type(put.value) is bytes


def test_merges_sharing_a_wal_sst_come_as_one_record_of_their_operands() -> None:
    """The WAL keeps one entry per key in an SST: merges stack into one record (operands in
    order), and merges over a put of the same SST fold into a put (keeping its expiry)."""
    store = open_store("memory://")
    clock = Clock()
    with Db.open(store, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.merge(b"m", b"1", await_durable=False)
        db.merge(b"m", b"2", await_durable=False)
        db.put(b"p", b"base", await_durable=False)
        db.merge(b"p", b"3", await_durable=False)
        db.put(b"t", b"base", ttl=5, await_durable=False)
        db.merge(b"t", b"4", await_durable=False)
        db.delete(b"d", await_durable=False)
        db.merge(b"d", b"5")
    records = {r.key: r for r in WalReader(store, settings=SETTINGS).iter("oldest")}
    assert len({r.wal_id for r in records.values()}) == 1
    assert (records[b"m"].kind, records[b"m"].operands, records[b"m"].value) == (
        "merge",
        (b"1", b"2"),
        b"2",
    )
    assert (records[b"p"].kind, records[b"p"].value) == ("put", b"base,3")
    assert (records[b"t"].value, records[b"t"].expire_at_ms) == (b"base,4", clock.ms() + 5000)
    assert (records[b"d"].kind, records[b"d"].value) == ("put", b"5")


def _replica_from(snapshot: Snapshot, store: ObjectStore, clock: Clock) -> Db:
    """The documented way to start a replica: copy a snapshot, then apply the feed from the
    snapshot's seq + 1."""
    replica = Db.open("memory://", settings=SETTINGS, merge_operator=concat, clock=clock)
    batch = WriteBatch()
    for key, value in snapshot.scan():
        batch.put(key, value)
    replica.write(batch)
    apply_feed(list(WalReader(store, settings=SETTINGS).iter(snapshot.seq + 1)), replica, clock)
    return replica


def test_a_replica_from_a_writer_s_snapshot_applies_each_merge_once() -> None:
    """A writer's snapshot seals the WAL writes buffered so far into their own SST, so its
    seq ends an SST. Before, the merge of "b" shared a WAL SST with the merge of "c" after
    the snapshot: the feed from seq + 1 gave both as one record, and the replica, whose copy
    held "b" already, read "a,b,b,c"."""
    store, clock = open_store("memory://"), Clock()
    with Db.open(store, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.merge(b"m", b"a")  # its own WAL SST (awaited)
        db.merge(b"m", b"b", await_durable=False)  # buffered when the snapshot is taken
        db.put(b"k", b"1", await_durable=False)
        with db.snapshot() as snapshot:
            db.merge(b"m", b"c", await_durable=False)
            db.put(b"k", b"2")
            with _replica_from(snapshot, store, clock) as replica:
                assert dict(replica.scan()) == dict(db.scan()) == {b"m": b"a,b,c", b"k": b"2"}
        written = db._wal.ssts_written
        db.snapshot().close()  # nothing buffered: the boundary is there, no SST to write
        assert db._wal.ssts_written == written


def test_a_replica_from_a_reader_s_snapshot_applies_each_merge_once() -> None:
    """A reader applies whole WAL SSTs, so its snapshot's seq ends one already (this held
    before the writer's snapshots sealed too: it pins the documented way for readers)."""
    store, clock = open_store("memory://"), Clock()
    with Db.open(store, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.merge(b"m", b"a")
        with DbReader.open(store, settings=SETTINGS, merge_operator=concat) as reader:
            db.merge(b"m", b"b", await_durable=False)
            db.merge(b"m", b"c")  # one WAL SST with "b", after the reader's view
            with reader.snapshot() as snapshot:
                assert snapshot.get(b"m") == b"a"
                with _replica_from(snapshot, store, clock) as replica:
                    assert replica.get(b"m") == db.get(b"m") == b"a,b,c"


def test_a_batch_s_range_deletes_come_before_its_point_writes() -> None:
    """Within a WAL SST the records go by seq, a seq's range deletes before its puts: a
    put of an earlier seq in the range is deleted by it, the batch's own puts are not."""
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS) as db:
        db.put(b"x", b"old", await_durable=False)
        db.write(
            WriteBatch().put(b"b", b"in").delete_range(b"a", b"y").put(b"c", b"new"),
            await_durable=False,
        )
        db.put(b"a", b"after")
        state = list(db.scan())
    records = list(WalReader(store, settings=SETTINGS).iter("oldest"))
    assert [(r.kind, r.key) for r in records] == [
        ("put", b"x"),
        ("delete_range", b"a"),
        ("put", b"c"),
        ("put", b"a"),
    ]
    assert records[1].seq == records[2].seq and len({r.wal_id for r in records}) == 1
    assert state == [(b"a", b"after"), (b"c", b"new")]
    with Db.open(open_store("memory://"), settings=SETTINGS) as replica:
        apply_feed(records, replica, Clock())
        assert list(replica.scan()) == state


def test_an_sst_of_range_deletes_alone_counts_for_last_seq_and_starts() -> None:
    """A WAL SST holding only range tombstones has no entries (``entry_count`` 0): the
    feed's position lookups took it for a writer's empty fence, so ``last_seq()`` answered
    the write before the ``delete_range``, and a replica started from it applied the delete
    again."""
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS) as db:
        db.put(b"a", b"1")
        db.delete_range(b"a", b"b")
        feed = WalReader(store, settings=SETTINGS)
        records = list(feed.iter("oldest"))
        assert records[-1].kind == "delete_range"
        assert feed.last_seq() == records[-1].seq
        assert list(feed.iter(records[-1].seq)) == records[-1:]
        assert list(feed.iter(feed.last_seq() + 1)) == []


def test_add_to_reproduces_the_expiry_to_the_millisecond() -> None:
    """``Db.put`` takes a relative ttl and expires at ``now + ceil(ttl * 1000)`` ms: the
    exact ``(expire - now) / 1000`` lands a millisecond late for some spans (2007 ms is
    one); ``add_to`` must not. One already expired is added as a delete."""
    assert any(math.ceil(d / 1000 * 1000) != d for d in (2007, 2011))  # the trap exists
    clock = Clock()
    spans = [1, 2, 999, 2007, 2011, 4093, 86_400_000, 10**9 + 7]
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS, clock=clock) as replica:
        for i, span in enumerate(spans):
            record = WalRecord(2, b"k%d" % i, b"v", 1, expire_at_ms=clock.ms() + span)
            replica.write(record.add_to(WriteBatch(), now_ms=clock.ms()))
        replica.put(b"gone", b"old")
        expired = WalRecord(4, b"gone", b"v", 1, expire_at_ms=clock.ms())
        replica.write(expired.add_to(WriteBatch(), now_ms=clock.ms()))
        assert replica.get(b"gone") is None
    written = list(WalReader(store, settings=SETTINGS).iter("oldest"))
    assert [r.expire_at_ms for r in written[: len(spans)]] == [clock.ms() + s for s in spans]
    assert written[-1].kind == "delete"


def test_a_replica_that_lags_applies_an_expired_put_as_a_delete() -> None:
    """A TTL put replayed after its expiry reads as absent on the source (whatever was
    under it): the replica gets a delete, not a put with a ttl of zero or less (which
    ``WriteBatch.put`` refuses)."""
    clock = Clock()
    source_store = open_store("memory://")
    with Db.open(source_store, settings=SETTINGS, clock=clock) as source:
        source.put(b"k", b"old")
        source.put(b"k", b"new", ttl=1)
        source.put(b"live", b"v", ttl=5)
        clock.now += 2
        state = list(source.scan())
    assert state == [(b"live", b"v")]
    with Db.open(open_store("memory://"), settings=SETTINGS, clock=clock) as replica:
        apply_feed(list(WalReader(source_store, settings=SETTINGS).iter()), replica, clock)
        assert list(replica.scan()) == state
        clock.now += 3
        assert list(replica.scan()) == []


def test_wal_tail_shows_each_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/db"
    clock = Clock()
    with Db.open(url, settings=SETTINGS, merge_operator=concat, clock=clock) as db:
        db.put(b"t", b"v", ttl=1.5)
        db.merge(b"m", b"x", await_durable=False)
        db.merge(b"m", b"y")
        db.write(WriteBatch().delete_range(b"a", b"c").put(b"b", b"1").delete(b"z"))
    assert main(["wal", "tail", url]) == 0
    expire = clock.ms() + 1500
    assert capsys.readouterr().out.splitlines() == [
        f"seq=2\twal=2\tput\tkey=t\tvalue=v\texpire_at_ms={expire}",
        "seq=6\twal=3\tmerge\tkey=m\toperand=x\toperand=y",
        "seq=8\twal=4\tdelete_range\tstart=a\tend=c",
        "seq=8\twal=4\tput\tkey=b\tvalue=1",
        "seq=8\twal=4\tdelete\tkey=z",
    ]


KEYS = [b"k%02d" % i for i in range(10)]
BOUNDS = sorted([b"", *KEYS, b"k04x", b"z"])
"""Range delete bounds: keys, between keys, before the first key (b"") and after the last."""
TTLS = (0.3, 1, 2.5)


def random_batch(rng: random.Random, counter: int) -> WriteBatch:
    """A batch of 1-6 writes of every kind (one: a single write), on overlapping keys."""
    batch = WriteBatch()
    for i in range(rng.choice([1, 1, 1, rng.randint(2, 6)])):
        key, value = rng.choice(KEYS), b"v%d.%d" % (counter, i)
        kind = rng.choice(["put", "put", "ttl", "delete", "merge", "merge", "range"])
        if kind == "put":
            batch.put(key, value)
        elif kind == "ttl":
            batch.put(key, value, ttl=rng.choice(TTLS))
        elif kind == "delete":
            batch.delete(key)
        elif kind == "merge":
            batch.merge(key, value)
        else:
            lo = rng.randrange(len(BOUNDS) - 1)
            batch.delete_range(BOUNDS[lo], BOUNDS[min(lo + rng.randint(1, 3), len(BOUNDS) - 1)])
    return batch


@pytest.mark.parametrize("per_sst", [False, True], ids=["per-record", "per-sst"])
@pytest.mark.parametrize("seed", range(4))
def test_a_replica_fed_by_the_feed_reads_as_the_source(seed: int, per_sst: bool) -> None:
    """A random workload of puts, TTL puts, deletes, merges, range deletes and batches
    mixing them, most not awaited (so WAL SSTs hold many writes, coalesced per key), is
    replicated round by round through the feed into a second database, record by record
    (or one batch per WAL SST), through ``WalRecord.add_to`` and ``Db.write``; after each
    round, and as the shared clock moves on (TTLs run out), both scan the same."""
    rng = random.Random(seed)
    clock = Clock()
    source_store = open_store("memory://")
    source = Db.open(source_store, settings=SETTINGS, merge_operator=concat, clock=clock)
    replica = Db.open(
        open_store("memory://"), settings=SETTINGS, merge_operator=concat, clock=clock
    )
    feed = WalReader(source_store, settings=SETTINGS)
    kinds: set[str] = set()
    next_seq = 0
    counter = 0
    try:
        for _ in range(12):
            for _ in range(rng.randint(5, 30)):
                counter += 1
                source.write(random_batch(rng, counter), await_durable=rng.random() < 0.25)
            source.flush()
            for records in feed.iter_ssts(next_seq):
                kinds.update(r.kind for r in records)
                if per_sst:
                    batch = WriteBatch()
                    for record in records:
                        record.add_to(batch, now_ms=clock.ms())
                    replica.write(batch)
                else:
                    apply_feed(records, replica, clock)
                next_seq = records[-1].seq + 1
            assert list(replica.scan()) == list(source.scan())
            clock.now += rng.choice([0.0, 0.2, 0.7, 1.5])
            assert list(replica.scan()) == list(source.scan())
        assert kinds == {"put", "delete", "merge", "delete_range"}
        clock.now += 10  # every TTL ran out
        assert list(replica.scan()) == list(source.scan())
    finally:
        source.close()
        replica.close()
