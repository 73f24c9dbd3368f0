"""A get's cold block on ``file://``: one ``pread`` of a kept descriptor (``KeptReads``,
issue 33), still counted by the stack's metrics and the reader's stats, still typed errors
naming the object when the file changes under the descriptor, still a clone's SSTs read
from their source, and never past a layer that does more than count, retry or route."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.errors import CorruptionError, StoreUnavailable
from slatepy.format.block import Entry
from slatepy.format.sst import SstBuilder
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.store.base import WrappingStore
from slatepy.store.local_read import LocalReads
from slatepy.store.retry import RetryingStore
from slatepy.table.cache import LruCache
from slatepy.table.external import ExternalSsts
from slatepy.table.reader import TableReader

SST_ID = "0123456789abcdef0123456789abcdef"
PATH = f"compacted/{SST_ID}.sst"
ROWS: list[Entry] = [(b"key%06d" % i, i + 1, b"v%06d" % i * 8) for i in range(3000)]


def sst_bytes() -> bytes:
    builder = SstBuilder(writer_epoch=1, block_size=4096, format_version=5)
    return builder.add_all(ROWS).finish().data


def stack(bottom: ObjectStore) -> MetricsStore:
    """The stack a ``Db`` reads through (``open_stack``), two tries per request."""
    return MetricsStore(RetryingStore(bottom, 2))


@pytest.fixture
def slow_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of reads that went through ``LocalReads`` (the stack's path), not a
    kept descriptor's shortcut."""
    seen: list[str] = []
    get_range, get_ranges = LocalReads.get_range, LocalReads.get_ranges

    def counted_range(self: LocalReads, path: str, start: int, end: int) -> bytes:
        seen.append(path)
        return get_range(self, path, start, end)

    def counted_ranges(self: LocalReads, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        seen.append(path)
        return get_ranges(self, path, ranges)

    monkeypatch.setattr(LocalReads, "get_range", counted_range)
    monkeypatch.setattr(LocalReads, "get_ranges", counted_ranges)
    yield seen


def test_cold_blocks_are_one_pread_each_and_every_read_is_counted(
    tmp_path: Path, slow_reads: list[str]
) -> None:
    store = stack(open_store(f"file://{tmp_path}", create=True))
    store.put(PATH, sst_bytes())
    store.metrics.reset()
    reader = TableReader(store)
    wanted = ROWS[::97]  # a row from each of many blocks: every lookup a cold block
    assert reader.get(PATH, wanted[0][0]) == wanted[0][1:]  # opens: the tail read keeps it
    opened = len(slow_reads)
    for key, seq, value in wanted[1:]:
        assert reader.get(PATH, key) == (seq, value)
        assert reader.get(PATH, key + b"~") is None
    stats = reader.stats()
    assert stats.block_reads == len(wanted) and stats.block_misses >= len(wanted)
    assert len(slow_reads) == opened  # no block read went through the stack's layers
    counted = store.metrics.snapshot()["get_range"]
    assert counted.requests == stats.store_reads and counted.errors == 0
    assert counted.bytes_in == stats.bytes_read


def test_a_file_truncated_under_its_kept_descriptor_is_a_typed_error_naming_it(
    tmp_path: Path,
) -> None:
    """The shortcut serves only whole reads: a short one is read again through the stack,
    which says what happened (``StoreUnavailable`` naming the object, after its retries)."""
    store = stack(open_store(f"file://{tmp_path}", create=True))
    data = sst_bytes()
    store.put(PATH, data)
    reader = TableReader(store)
    assert reader.get(PATH, ROWS[0][0]) == ROWS[0][1:]
    os.truncate(tmp_path / PATH, len(data) // 2)
    store.metrics.reset()
    key = ROWS[len(ROWS) * 3 // 4][0]  # in a block past the new end
    with pytest.raises(StoreUnavailable) as failed:
        reader.get(PATH, key)
    assert failed.value.path == PATH and PATH in str(failed.value)
    assert store.metrics.snapshot()["get_range"].errors == 1  # counted, by the stack


def test_a_file_removed_under_its_kept_descriptor_still_reads_its_bytes(tmp_path: Path) -> None:
    """As before the shortcut: a reader holding a deleted SST's descriptor reads it."""
    store = stack(open_store(f"file://{tmp_path}", create=True))
    store.put(PATH, sst_bytes())
    reader = TableReader(store)
    assert reader.get(PATH, ROWS[0][0]) == ROWS[0][1:]
    os.unlink(tmp_path / PATH)
    for key, seq, value in ROWS[::301]:
        assert reader.get(PATH, key) == (seq, value)


def test_a_corrupt_block_read_by_the_shortcut_names_the_object_and_offset(tmp_path: Path) -> None:
    store = stack(open_store(f"file://{tmp_path}", create=True))
    data = bytearray(sst_bytes())
    store.put(PATH, bytes(data))
    reader = TableReader(store)
    assert reader.get(PATH, ROWS[0][0]) == ROWS[0][1:]  # block 0 cached, descriptor kept
    top = reader.top(PATH)
    part = reader.partition(PATH, top, top.partition_count - 1)
    offset = part.offsets[-2]  # the SST's last block
    with open(tmp_path / PATH, "r+b") as f:
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CorruptionError) as failed:
        reader.get(PATH, ROWS[-1][0])
    assert failed.value.path == PATH and failed.value.offset == offset
    assert f"at byte {offset}" in str(failed.value)


def test_a_clones_sst_is_read_through_its_sources_kept_descriptor(
    tmp_path: Path, slow_reads: list[str]
) -> None:
    source = open_store(f"file://{tmp_path / 'source'}", create=True)
    source.put(PATH, sst_bytes())
    own = open_store(f"file://{tmp_path / 'clone'}", create=True)
    store = stack(ExternalSsts(own, lambda: {SST_ID: source}))
    reader = TableReader(store)
    assert reader.get(PATH, ROWS[0][0]) == ROWS[0][1:]  # a miss in its own store, then there
    opened = len(slow_reads)
    for key, seq, value in ROWS[97::97]:
        assert reader.get(PATH, key) == (seq, value)
    assert len(slow_reads) == opened
    stats = reader.stats()
    counted = store.metrics.snapshot()["get_range"]
    assert counted.requests - counted.errors == stats.store_reads  # the own store's miss too
    assert counted.bytes_in == stats.bytes_read


class Watching(WrappingStore):
    """A layer that does more than count (a fault injector's place): sees every read."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.reads = 0

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self.reads += 1
        return self.inner.get_range(path, start, end)

    def get_suffix(self, path: str, length: int) -> bytes:
        self.reads += 1
        return self.inner.get_suffix(path, length)


def test_a_layer_that_does_more_than_count_keeps_seeing_every_read(tmp_path: Path) -> None:
    watching = Watching(open_store(f"file://{tmp_path}", create=True))
    store = stack(watching)
    store.put(PATH, sst_bytes())
    assert store.kept_reads(PATH) is None
    reader = TableReader(store)
    wanted = ROWS[::97]
    for key, seq, value in wanted:
        assert reader.get(PATH, key) == (seq, value)
    assert watching.reads == reader.stats().store_reads


def test_only_immutable_local_objects_have_a_shortcut(tmp_path: Path) -> None:
    local = stack(open_store(f"file://{tmp_path}", create=True, settings=Settings()))
    assert local.kept_reads(PATH) is not None
    assert local.kept_reads("wal/00000000000000000001.sst") is None
    assert stack(open_store("memory://")).kept_reads(PATH) is None
    kept = local.kept_reads(PATH)
    assert kept is not None and kept.read(PATH, 0, 10) is None  # nothing kept yet
    assert MetricsStore(local).kept_reads(PATH) is None  # counted twice: left to the stack


def test_put_if_room_inserts_or_replaces_only_without_evicting() -> None:
    cache: LruCache[str] = LruCache(100)
    assert cache.put_if_room("a", "A", 60)
    assert not cache.put_if_room("b", "B", 41) and cache.values() == ["A"]
    assert cache.put_if_room("b", "B", 40) and cache.size == 100
    assert not cache.put_if_room("a", "A2", 61)  # 60 of its own freed, still too large
    assert cache.values() == ["B", "A"] and cache.size == 100
    assert cache.put_if_room("a", "A3", 10) and cache.size == 50
    assert cache.get("a") == "A3" and cache.get("b") == "B"


def test_blocks_cached_by_gets_serve_every_scan_as_lists() -> None:
    """A get caches a version 5 block with its values as a tuple (the GC stops tracking
    it); scans that find it, forwards, backwards and in columns, get lists as before,
    tombstones included."""
    rows: list[Entry] = [
        (b"key%05d" % i, i + 1, None if i % 7 == 0 else b"value%05d" % i) for i in range(2000)
    ]
    builder = SstBuilder(writer_epoch=1, block_size=512, format_version=5)
    store = MetricsStore(open_store("memory://"))
    store.put(PATH, builder.add_all(rows).finish().data)
    reader = TableReader(store)
    for key, seq, value in rows[::3]:
        assert reader.get(PATH, key) == (seq, value)
    cached = reader._blocks.values()
    assert cached and all(type(b.values) is tuple for b in cached)  # type: ignore[union-attr]
    assert list(reader.scan(PATH, b"", None)) == rows
    backwards = [
        (k, s, v)
        for keys, seqs, values in reader.scan_columns(PATH, b"", None, reverse=True)
        for k, s, v in zip(keys, seqs, values, strict=True)
    ]
    assert backwards == rows[::-1]
    for keys, _, values in reader.scan_columns(PATH, b"key00100", b"key01500"):
        assert type(keys) is list and type(values) is list
    for key, seq, value in rows[1::3]:
        assert reader.get(PATH, key) == (seq, value)
        assert reader.get(PATH, key + b"~") is None


def test_a_databases_cold_gets_take_the_shortcut_and_its_metrics_count_them(
    tmp_path: Path, slow_reads: list[str]
) -> None:
    """End to end: ``Db.open`` on ``file://`` builds a stack whose layers all know the
    shortcut, and ``Db.metrics`` counts every read the reader makes, shortcut or not."""
    settings = Settings(compactor="off", block_size=4096)  # keys 97 apart: a block each
    with Db.open(f"file://{tmp_path}/db", settings=settings) as db:
        for i in range(0, 3000, 1000):
            batch = WriteBatch()
            for key, _, value in ROWS[i : i + 1000]:
                batch.put(key, value)
            db.write(batch)
    Compactor(open_store(f"file://{tmp_path}/db", settings), settings=settings).run_until_idle()
    with Db.open(f"file://{tmp_path}/db", settings=settings) as db:
        assert db.metrics is not None
        assert db.get(ROWS[0][0]) is not None  # opens the SST (its descriptor kept)
        before = db.metrics.snapshot()["get_range"]
        stats = db._tables.stats()
        slow_reads.clear()
        wanted = ROWS[97::97]
        assert [db.get(key) for key, _, _ in wanted] == [value for _, _, value in wanted]
        after = db.metrics.snapshot()["get_range"]
        read = db._tables.stats()
        assert read.block_reads - stats.block_reads == len(wanted)
        assert not [p for p in slow_reads if p.startswith("compacted/")]
        assert after.requests - before.requests == read.store_reads - stats.store_reads
        assert after.bytes_in - before.bytes_in == read.bytes_read - stats.bytes_read
