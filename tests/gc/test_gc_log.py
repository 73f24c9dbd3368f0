"""Each garbage-collection pass logs one INFO line with what it deleted, by kind (issue 12)."""

from __future__ import annotations

import logging

import pytest

from slatepy import Db, Settings
from slatepy.compactor import Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import open_store

OFF = Settings(compactor="off")


def test_a_gc_pass_logs_counts_and_bytes_by_kind(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory://")
    with Db.open(store, settings=OFF) as db:
        for i in range(4):
            db.put(b"k%d" % i, b"v")
    Compactor(store, settings=OFF).run_until_idle()
    collector = GarbageCollector(store, settings=OFF, min_age=0)
    with caplog.at_level(logging.INFO, logger="slatepy.gc.collector"):
        report = collector.collect()
        collector.collect()
    passes = [r.getMessage() for r in caplog.records if r.name == "slatepy.gc.collector"]
    assert len(passes) == 2  # one line per pass, also when there was nothing to delete
    wal_count, wal_bytes = report.by_kind()["wal"]
    assert wal_count == 4  # WAL 1..4; the SST at wal_id_last_compacted (5) stays
    assert passes[0].startswith(f"gc pass on memory://: deleted {len(report.deletions)} objects")
    assert f"wal {wal_count} ({wal_bytes} B)" in passes[0]
    assert "deleted 0 objects, 0 bytes in" in passes[1]
