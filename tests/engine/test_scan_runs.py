"""Scans over a sorted run of several SSTs (RFC 0014): the next SST is opened in the
background while one is read, its chunks start large, and no thread outlives the scan."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path

OFF = Settings(compactor="off")


def read_ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("slatepy-read-ahead")]


def run_of_ssts(tmp_path: Path, n: int = 20_000) -> tuple[str, list[str]]:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        for first in range(0, n, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(b"key%08d" % i, b"v" * 100)
            db.write(batch)
    policy = CompactionPolicy(l0_trigger=1, target_sst_bytes=512 * 1024)
    Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
    stored = ManifestStore(open_store(url)).load()
    assert stored is not None and not stored.manifest.l0
    (run,) = stored.manifest.sorted_runs
    assert len(run.ssts) >= 4
    return url, [compacted_path(h.id) for h in run.ssts]


def test_the_next_sst_of_a_run_is_opened_while_one_is_read(tmp_path: Path) -> None:
    url, paths = run_of_ssts(tmp_path)
    with Db.open(url, settings=OFF) as db:
        tables = db._tables
        it = db.scan()
        assert next(it)[0] == b"key00000000"
        deadline = time.monotonic() + 5
        while not tables.is_open(paths[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tables.is_open(paths[1])  # opened ahead, the scan has not reached it
        assert not tables.is_open(paths[2])  # one SST ahead, no further
        it.close()
        assert read_ahead_threads() == []
        assert sum(1 for _ in db.scan()) == 20_000
        assert read_ahead_threads() == []


def test_a_scan_across_a_run_starts_each_following_sst_at_the_largest_chunk(
    tmp_path: Path,
) -> None:
    url, paths = run_of_ssts(tmp_path)
    settings = Settings(compactor="off", disk_cache="off")
    with Db.open(url, settings=settings) as db:
        db.metrics.reset()
        assert sum(1 for _ in db.scan()) == 20_000
        requests = db.metrics.requests("get_range")
    # Each SST (~0.5 MB, under the 8 MiB read-ahead): its open, one run of partitions (or
    # none, when they came with the open), and its blocks. The first grows 64 KiB, 256 KiB,
    # 1 MiB; the others are read in one chunk each.
    assert requests <= 2 + 3 + (len(paths) - 1) * 3, (requests, len(paths))


def test_a_merged_scan_reads_ahead_with_one_scans_threads(tmp_path: Path) -> None:
    """The L0 SSTs of a merged scan read ahead with one pool of threads (each used to start
    its own: a scan over 20 L0 SSTs started about 50 threads), each source with at most
    ``scan_requests_in_flight`` requests in it, and no thread outlives the scan, finished or
    abandoned."""
    url, sources, per = f"file://{tmp_path}/db", 6, 4000
    with Db.open(url, settings=OFF) as db:
        for part in range(sources):  # each flush spans the key space: every SST overlaps
            batch = WriteBatch()
            for i in range(per):
                batch.put(b"key%08d" % (i * sources + part), b"v" * 200)
            db.write(batch)
            db.flush()
            policy = CompactionPolicy(l0_trigger=10_000)  # each flush its own L0 SST
            Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
    settings = Settings(compactor="off", disk_cache="off", scan_requests_in_flight=2)
    with Db.open(url, settings=settings) as db:
        assert len(db._view.l0) == sources and not db._memtable
        tables = db._tables
        seen = 0
        rows = 0
        for rows, _ in enumerate(db.scan(), 1):
            if rows % 500 == 0:
                seen = max(seen, len(read_ahead_threads()))
        assert rows == sources * per
        assert tables.stats().read_ahead_threads == 1  # one pool for the six sources
        assert 0 < seen <= sources  # one request in flight per source at most
        assert read_ahead_threads() == []
        it = db.scan()
        for _ in range(sources * per // 2):
            next(it)
        assert read_ahead_threads()  # reading ahead halfway through
        it.close()
        assert read_ahead_threads() == []
