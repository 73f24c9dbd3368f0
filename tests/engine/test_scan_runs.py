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
