"""Change data capture from the WAL (``WalReader``, RFC 0018): committed writes in commit
order with their seqs, batches whole and contiguous, resuming from a seq, following a live
writer, the typed error when GC took the history, the async form and ``slatepy wal tail``."""

from __future__ import annotations

import asyncio
import threading
import time
from itertools import groupby
from pathlib import Path

import pytest

from slatepy import Db, Settings, WalHistoryGone, WalReader, WalRecord, WriteBatch, aio
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.errors import ClosedError, InvalidArgument, NotFound
from slatepy.gc.collector import GarbageCollector
from slatepy.store import ObjectStore, open_store
from tests.conftest import Backend

FAST = Settings(compactor="off", flush_interval=60, reader_poll_interval=0.02)

Write = list[tuple[bytes, bytes | None]]
"""One acknowledged write (a put, a delete or a batch) as its (key, value) pairs."""


def write_all(db: Db, writes: list[Write]) -> None:
    """Each write awaited, so each lands in a WAL SST of its own (nothing coalesces)."""
    for ops in writes:
        if len(ops) == 1 and ops[0][1] is None:
            db.delete(ops[0][0])
        elif len(ops) == 1:
            db.put(*ops[0])  # type: ignore[arg-type]
        else:
            batch = WriteBatch()
            for key, value in ops:
                batch.put(key, value) if value is not None else batch.delete(key)
            db.write(batch)


def workload(n: int, tag: bytes = b"") -> list[Write]:
    writes: list[Write] = []
    for i in range(n):
        if i % 5 == 4:
            writes.append([(b"b%03d-%d" % (i, j), tag + b"batch %d" % i) for j in range(3)])
        elif i % 7 == 6:
            writes.append([(b"k%03d" % (i - 1), None)])
        else:
            writes.append([(b"k%03d" % i, tag + b"value %d" % i)])
    return writes


def as_writes(records: list[WalRecord]) -> list[Write]:
    """Records grouped by seq (a batch's records share one), checking seqs strictly increase."""
    grouped = [list(group) for _, group in groupby(records, key=lambda r: r.seq)]
    seqs = [group[0].seq for group in grouped]
    assert seqs == sorted(set(seqs)), "seqs must strictly increase from write to write"
    return [[(r.key, r.value) for r in group] for group in grouped]


def database(writes: list[Write], settings: Settings = FAST) -> ObjectStore:
    store = open_store("memory://")
    with Db.open(store, settings=settings) as db:
        write_all(db, writes)
    return store


def compact_and_collect(store: ObjectStore) -> None:
    compactor = Compactor(store, settings=FAST, policy=CompactionPolicy(l0_trigger=100))
    while compactor.run_once() is not None:
        pass
    GarbageCollector(store, settings=FAST, min_age=0).collect()


def test_records_come_in_commit_order_with_batches_whole_and_contiguous() -> None:
    writes = workload(40)
    store = database(writes)
    with WalReader(store, settings=FAST) as reader:
        records = list(reader.iter())
        assert as_writes(records) == writes
        assert all(r.seq % 2 == 0 for r in records)  # writers' seqs (ingestion takes odd)
        ids = [r.wal_id for r in records]
        assert ids == sorted(ids)
        # One list per WAL SST; the fencing SSTs (empty) yield nothing.
        assert all(reader.iter_ssts())


def test_a_batch_is_in_key_order_and_one_sst_coalesces_to_its_last_write_per_key() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=FAST) as db:
        db.write(WriteBatch().put(b"z", b"1").put(b"a", b"1").put(b"m", b"1"), await_durable=False)
        db.put(b"a", b"2", await_durable=False)  # same WAL SST: supersedes the batch's a
        db.put(b"q", b"3", await_durable=False)
        db.flush()
    with WalReader(store, settings=FAST) as reader:
        (sst,) = list(reader.iter_ssts())
    expected = [(b"m", b"1"), (b"z", b"1"), (b"a", b"2"), (b"q", b"3")]
    assert [(r.key, r.value) for r in sst] == expected
    assert sst[0].seq == sst[1].seq < sst[2].seq < sst[3].seq


