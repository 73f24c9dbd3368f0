"""Ingesting externally built SSTs (``slatepy.engine.ingest``; RFC 0016): newer than every
write acknowledged before the publish, older than every write after it; all or nothing;
orphans left to GC."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.ingest import (
    IngestAbandoned,
    global_seq_for,
    publish_ingest,
    write_ingest_columns,
    write_ingest_ssts,
)
from slatepy.errors import InvalidArgument
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path

OFF = Settings(compactor="off")


def pairs(first: int, n: int, value: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"k%05d" % i, value) for i in range(first, first + n)]


def test_the_global_seq_sits_between_even_writer_seqs() -> None:
    assert global_seq_for(0, 0) == 1
    assert global_seq_for(10, 0) == 11
    assert global_seq_for(11, 0) == 13  # an odd seq of an older slatepy: the next odd above
    assert global_seq_for(11, 11) == 11  # no write since the last ingestion: the same slot


def test_ingested_keys_are_newer_than_earlier_writes_and_older_than_later_ones(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        store = open_store(url)
        db.put(b"k00000", b"compacted")
        Compactor(store, settings=OFF).run_until_idle()
        for key, _ in pairs(0, 10, b""):
            db.put(key, b"before")  # in the writer's memtable and the WAL
        first = write_ingest_ssts(store, pairs(0, 100, b"load1"), OFF, target_sst_bytes=512)
        second = write_ingest_ssts(store, pairs(50, 100, b"load2"), OFF, target_sst_bytes=512)
        assert len(first) > 1
        one = publish_ingest(store, OFF, first)
        assert one.global_seq % 2 == 1
        assert publish_ingest(store, OFF, first) == one  # again: a no-op
        two = publish_ingest(store, OFF, second)  # no write between: the same slot
        assert two.global_seq == one.global_seq
        db.put(b"k00005", b"after")
        db.refresh()
        expected = {k: v for k, v in pairs(0, 100, b"load1")}
        expected.update(pairs(50, 100, b"load2"))
        expected[b"k00005"] = b"after"
        keys = sorted(expected)

        def check(reader: Db | DbReader) -> None:
            assert reader.get(b"k00001") == b"load1"
            assert reader.get(b"k00060") == b"load2"  # the later ingestion wins the tie
            assert reader.get_many(keys) == [expected[k] for k in keys]
            assert dict(reader.scan()) == expected

        check(db)
        with DbReader.open(url, settings=OFF) as reader:
            check(reader)
        # The WAL (older writes, "before") compacted into L0 *in front of* the ingested SSTs:
        # L0's order no longer follows seqs, the highest seq must still win.
        Compactor(store, settings=OFF, policy=CompactionPolicy(l0_trigger=100)).run_until_idle()
        db.refresh()
        stored = ManifestStore(store).load()
        assert stored is not None and not stored.manifest.l0[0].global_seq
        check(db)
        with DbReader.open(url, settings=OFF) as reader:
            check(reader)
        Compactor(store, settings=OFF).run_until_idle()
        db.refresh()
        stored = ManifestStore(store).load()
        assert stored is not None and not stored.manifest.l0_has_ingested()
        check(db)
    with Db.open(url, settings=OFF) as db:
        db.put(b"k00001", b"reopened")
        assert db.get(b"k00001") == b"reopened"


def test_unpublished_ssts_are_invisible_and_collected(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        store = open_store(url)
        orphans = write_ingest_ssts(store, pairs(0, 10, b"x"), OFF, target_sst_bytes=1 << 20)
        assert db.get(b"k00001") is None and list(db.scan()) == []
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    report = GarbageCollector(store, settings=OFF, clock=lambda: later).collect()
    assert {d.path for d in report.deletions} >= {f"compacted/{h.id}.sst" for h in orphans}
    with pytest.raises(IngestAbandoned, match="gone"):
        publish_ingest(store, OFF, orphans)


def test_ssts_older_than_half_the_gc_grace_are_not_published(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    Db.open(url, settings=OFF).close()
    store = open_store(url)
    handles = write_ingest_ssts(store, pairs(0, 10, b"x"), OFF, target_sst_bytes=1 << 20)
    impatient = Settings(compactor="off", gc_min_age=0.001)
    with pytest.raises(IngestAbandoned, match="gc_min_age"):
        publish_ingest(store, impatient, handles)
    stored = ManifestStore(store).load()
    assert stored is not None and stored.manifest.l0 == ()
    with pytest.raises(InvalidArgument, match="strictly increasing"):
        write_ingest_ssts(store, [(b"b", b""), (b"a", b"")], OFF, target_sst_bytes=1 << 20)


def test_ingesting_columns_writes_the_same_ssts_as_pairs(tmp_path: Path) -> None:
    """``write_ingest_columns`` (the bulk load's) against ``write_ingest_ssts``: the same
    objects byte for byte, cut at the same entries, whatever the chunking; bad keys refused
    with nothing left behind."""
    url = f"file://{tmp_path}/db"
    Db.open(url, settings=OFF).close()
    store = open_store(url)
    rows = [(b"k%06d" % i, b"v" * (i % 300)) for i in range(6000)]
    settings = Settings(compactor="off", block_size=512)
    expected = write_ingest_ssts(store, rows, settings, target_sst_bytes=64 * 1024)
    assert len(expected) > 5

    def contents(handles: list[SstHandle]) -> list[bytes]:
        return [store.get(compacted_path(h.id)) for h in handles]

    for chunk in (1, 7, 1000, 6000):
        chunks = [
            ([k for k, _ in rows[i : i + chunk]], [v for _, v in rows[i : i + chunk]])
            for i in range(0, len(rows), chunk)
        ]
        got = write_ingest_columns(store, chunks, settings, target_sst_bytes=64 * 1024)
        assert [(h.first_key, h.last_key, h.entry_count) for h in got] == [
            (h.first_key, h.last_key, h.entry_count) for h in expected
        ]
        assert contents(got) == contents(expected)
    before = {m.path for m in store.list("compacted/")}
    for bad in ([b"b", b"a"], [b"a", b""], [b"a", b"a"]):
        with pytest.raises(InvalidArgument, match="ingested keys must be non-empty"):
            write_ingest_columns(store, [(bad, [b"x"] * 2)], settings, target_sst_bytes=1 << 20)
    assert {m.path for m in store.list("compacted/")} == before  # the aborted output left nothing
    # A key out of order right at a cut: each SST's own keys are in order, together not.
    cut = expected[0].entry_count
    unordered = [k for k, _ in rows]
    unordered[cut] = b"a"
    with pytest.raises(InvalidArgument, match="strictly increasing"):
        write_ingest_columns(
            store, [(unordered, [v for _, v in rows])], settings, target_sst_bytes=64 * 1024
        )
