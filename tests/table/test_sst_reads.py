"""Reading SSTs through TableReader (RFC 0009): bounded metadata work per get whatever the
SST's size, footers read without suffix requests, coalesced read-ahead scans in a background
thread that never outlives its iterator, old (version 1) SSTs, and corrupt bytes."""

from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Iterator
from functools import cache

import pytest

from slatepy.errors import CorruptionError
from slatepy.format import columnar
from slatepy.format.block import Block, Entry
from slatepy.format.columnar import RawColumnarBlock
from slatepy.format.sst import SstBuilder
from slatepy.store import MetricsStore, open_store
from slatepy.store.base import ObjectStore, WrappingStore
from slatepy.table.point_reads import PROMOTE_COLUMNAR_AFTER_HITS
from slatepy.table.reader import TableReader
from slatepy.table.sst_tops import READ_AHEAD_DEPTH
from tests.conftest import Backend
from tests.format.v1sst import build_v1

PATH = "compacted/t.sst"


def entries(n: int, value_size: int = 40) -> list[Entry]:
    return [(b"key%08d" % i, i + 1, b"v" * value_size) for i in range(n)]


@cache
def sst(n: int, block_size: int = 512, value_size: int = 40, version: int = 5) -> bytes:
    builder = SstBuilder(writer_epoch=1, block_size=block_size, format_version=version)
    return builder.add_all(entries(n, value_size)).finish().data


def store_with(data: bytes, path: str = PATH) -> MetricsStore:
    store = MetricsStore(open_store("memory://"))
    store.put(path, data)
    store.metrics.reset()
    return store


class NoSuffix(WrappingStore):
    """A store without suffix reads (Azure Blob): ``get_suffix`` must never be called."""

    def get_suffix(self, path: str, length: int) -> bytes:
        raise AssertionError(f"suffix request for {path}")


def read_ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("slatepy-read-ahead")]


# -- point gets: O(1) index and filter work, whatever the SST's size ------------------------