def test_from_seq_in_the_middle_and_resuming_after_the_last_record() -> None:
    writes = workload(30)
    store = database(writes)
    with WalReader(store, settings=FAST) as reader:
        records = list(reader.iter())
        middle = len(records) // 2
        seq = records[middle].seq
        start = next(i for i, r in enumerate(records) if r.seq == seq)  # a batch's first
        assert list(reader.iter(from_seq=seq)) == records[start:]
        after = next(i for i, r in enumerate(records) if r.seq > seq)
        assert list(reader.iter(from_seq=seq + 1)) == records[after:]
        assert list(reader.iter(from_seq=records[-1].seq + 1)) == []
        assert list(reader.iter(from_seq=0)) == records
        assert list(reader.iter("end")) == []
        with pytest.raises(InvalidArgument):
            list(reader.iter(from_seq=-1))
        with pytest.raises(InvalidArgument):
            list(reader.iter(follow=True, poll_interval=0))


def test_a_replica_from_a_copy_and_the_feed_after_last_seq_converges() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=FAST) as db:
        write_all(db, workload(12))
        with WalReader(store, settings=FAST) as feed:
            assert feed.last_seq() == list(feed.iter())[-1].seq
            start = feed.last_seq() + 1
            write_all(db, workload(6, tag=b"during the copy "))  # in the copy and the feed
            replica = dict(db.scan())
            write_all(db, workload(9, tag=b"after "))
            for record in feed.iter(start):
                if record.value is None:
                    replica.pop(record.key, None)
                else:
                    replica[record.key] = record.value
        assert replica == dict(db.scan())


def test_fencing_ssts_of_many_writers_are_skipped() -> None:
    store = open_store("memory://")
    writes: list[Write] = []
    for round_ in range(4):  # each open writes an empty fencing SST
        with Db.open(store, settings=FAST) as db:
            more = workload(6, tag=b"r%d " % round_)
            write_all(db, more)
            writes += more
    with WalReader(store, settings=FAST) as reader:
        assert as_writes(list(reader.iter())) == writes
        records = list(reader.iter())
        for record in records[::5]:  # the binary search steps over the empty SSTs
            first = next(r for r in records if r.seq == record.seq)
            assert next(reader.iter(from_seq=record.seq)) == first


def test_follow_sees_a_live_writers_writes_within_a_bounded_time() -> None:
    store = open_store("memory://")
    db = Db.open(store, settings=FAST)
    db.put(b"before", b"0")
    reader = WalReader(store, settings=FAST)
    (before,) = reader.iter()
    seen: list[WalRecord] = []
    arrived = threading.Condition()

    def consume() -> None:
        for record in reader.iter(before.seq + 1, follow=True):
            with arrived:
                seen.append(record)
                arrived.notify_all()

    thread = threading.Thread(target=consume)
    thread.start()
    try:
        for i in range(5):
            started = time.monotonic()
            db.put(b"key%d" % i, b"value%d" % i)
            with arrived:
                assert arrived.wait_for(lambda i=i: len(seen) == i + 1, timeout=5)
            assert time.monotonic() - started < 2
        batch = WriteBatch().put(b"x", b"1").put(b"y", b"2")
        db.write(batch)
        with arrived:
            assert arrived.wait_for(lambda: len(seen) == 7, timeout=5)
    finally:
        db.close()
        started = time.monotonic()
        reader.close()
        thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 1  # close ends the follower
    assert [r.key for r in seen] == [b"key0", b"key1", b"key2", b"key3", b"key4", b"x", b"y"]
    assert seen[-1].seq == seen[-2].seq


