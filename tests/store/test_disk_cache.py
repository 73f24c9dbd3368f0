"""The local disk cache (RFC 0010): correct bytes, fewer requests, corruption, eviction, processes.

Objects here are small and parts tiny (``PART`` bytes) so a test crosses many part boundaries
cheaply; the production part size is 1 MiB.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.store import ObjectStore, open_store
from slatepy.store.disk_cache import CorruptCacheEntry, DiskCache, DiskCachedStore
from slatepy.store.disk_cache.entry import encode, read_data, read_header
from tests.processes import spawn
from tests.store.child_cache import content, hammer

PART = 1024
SST = "compacted/0123456789abcdef.sst"


def cached(
    inner: ObjectStore, root: Path | str, *, max_bytes: int = 1 << 30, url: str = "memory://"
) -> DiskCachedStore:
    """A cached store over ``inner`` whose ``metrics`` count the requests that reach it."""
    return DiskCachedStore(inner, DiskCache(root, max_bytes), namespace=url, part_size=PART)


def cache_files(root: Path) -> list[Path]:
    """The cached entries (not the eviction lock, not temporaries)."""
    return sorted(p for p in (root / "v1").glob("*/*/*") if p.is_file() and p.parent.name != "tmp")


def part_files(root: Path) -> list[Path]:
    return [p for p in cache_files(root) if ".p" in p.name]


def ranged_requests(store: DiskCachedStore) -> int:
    return store.metrics.requests("get_range")


# -- the bytes are always the store's ------------------------------------------------------


@given(st.data())
def test_cached_reads_return_exactly_what_the_store_returns(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 5 * PART) | st.sampled_from([PART, 2 * PART, 3 * PART]))
    inner = open_store("memory://")
    body = os.urandom(size)
    inner.put(SST, body)
    offsets = st.integers(0, size - 1)
    ranges = st.tuples(offsets, st.integers(1, 3 * PART + 7)).map(
        lambda r: ("range", (r[0], r[0] + r[1]))  # may end past the object's end
    )
    suffixes = st.integers(1, 2 * size).map(lambda n: ("suffix", (n, 0)))
    reads = data.draw(st.lists(ranges | suffixes, min_size=1, max_size=8))
    with tempfile.TemporaryDirectory() as root:
        for _round in range(2):  # cold, then from the cache (a fresh store: nothing in memory)
            store = cached(inner, root)
            for kind, (a, b) in reads:
                if kind == "suffix":
                    assert store.get_suffix(SST, a) == body[-a:]
                else:
                    assert store.get_range(SST, a, b) == body[a:b]
            ranges = [r for kind, r in reads if kind == "range"]
            if ranges:
                assert store.get_ranges(SST, ranges) == [body[a:b] for a, b in ranges]


def test_a_read_up_to_the_end_of_an_object_of_whole_parts(tmp_path: Path) -> None:
    """Part 3 of a 3-part object does not exist; asking past the end must not make a 416."""
    inner = open_store("memory://")
    body = os.urandom(3 * PART)
    inner.put(SST, body)
    store = cached(inner, tmp_path)
    assert store.get_range(SST, 2 * PART, 3 * PART) == body[2 * PART :]  # caches part 2 (full)
    assert store.get_range(SST, 3 * PART - 5, 4 * PART + 9) == body[-5:]
    assert cached(inner, tmp_path).get_range(SST, 3 * PART - 5, 5 * PART) == body[-5:]


# -- requests ------------------------------------------------------------------------------


def test_a_second_read_makes_no_request_and_counts_hits(tmp_path: Path) -> None:
    inner = open_store("memory://")
    inner.put(SST, os.urandom(5 * PART))
    store = cached(inner, tmp_path)
    store.get_range(SST, PART + 10, 3 * PART + 10)  # parts 1, 2, 3
    assert ranged_requests(store) == 1
    cache = store.metrics.cache_snapshot()
    assert (cache.hits, cache.misses, cache.fetched_bytes) == (0, 3, 3 * PART)
    store.get_range(SST, PART + 100, 2 * PART + 100)
    assert ranged_requests(store) == 1
    cache = store.metrics.cache_snapshot()
    assert (cache.hits, cache.misses, cache.hit_bytes) == (2, 3, PART)
    assert cache.hit_rate == pytest.approx(0.4)


def test_only_missing_parts_are_fetched_in_one_request(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(5 * PART)
    inner.put(SST, body)
    store = cached(inner, tmp_path)
    store.get_range(SST, PART, PART + 1)
    store.get_range(SST, 3 * PART, 3 * PART + 1)  # parts 1 and 3 cached
    store.metrics.reset()
    assert store.get_range(SST, 0, 5 * PART) == body
    assert store.metrics.requests("get_range") == 3  # runs [0], [2], [4], sent in one call
    assert store.metrics.cache_snapshot().misses == 3
    store.get_range(SST, 2 * PART, 2 * PART + 1)
    store.metrics.reset()
    store2 = cached(inner, tmp_path)
    other = "compacted/other.sst"
    inner.put(other, body)
    store2.get_range(other, 2 * PART, 2 * PART + 1)
    store2.metrics.reset()
    assert store2.get_range(other, 0, 2 * PART) == body[: 2 * PART]  # parts 0 and 1: one run
    assert store2.metrics.requests("get_range") == 1


def test_manifests_and_wal_are_never_cached(tmp_path: Path) -> None:
    inner = open_store("memory://")
    for path in ("manifest/00000000000000000001.manifest", "wal/00000000000000000001.sst"):
        inner.put(path, b"x" * 100)
        store = cached(inner, tmp_path)
        for _ in range(2):
            assert store.get_range(path, 0, 10) == b"x" * 10
            assert store.get_suffix(path, 10) == b"x" * 10
        assert store.metrics.requests("get_range") == 4
        assert store.metrics.cache_snapshot().hits == 0
    assert not cache_files(tmp_path)


def test_a_suffix_read_is_cached_and_a_small_object_whole(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(2 * PART + 100)
    inner.put(SST, body)
    store = cached(inner, tmp_path)
    assert store.get_suffix(SST, 64 * 1024) == body  # shorter than asked: the whole object
    store.metrics.reset()
    assert store.get_suffix(SST, 64 * 1024) == body
    assert store.get_range(SST, 10, 2 * PART + 50) == body[10 : 2 * PART + 50]
    assert store.get_range(SST, 0, 64 * 1024) == body
    assert ranged_requests(store) == 0


def test_large_reads_bypass_the_cache(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(8 * PART)
    inner.put(SST, body)
    store = DiskCachedStore(
        inner, DiskCache(tmp_path, 1 << 30), namespace="m", part_size=PART, fill_limit=4 * PART
    )
    assert store.get_range(SST, 0, 8 * PART) == body
    assert not cache_files(tmp_path)
    assert store.metrics.cache_snapshot().misses == 0


def test_deleting_an_object_forgets_its_parts(tmp_path: Path) -> None:
    inner = open_store("memory://")
    inner.put(SST, os.urandom(3 * PART))
    inner.put("compacted/keep.sst", os.urandom(PART))
    store = cached(inner, tmp_path)
    store.get_range(SST, 0, 3 * PART)
    store.get_range("compacted/keep.sst", 0, 10)
    assert len(cache_files(tmp_path)) == 4
    store.delete(SST)
    assert len(cache_files(tmp_path)) == 1


# -- corruption ----------------------------------------------------------------------------


def _flip_data(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x40
    path.write_bytes(bytes(raw))


def _flip_header(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[9] ^= 0x01  # inside data_len
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a cache file")


@pytest.mark.parametrize("corrupt", [_flip_data, _flip_header, _truncate, _garbage])
def test_a_corrupted_cache_file_is_detected_deleted_and_refetched(
    tmp_path: Path, corrupt: object
) -> None:
    inner = open_store("memory://")
    body = os.urandom(2 * PART)
    inner.put(SST, body)
    cached(inner, tmp_path).get_range(SST, 0, 2 * PART)
    victim = part_files(tmp_path)[-1]
    assert callable(corrupt)
    corrupt(victim)

    store = cached(inner, tmp_path)
    assert store.get_range(SST, 0, 2 * PART) == body  # the store's bytes, not the cache's
    cache = store.metrics.cache_snapshot()
    assert (cache.corrupt, cache.hits, cache.misses) == (1, 1, 1)
    assert ranged_requests(store) == 1
    assert store.get_range(SST, 0, 2 * PART) == body  # refetched and cached again, intact
    assert ranged_requests(store) == 1
    assert store.metrics.cache_snapshot().corrupt == 1


def test_a_file_holding_another_part_is_not_taken_for_this_one(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(2 * PART)
    inner.put(SST, body)
    cached(inner, tmp_path).get_range(SST, 0, 2 * PART)
    first, second = sorted(part_files(tmp_path), key=lambda p: p.name)
    second.write_bytes(first.read_bytes())  # a valid file, under the wrong name
    store = cached(inner, tmp_path)
    assert store.get_range(SST, 0, 2 * PART) == body
    assert store.metrics.cache_snapshot().corrupt == 1


def test_every_flipped_byte_of_an_entry_is_detected(tmp_path: Path) -> None:
    key = b"memory://\0compacted/x.sst\0p1024-0"
    data = os.urandom(300)
    good = b"".join(encode(key, data, chunk_size=64))
    path = tmp_path / "entry"
    for position in range(len(good)):
        raw = bytearray(good)
        raw[position] ^= 0x10
        path.write_bytes(bytes(raw))
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(CorruptCacheEntry):
                read_data(fd, read_header(fd, key, len(raw)), 0, len(data))
        finally:
            os.close(fd)
    path.write_bytes(good)
    fd = os.open(path, os.O_RDONLY)
    try:
        header = read_header(fd, key, len(good))
        assert read_data(fd, header, 0, 300) == data
        assert read_data(fd, header, 70, 130) == data[70:130]  # reads chunks 1 and 2 only
    finally:
        os.close(fd)


def test_local_io_errors_fall_back_to_the_store(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(2 * PART)
    inner.put(SST, body)
    blocked = tmp_path / "not-a-directory"
    blocked.write_bytes(b"")
    store = cached(inner, blocked)
    for _ in range(2):
        assert store.get_range(SST, 0, 2 * PART) == body
    assert ranged_requests(store) == 2
    assert store.metrics.cache_snapshot().errors > 0


# -- eviction ------------------------------------------------------------------------------


def test_eviction_keeps_the_cache_under_its_bound_and_recent_parts_in_it(tmp_path: Path) -> None:
    inner = open_store("memory://")
    objects = [f"compacted/{i:04d}.sst" for i in range(40)]
    for path in objects:
        inner.put(path, os.urandom(PART))
    hot = objects[0]
    entry = PART + 100  # a part file: the part and its header
    bound = 10 * entry
    store = cached(inner, tmp_path, max_bytes=bound)
    store.get_range(hot, 0, PART)
    for path in objects[1:]:
        store.get_range(hot, 0, 10)  # the hot part is read between every two fills
        store.get_range(path, 0, PART)
        assert sum(p.stat().st_size for p in cache_files(tmp_path)) <= bound
    assert store.metrics.cache_snapshot().evictions >= 25
    store.metrics.reset()
    store.get_range(hot, 0, PART)
    store.get_range(objects[-1], 0, PART)
    assert ranged_requests(store) == 0  # the most recently used survived
    store.get_range(objects[1], 0, PART)
    assert ranged_requests(store) == 1  # the least recently used went first


def test_a_part_evicted_during_a_read_is_a_miss(tmp_path: Path) -> None:
    inner = open_store("memory://")
    body = os.urandom(2 * PART)
    inner.put(SST, body)
    store = cached(inner, tmp_path)
    store.get_range(SST, 0, 2 * PART)
    for path in part_files(tmp_path):
        path.unlink()  # what another process's eviction does
    assert store.get_range(SST, 0, 2 * PART) == body
    cache = store.metrics.cache_snapshot()
    assert (cache.misses, cache.corrupt, cache.errors) == (4, 0, 0)


# -- processes -----------------------------------------------------------------------------


def _child(config: dict[str, object]) -> dict[str, object]:
    child = spawn("tests.store.child_cache", json.dumps(config), stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    result: dict[str, object] = json.loads(out.splitlines()[-1])
    return result


def test_two_processes_share_a_cache(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    inner = open_store(url, create=True)  # the test fills a new location
    body = os.urandom(6 * PART)
    inner.put(SST, body)
    root = tmp_path / "cache"
    store = cached(inner, root, url=url)
    assert store.get_range(SST, 100, 3 * PART) == body[100 : 3 * PART]  # parts 0..2
    assert store.metrics.cache_snapshot().misses == 3

    config = {"url": url, "cache_dir": str(root), "max_bytes": 1 << 30, "part_size": PART}
    reads = [[SST, 0, 3 * PART], [SST, 5 * PART, 6 * PART]]  # three hits, then a new part
    out = _child({**config, "mode": "read", "reads": reads})
    assert out["digests"] == [hashlib.sha256(body[a:b]).hexdigest() for _, a, b in reads]
    cache = out["cache"]
    assert isinstance(cache, dict)
    assert (cache["hits"], cache["misses"]) == (3, 1)  # the parent's parts came from disk
    assert out["requests"] == {"get_range": 1}

    store.metrics.reset()
    assert store.get_range(SST, 5 * PART, 6 * PART) == body[5 * PART :]  # the child's part
    assert ranged_requests(store) == 0


@pytest.mark.slow
def test_processes_evicting_under_each_other_never_see_wrong_bytes(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    inner = open_store(url, create=True)  # the test fills a new location
    objects = [[f"compacted/{i}.sst", 3 * PART + i * 37] for i in range(12)]
    for path, size in objects:
        inner.put(path, content(path, size))
    root = tmp_path / "cache"
    bound = 8 * (PART + 100)  # far below the data: both processes evict all the time
    config = {"url": url, "cache_dir": str(root), "max_bytes": bound, "part_size": PART}
    child = spawn(
        "tests.store.child_cache",
        json.dumps({**config, "mode": "hammer", "objects": objects, "seconds": 3, "seed": 2}),
        stdout=subprocess.PIPE,
    )
    store = cached(inner, root, max_bytes=bound, url=url)
    assert hammer(store, objects, 3.0, seed=1) == 0
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    result = json.loads(out.splitlines()[-1])
    assert result["bad"] == 0
    theirs = result["cache"]
    assert theirs["errors"] == 0 and theirs["hits"] > 0 and theirs["evictions"] > 0
    mine = store.metrics.cache_snapshot()
    assert mine.errors == 0 and mine.hits > 0 and mine.evictions > 0
    # Between passes each process may overshoot by what it wrote since its last eviction
    # (more when the other held the eviction lock, as on a loaded machine); the next pass
    # brings the cache back under the bound.
    store.cache.evict()
    assert sum(p.stat().st_size for p in cache_files(root)) <= bound


def test_the_uncached_view_counts_into_the_same_metrics(tmp_path: Path) -> None:
    inner = open_store("memory://")
    inner.put(SST, os.urandom(PART))
    store = cached(inner, tmp_path)
    bulk = store.uncached()
    for _ in range(2):
        bulk.get_range(SST, 0, 10)
    assert store.metrics.requests("get_range") == 2
    assert not cache_files(tmp_path)
    store.get_range(SST, 0, 10)
    assert "disk cache: hit rate 0.0%" in store.metrics.format_table()