@pytest.mark.parametrize("n", [20_000, 200_000])
def test_a_cold_get_decodes_one_partition_and_makes_two_requests_at_most(n: int) -> None:
    data = sst(n)
    store = store_with(data)
    reader = TableReader(store, meta_cache_bytes=1 << 20, block_cache_bytes=1 << 20)
    top = reader.top(PATH, size=len(data))
    assert store.metrics.requests("get_range") == 1  # footer, top level, props: one GET
    assert top.partition_count > 20 * (n // 20_000)
    # The pinned top level is a small fraction of the SST, and the whole point: per get, one
    # partition (a few hundred block handles and their filter), never the SST's index.
    assert reader.stats().pinned_bytes < len(data) // 40
    rng = random.Random(n)
    keys = [b"key%08d" % rng.randrange(n) for _ in range(300)]
    keys += [b"key%08dx" % rng.randrange(n) for _ in range(100)]  # absent, inside the range
    worst_decodes = worst_requests = worst_bytes = 0
    for key in keys:
        before, requests = reader.stats(), store.metrics.requests("get_range")
        found = reader.get(PATH, key)
        assert (found is not None) == (not key.endswith(b"x"))
        after = reader.stats()
        worst_decodes = max(worst_decodes, after.partitions_decoded - before.partitions_decoded)
        worst_requests = max(worst_requests, store.metrics.requests("get_range") - requests)
        worst_bytes = max(worst_bytes, after.bytes_read - before.bytes_read)
        # Warm: the same key again decodes nothing and reads nothing.
        requests = store.metrics.requests("get_range")
        assert reader.get(PATH, key) == found
        assert reader.stats().partitions_decoded == after.partitions_decoded
        assert store.metrics.requests("get_range") == requests
    assert worst_decodes == 1
    assert worst_requests == 2  # the partition, then the block
    assert worst_bytes < 8 * 512  # one partition and one block, not an SST-wide index
    assert reader.stats().partitions_decoded > 50  # the meta cache is smaller than the SST's


def test_get_bounds_do_not_grow_with_the_sst() -> None:
    """The same bound (requests, partition decodes, bytes) for two SSTs 10x apart."""
    results = []
    for n in (20_000, 200_000):
        data = sst(n)
        store = store_with(data)
        reader = TableReader(store, meta_cache_bytes=64 * 1024, block_cache_bytes=64 * 1024)
        reader.top(PATH, size=len(data))
        store.metrics.reset()
        rng = random.Random(7)
        start = reader.stats()
        for _ in range(200):
            reader.get(PATH, b"key%08d" % rng.randrange(n))
        stats = reader.stats()
        results.append(
            (
                stats.partitions_decoded - start.partitions_decoded,
                store.metrics.requests("get_range"),
                (stats.bytes_read - start.bytes_read) // 200,
            )
        )
    (small_decodes, small_requests, small_bytes), (large_decodes, large_requests, large_bytes) = (
        results
    )
    assert small_decodes <= 200 and large_decodes <= 200
    assert small_requests <= 400 and large_requests <= 400
    assert large_bytes < 2 * small_bytes + 512


def test_a_small_sst_is_served_from_the_bytes_read_to_open_it() -> None:
    """Partitions that come with the tail cost no request: one GET to open, one per block."""
    data = sst(2000)
    store = store_with(data)
    reader = TableReader(store)
    assert reader.get(PATH, b"key%08d" % 1234, size=len(data)) == (1235, b"v" * 40)
    assert store.metrics.requests("get_range") == 2


# -- footers without suffix requests (Azure) -----------------------------------------------


def test_with_the_size_known_no_suffix_request_is_made() -> None:
    data = sst(20_000)
    inner = store_with(data)
    store = NoSuffix(inner)
    reader = TableReader(store, meta_prefetch=4096)  # smaller than the top level: 2 GETs
    assert reader.get(PATH, b"key%08d" % 5, size=len(data)) == (6, b"v" * 40)
    scan = TableReader(store)
    got = list(scan.scan(PATH, b"key00000010", b"key00000020", size=len(data)))
    assert [k for k, _, _ in got] == [b"key%08d" % i for i in range(10, 20)]
    assert list(TableReader(store).scan_all(PATH, chunk_bytes=1 << 20, size=len(data))) == (
        entries(20_000)
    )
    with pytest.raises(AssertionError, match="suffix"):
        TableReader(store).get(PATH, b"key00000005")  # size unknown: the suffix fallback


def test_without_the_size_one_suffix_request_opens_the_sst() -> None:
    data = sst(20_000)
    store = store_with(data)
    reader = TableReader(store)
    reader.top(PATH)
    assert store.metrics.requests("get_range") == 1
    assert reader.stats().tail_reads == 1


def test_a_size_that_disagrees_with_the_footer_is_corruption_naming_the_object() -> None:
    data = sst(2000)
    store = store_with(data)
    for size in (len(data) - 1, len(data) + 10, 20):
        with pytest.raises(CorruptionError) as caught:
            TableReader(store).top(PATH, size=size)
        assert caught.value.path == PATH and PATH in str(caught.value)


# -- scans: few large requests, read ahead in a thread that does not outlive the scan ------


def test_a_full_scan_is_a_few_large_requests() -> None:
    data = sst(40_000, block_size=4096, value_size=100)  # ~5 MB
    store = store_with(data)
    read_ahead = 1 << 20
    reader = TableReader(store, scan_read_ahead_bytes=read_ahead)
    assert list(reader.scan(PATH, b"", None, size=len(data))) == entries(40_000, 100)
    requests = store.metrics.requests("get_range")
    # 64 KiB, 128 KiB, ... up to 1 MiB per GET, plus the tail and one run of partitions.
    assert requests <= len(data) // read_ahead + 5 + 2, requests
    assert reader.stats().read_ahead_threads == 1
    assert read_ahead_threads() == []
    tail = entries(40_000, 100)[39990:]
    store.metrics.reset()
    assert list(reader.scan(PATH, b"key00039990", None)) == tail
    assert store.metrics.requests("get_range") == 1  # the full scan did not fill the cache
    store.metrics.reset()
    assert list(reader.scan(PATH, b"key00039990", None)) == tail
    assert store.metrics.requests("get_range") == 0  # the short scan did


def test_a_long_scan_does_not_evict_the_blocks_gets_keep_hot() -> None:
    rows = entries(40_000, 100)
    data = sst(40_000, block_size=4096, value_size=100)  # ~5 MB, five times the block cache
    store = store_with(data)
    # The hot blocks are cached decoded (2.3 times their bytes): about half the cache.
    reader = TableReader(store, block_cache_bytes=1024 * 1024)
    hot = random.Random(3).sample(rows, 50)
    for key, seq, value in hot:
        assert reader.get(PATH, key, size=len(data)) == (seq, value)
    assert list(reader.scan(PATH, b"", None)) == rows
    store.metrics.reset()
    for key, seq, value in hot:
        assert reader.get(PATH, key) == (seq, value)
    assert store.metrics.requests("get_range") == 0


def test_scans_honour_their_bounds_across_partitions() -> None:
    rows = entries(5000)
    data = sst(5000, block_size=128)
    store = store_with(data)
    warm = TableReader(store)
    rng = random.Random(3)
    for _ in range(60):
        a, b = sorted(rng.randrange(-5, 5005) for _ in range(2))
        start = b"" if a < 0 else b"key%08d" % a + (b"" if a % 2 else b"!")
        end = None if b >= 5000 else b"key%08d" % b
        expected = [r for r in rows if r[0] >= start and (end is None or r[0] < end)]
        assert list(TableReader(store).scan(PATH, start, end)) == expected
        assert list(warm.scan(PATH, start, end, size=len(data))) == expected


class Slow(WrappingStore):
    """Range reads take ``delay`` seconds and are logged."""

    def __init__(self, inner: ObjectStore, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay
        self.ranges: list[tuple[int, int]] = []

    def get_range(self, path: str, start: int, end: int) -> bytes:
        time.sleep(self.delay)
        self.ranges.append((start, end))
        return super().get_range(path, start, end)


def test_read_ahead_loads_the_next_chunks_in_the_background_and_no_further() -> None:
    data = sst(40_000, block_size=4096, value_size=100)
    store = Slow(store_with(data), 0.01)
    reader = TableReader(store, scan_read_ahead_bytes=256 * 1024)
    reader.top(PATH, size=len(data))
    opened = len(store.ranges)
    it = reader.scan(PATH, b"", None)
    next(it)  # chunk 0 read synchronously; chunks 1 and 2 now load in the background
    expected = opened + 2 + READ_AHEAD_DEPTH  # partitions run, chunk 0, chunks 1..DEPTH
    deadline = time.monotonic() + 5
    while len(store.ranges) < expected and time.monotonic() < deadline:
        time.sleep(0.01)  # the consumer does not ask for more
    assert len(store.ranges) == expected
    assert sorted(read_ahead_threads()) == [
        f"slatepy-read-ahead_{i}" for i in range(READ_AHEAD_DEPTH)
    ]
    chunks = store.ranges[opened + 1 :]
    assert all(a[1] == b[0] for a, b in zip(sorted(chunks), sorted(chunks)[1:], strict=False))
    time.sleep(0.2)
    assert len(store.ranges) == expected  # bounded: nothing beyond READ_AHEAD_DEPTH chunks
    it.close()
    assert read_ahead_threads() == []


def test_the_read_ahead_thread_ends_with_its_iterator() -> None:
    data = sst(40_000, block_size=4096, value_size=100)
    store = store_with(data)
    before = set(threading.enumerate())

    def partly(reader: TableReader) -> Iterator[Entry]:
        it = reader.scan(PATH, b"", None)
        for _ in range(3000):  # past the first 64 KiB chunk
            next(it)
        return it

    reader = TableReader(store, scan_read_ahead_bytes=256 * 1024)
    it = partly(reader)
    assert read_ahead_threads()
    it.close()  # closed early
    assert read_ahead_threads() == []
    it = partly(TableReader(store))
    del it  # dropped without close: collected
    gc.collect()
    assert read_ahead_threads() == []
    for _ in range(20):
        assert len(list(TableReader(store).scan(PATH, b"", None))) == 40_000  # exhausted
    # No thread this test started is left (a count would also see other tests' threads end).
    assert set(threading.enumerate()) - before == set()
    assert read_ahead_threads() == []


def test_a_warm_or_short_scan_starts_no_thread() -> None:
    data = sst(40_000, block_size=4096, value_size=100)
    store = store_with(data)
    reader = TableReader(store)
    assert len(list(reader.scan(PATH, b"key00001000", b"key00001100"))) == 100
    assert reader.stats().read_ahead_threads == 0
    rows = entries(40_000, 100)[1000:4000]  # ~400 KB: several chunks
    for key, seq, value in rows:  # gets cache every block of the range
        assert reader.get(PATH, key) == (seq, value)
    assert list(reader.scan(PATH, rows[0][0], rows[-1][0] + b"~")) == rows
    assert reader.stats().read_ahead_threads == 0
    list(reader.scan(PATH, b"", None))
    assert reader.stats().read_ahead_threads == 1


def test_errors_in_the_read_ahead_thread_reach_the_consumer() -> None:
    data = bytearray(sst(40_000, block_size=4096, value_size=100))
    data[2_000_000] ^= 0xFF  # a block far enough to be read ahead
    store = store_with(bytes(data))
    with pytest.raises(CorruptionError) as caught:
        list(TableReader(store).scan(PATH, b"", None))
    assert caught.value.path == PATH
    assert read_ahead_threads() == []


def test_scan_all_bypasses_the_caches_and_reads_small_ssts_in_one_request() -> None:
    data = sst(300)
    store = store_with(data)
    reader = TableReader(store)
    assert list(reader.scan_all(PATH, chunk_bytes=64 * 1024)) == entries(300)
    assert store.metrics.requests("get_range") == 1  # the tail held the whole object
    stats = reader.stats()
    assert stats.block_cache_bytes == stats.meta_cache_bytes == stats.pinned_ssts == 0
    big = sst(40_000, block_size=4096, value_size=100)
    store = store_with(big)
    reader = TableReader(store)
    assert list(reader.scan_all(PATH, chunk_bytes=1 << 20)) == entries(40_000, 100)
    assert store.metrics.requests("get_range") <= len(big) // (1 << 20) + 3
    assert reader.stats().block_cache_bytes == 0


# -- version 1 SSTs (databases written before RFC 0009) ------------------------------------


def test_v1_ssts_still_read() -> None:
    rows = [(k, s, None if s % 13 == 0 else v) for k, s, v in entries(20_000)]
    data = build_v1(rows, writer_epoch=2, block_size=512)
    store = store_with(data)
    reader = TableReader(store, meta_cache_bytes=1 << 20)
    assert reader.top(PATH, size=len(data)).version == 1
    for key, seq, value in random.Random(1).sample(rows, 200):
        assert reader.get(PATH, key) == (seq, value)
    assert reader.get(PATH, b"key00000005x") is None
    assert list(reader.scan(PATH, b"key00001000", b"key00001500")) == rows[1000:1500]
    assert list(TableReader(store).scan(PATH, b"", None, size=len(data))) == rows
    assert list(TableReader(store).scan_all(PATH, chunk_bytes=1 << 16)) == rows


def test_v2_ssts_still_read() -> None:
    rows = [(k, s, None if s % 13 == 0 else v) for k, s, v in entries(20_000)]
    data = SstBuilder(writer_epoch=2, block_size=512, format_version=2).add_all(rows).finish().data
    store = store_with(data)
    reader = TableReader(store, meta_cache_bytes=1 << 20)
    assert reader.top(PATH, size=len(data)).version == 2
    for key, seq, value in random.Random(1).sample(rows, 200):
        assert reader.get(PATH, key) == (seq, value)
        assert reader.get(PATH, key) == (seq, value)  # cached
    assert reader.get(PATH, b"key00000005x") is None
    assert list(reader.scan(PATH, b"key00001000", b"key00001500")) == rows[1000:1500]
    assert list(TableReader(store).scan_all(PATH, chunk_bytes=1 << 16)) == rows


@pytest.mark.parametrize("version", [3, 5])
def test_gets_and_scans_share_cached_raw_blocks(version: int) -> None:
    """A get caches a version 3 or 5 block raw; a scan decodes it once and replaces it;
    every path returns the same entries."""
    rows = entries(5000)
    data = sst(5000, version=version)
    reader = TableReader(store_with(data))
    sample = random.Random(2).sample(rows, 300)
    for key, seq, value in sample:
        assert reader.get(PATH, key) == (seq, value)
    raw_bytes = reader.stats().block_cache_bytes
    assert list(reader.scan(PATH, b"", None)) == rows
    # A short scan (one first chunk) decodes the raw blocks it meets and caches them decoded.
    first = min(sample)[0]
    assert list(reader.scan(PATH, first, first + b"~")) == [r for r in rows if r[0] == first]
    assert reader.stats().block_cache_bytes > raw_bytes
    for key, seq, value in sample:
        assert reader.get(PATH, key) == (seq, value)
        assert reader.get(PATH, key + b"~") is None


def test_a_columnar_block_is_cached_decoded_while_the_cache_has_room() -> None:
    """A version 5 block read by a get is decoded to answer it: while the block cache has
    room it is cached so, and its next get only bisects (before, it was cached as its bytes
    and decoded again on that get)."""
    rows = entries(400)
    reader = TableReader(store_with(sst(400, block_size=4096)))
    key, seq, value = rows[100]
    assert reader.get(PATH, key) == (seq, value)
    (cached,) = reader._blocks.values()
    assert isinstance(cached, Block)
    assert reader.get(PATH, key) == (seq, value)
    (again,) = reader._blocks.values()
    assert again is cached


def test_blocks_that_would_evict_decoded_are_cached_raw_until_hot() -> None:
    """Once a decoded block would evict something, blocks are cached as their bytes (the
    decoded form takes about twice the memory), nothing evicted; a raw block's
    ``PROMOTE_COLUMNAR_AFTER_HITS``-th cache hit caches it decoded."""
    rows = entries(400)
    data = sst(400, block_size=4096)
    probe = TableReader(store_with(data))
    probe.get(PATH, rows[0][0])
    (decoded,) = probe._blocks.values()
    raw = RawColumnarBlock(b"x" * 4096).size_in_memory  # about one block's bytes
    room = 3 * decoded.size_in_memory + 2 * (raw + 200)  # three decoded, then two raw
    reader = TableReader(store_with(data), block_cache_bytes=room)
    firsts = [rows[i] for i in range(0, 400, 400 // 5)][:5]  # five blocks apart
    for key, seq, value in firsts:
        assert reader.get(PATH, key) == (seq, value)
    kinds = [type(b) for b in reader._blocks.values()]
    assert kinds == [Block, Block, Block, RawColumnarBlock, RawColumnarBlock]
    key, seq, value = firsts[-1]
    for _ in range(PROMOTE_COLUMNAR_AFTER_HITS):
        assert reader.get(PATH, key) == (seq, value)
    assert type(reader._blocks.values()[-1]) is Block
    assert reader.get(PATH, key) == (seq, value) and reader.get(PATH, key + b"~") is None


def test_get_many_decodes_a_cached_columnar_block_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of keys in one raw cached version 5 block decodes it once (it was once per
    key), and keeps it decoded."""
    rows = entries(400)
    reader = TableReader(store_with(sst(400, block_size=4096)), block_cache_bytes=4096 + 200)
    assert reader.get(PATH, rows[0][0]) == rows[0][1:]  # cached raw: no room decoded
    decodes: list[int] = []
    decode_body = columnar._decode_body

    def counting(body: bytes | memoryview) -> Block:
        decodes.append(len(body))
        return decode_body(body)

    monkeypatch.setattr(columnar, "_decode_body", counting)
    wanted = rows[:30]
    assert reader.get_many(PATH, [k for k, _, _ in wanted]) == [(s, v) for _, s, v in wanted]
    assert len(decodes) == 1
    (cached,) = reader._blocks.values()
    assert isinstance(cached, Block)  # kept decoded: the next batch decodes nothing
    assert reader.get_many(PATH, [k for k, _, _ in wanted]) == [(s, v) for _, s, v in wanted]
    assert len(decodes) == 1


# -- pinned top levels follow the view -----------------------------------------------------


def test_retain_releases_the_top_levels_of_ssts_that_left_the_view() -> None:
    store = MetricsStore(open_store("memory://"))
    for name in "abc":
        store.put(f"{name}.sst", sst(2000))
    reader = TableReader(store)
    for name in "abc":
        reader.top(f"{name}.sst")
    assert reader.stats().pinned_ssts == 3
    view1, view2 = object(), object()
    reader.retain(view1, ["a.sst", "b.sst"])
    assert reader.stats().pinned_ssts == 2
    reader.retain(view2, ["b.sst"])  # a.sst stays while view1's readers may run
    assert reader.stats().pinned_ssts == 2
    reader.retain(view2, ["b.sst"])
    reader.retain(object(), ["b.sst"])
    assert reader.stats().pinned_ssts == 1
    assert reader.stats().pinned_bytes == reader.top("b.sst").size_in_memory + 0


# -- corrupt bytes: a typed error naming the object, never wrong data ----------------------


@pytest.mark.parametrize("version", [2, 3, 5])
def test_flipping_any_byte_of_a_v2_v3_or_v5_sst_in_the_store_is_detected(version: int) -> None:
    rows = [(b"key%04d" % i, i + 1, None if i % 9 == 0 else b"val%04d" % i) for i in range(90)]
    builder = SstBuilder(writer_epoch=1, block_size=128, format_version=version)
    data = builder.add_all(rows).finish().data
    rng = random.Random(5)
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= 1 << rng.randrange(8)
        store = open_store("memory://")
        store.put(PATH, bytes(corrupt))
        reader = TableReader(store)
        try:
            got = [reader.get(PATH, k, size=len(data)) for k, _, _ in rows]
            got_absent = [reader.get(PATH, k + b"!") for k, _, _ in rows[::7]]
            scanned = list(reader.scan(PATH, b"", None))
        except CorruptionError as exc:
            assert exc.path == PATH
            continue
        assert got == [(s, v) for _, s, v in rows] and not any(got_absent)
        assert scanned == rows
        pytest.fail(f"flipping byte {position} went undetected")


# -- request counts on every backend ---------------------------------------------------------


def test_request_counts_on_each_backend(backend: Backend) -> None:
    """Open = one range GET (no suffix, no HEAD: the size is known), a cold get <= 2 more, a
    warm get none, a full scan a few GETs; the same on memory, file, S3 over HTTP, Azure."""
    data = sst(20_000, block_size=4096, value_size=100)  # ~2.6 MB
    raw = backend.store()
    raw.put(PATH, data)
    store = MetricsStore(NoSuffix(raw))
    reader = TableReader(store, scan_read_ahead_bytes=1 << 20)
    reader.top(PATH, size=len(data))
    assert {k: s.requests for k, s in store.metrics.snapshot().items()} == {"get_range": 1}
    for i in (5, 19_999, 12_345):
        store.metrics.reset()
        assert reader.get(PATH, b"key%08d" % i) == (i + 1, b"v" * 100)
        assert store.metrics.requests("get_range") <= 2
        store.metrics.reset()
        assert reader.get(PATH, b"key%08d" % i) == (i + 1, b"v" * 100)
        assert store.metrics.snapshot() == {}
    store.metrics.reset()
    scan = TableReader(store, scan_read_ahead_bytes=1 << 20).scan(PATH, b"", None, size=len(data))
    assert list(scan) == entries(20_000, 100)
    assert set(store.metrics.snapshot()) == {"get_range"}
    assert store.metrics.requests("get_range") <= len(data) // (1 << 20) + 5 + 2
    assert read_ahead_threads() == []


@pytest.mark.parametrize("block_cache_bytes", [64 * 1024 * 1024, 4096 + 200])
def test_get_many_answers_as_get_does_cold_warm_and_raw(block_cache_bytes: int) -> None:
    """get_many answers keys from decoded cached blocks directly, from raw cached ones after
    one decode, and reads the others (asking the filter first): the same answers as get,
    whichever way each block is held."""
    rows = entries(400)
    store = store_with(sst(400, block_size=1024))
    rng = random.Random(5)
    present = [k for k, _, _ in rng.sample(rows, 60)]
    keys = sorted({*present, *(k + b"~" for k in present[:20]), b"", b"\xff"})
    expected = [TableReader(store).get(PATH, k) for k in keys]
    assert sum(e is not None for e in expected) == 60
    reader = TableReader(store, block_cache_bytes=block_cache_bytes)
    assert reader.get_many(PATH, keys) == expected  # cold: read
    assert reader.get_many(PATH, keys) == expected  # warm, or raw and decoded again
    assert reader.get_many(PATH, keys[::3]) == expected[::3]
    store.metrics.reset()
    absent = [k + b"~" for k in present[20:40]]
    assert TableReader(store).get_many(PATH, sorted(absent)) == [None] * 20
    assert store.metrics.requests("get_range") <= 3, "blocks read for keys the filter ruled out"