def test_history_collected_by_gc_is_a_typed_error_saying_where_to_resume() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=FAST) as db:
        write_all(db, workload(10))
    with WalReader(store, settings=FAST) as reader:
        old = list(reader.iter())
    compact_and_collect(store)
    with Db.open(store, settings=FAST) as db:
        write_all(db, workload(5, tag=b"new "))
    with WalReader(store, settings=FAST) as reader:
        kept = list(reader.iter())  # "oldest": whatever is left, no error
        # GC keeps the SST at wal_id_last_compacted (it carries the epoch), no older one.
        first_kept = kept[0].wal_id
        assert first_kept > 1 and kept[0] == next(r for r in old if r.wal_id == first_kept)
        last_gone = max(r.seq for r in old if r.wal_id < first_kept)
        for from_seq in (0, old[0].seq, last_gone):
            with pytest.raises(WalHistoryGone, match="garbage collected") as caught:
                list(reader.iter(from_seq=from_seq))
            gone = caught.value
            assert gone.first_wal_id == first_kept and gone.first_seq == kept[0].seq
            assert f"from_seq={kept[0].seq}" in str(gone)
        # A consumer that applied everything before the collection resumes after its last
        # record (the same seq + 1 it would pass anyway), and loses nothing.
        assert list(reader.iter(from_seq=last_gone + 1)) == kept
        assert list(reader.iter(from_seq=kept[0].seq)) == kept


def test_a_reader_overtaken_by_gc_gets_the_typed_error() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=FAST) as db:
        write_all(db, workload(10))
    with WalReader(store, settings=FAST) as reader:
        ssts = reader.iter_ssts()
        next(ssts)  # suspended after the first WAL SST; the rest is compacted and deleted
        compact_and_collect(store)
        with pytest.raises(WalHistoryGone, match="before this reader got to it"):
            list(ssts)


def test_no_database_is_not_found_and_a_closed_reader_refuses() -> None:
    with pytest.raises(NotFound):
        WalReader(open_store("memory://"))
    reader = WalReader(database(workload(2)), settings=FAST)
    reader.close()
    with pytest.raises(ClosedError):
        list(reader.iter())


def test_the_async_form_reads_and_follows() -> None:
    store = open_store("memory://")
    writes = workload(8)

    async def run() -> list[WalRecord]:
        db = await aio.Db.open(store, settings=FAST)
        try:
            await db.put(b"first", b"1")
            async with await aio.WalReader.open(store, settings=FAST) as feed:
                got = [r async for r in feed.iter()]
                assert [r.key for r in got] == [b"first"]
                followed: list[WalRecord] = []

                async def follow() -> None:
                    async for record in feed.iter(got[-1].seq + 1, follow=True):
                        followed.append(record)

                task = asyncio.create_task(follow())
                for ops in writes:
                    batch = WriteBatch()
                    for key, value in ops:
                        batch.put(key, value) if value is not None else batch.delete(key)
                    await db.write(batch)
                deadline = time.monotonic() + 5
                while len(as_writes(followed)) < len(writes) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await feed.close()
                await asyncio.wait_for(task, timeout=5)
                return followed
        finally:
            await db.close()

    assert as_writes(asyncio.run(run())) == writes


def test_cli_wal_tail_prints_one_line_per_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=FAST) as db:
        db.put(b"k\n1", b"\x00\xff")
        db.write(WriteBatch().put(b"a", b"x").delete(b"b"))
        db.delete(b"k\n1")
    assert main(["wal", "tail", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "seq=2\twal=2\tput\tkey=k\\n1\tvalue=\\x00\\xff",
        "seq=4\twal=3\tput\tkey=a\tvalue=x",
        "seq=4\twal=3\tdelete\tkey=b",
        "seq=6\twal=4\tdelete\tkey=k\\n1",
    ]
    assert main(["wal", "tail", url, "--from-seq", "5"]) == 0
    assert capsys.readouterr().out.splitlines() == lines[3:]
    with pytest.raises(SystemExit) as usage:
        main(["wal", "tail", url, "--from-seq", "soon"])
    assert usage.value.code == 2
    assert "--from-seq" in capsys.readouterr().err
    assert main(["wal", "tail", f"file://{tmp_path}/nothing"]) == 1


def test_the_feed_on_every_backend(backend: Backend) -> None:
    writes = workload(8)
    with Db.open(backend.target(), settings=backend.settings) as db:
        write_all(db, writes)
    with WalReader(backend.target(), settings=backend.settings) as feed:
        assert as_writes(list(feed.iter())) == writes
        assert feed.last_seq() == list(feed.iter())[-1].seq
