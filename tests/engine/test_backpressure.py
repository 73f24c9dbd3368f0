"""``max_unflushed_bytes``: writes block while compaction is behind, instead of growing memory."""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch, WriteStalled
from slatepy.compactor import Compactor
from slatepy.engine.memtable import Memtable, entry_cost
from tests.conftest import Backend

PUT = entry_cost(b"key0000", b"x" * 200)  # what one put below costs the memtable


def tight(backend: Backend, **overrides: object) -> Settings:
    fields = {f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}
    return Settings.from_dict(
        {**fields, "flush_bytes": 1024, "max_unflushed_bytes": 8192, **overrides}
    )


# Engine logic, not store behaviour: the local backends are enough (and fast).
LOCAL = pytest.mark.parametrize("backend", ["memory", "file"], indirect=True)


@LOCAL
def test_writes_stall_without_compaction_and_resume_with_it(backend: Backend) -> None:
    settings = tight(backend, write_stall_timeout=0.3)
    with Db.open(backend.target(), settings=settings) as db:
        written = 0
        with pytest.raises(WriteStalled, match="max_unflushed_bytes"):
            for written in range(1000):  # bounded: 1000 puts are far past the limit
                db.put(b"key%04d" % written, b"x" * 200)
        assert db.get(b"key%04d" % written) is None  # the stalled write was not applied
        # The limit counts the entries' real memory (Python objects included), not payload.
        assert written == -(-8192 // PUT)

    settings = tight(backend, write_stall_timeout=30)
    with Db.open(backend.target(), settings=settings) as db:  # replays: over the limit again
        compactor = Compactor(backend.store(), settings=settings)
        stop = threading.Event()

        def compact() -> None:
            while not stop.wait(0.02):
                compactor.run_until_idle()

        thread = threading.Thread(target=compact)
        thread.start()
        try:
            for i in range(200):  # 40 KB through an 8 KB window
                db.put(b"more%04d" % i, b"y" * 200)
        finally:
            stop.set()
            thread.join()
        assert db._memtable.size_bytes < 8192 + PUT
        assert db.get(b"more0000") == b"y" * 200 and db.get(b"key0000") == b"x" * 200


@LOCAL
def test_the_in_process_compactor_keeps_writes_flowing(backend: Backend) -> None:
    settings = tight(backend, compactor="in-process", compaction_interval=0.02)
    with Db.open(backend.target(), settings=settings) as db:
        for i in range(200):
            db.put(b"k%04d" % i, b"z" * 200)
        assert db._memtable.size_bytes < 8192 + PUT
        assert len(list(db.scan())) == 200


def test_the_stall_engages_at_the_memory_the_writes_really_hold(tmp_path: Path) -> None:
    """Writes stall once the memtable holds about ``max_unflushed_bytes`` of process memory."""
    limit = 4 * 1024 * 1024
    settings = Settings(
        compactor="off", flush_interval=60, max_unflushed_bytes=limit, write_stall_timeout=0.05
    )
    # A file store: a memory store would hold the WAL SSTs in memory as well.
    with Db.open(f"file://{tmp_path}/db", settings=settings) as db:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            memtable = db._memtable
            with pytest.raises(WriteStalled):
                for first in range(0, 10 * limit // 100, 100):
                    batch = WriteBatch()
                    for i in range(first, first + 100):
                        batch.put(b"key%013d" % i, os.urandom(100))
                    db.write(batch, await_durable=False)
                    db.flush()  # drop the WAL buffer so what remains is the memtable's
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert limit <= memtable.size_bytes < limit + 100 * entry_cost(b"k" * 16, b"v" * 100)
        # Within 15 % of the real memory (the rest is the WAL's bookkeeping and the
        # allocator's rounding); the old accounting (payload + 64 B) was off by 1.8x.
        assert 0.85 < held / memtable.size_bytes < 1.15


@pytest.mark.parametrize("value_size", [0, 10, 100, 1000])
def test_memtable_size_matches_traced_memory(value_size: int) -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        memtable = Memtable()
        for i in range(20_000):
            value = os.urandom(value_size) if value_size else None  # 0: tombstones
            memtable.put(b"key%013d" % i, (1 << 40) + i, value)
        for i in range(0, 20_000, 2):  # overwrites replace the value, not the entry
            value = os.urandom(value_size) if value_size else None
            memtable.put(b"key%013d" % i, (1 << 41) + i, value)
        memtable.range(b"", None)  # the ordered key list
        held = tracemalloc.get_traced_memory()[0] - before
        assert 0.85 < held / memtable.size_bytes < 1.15
        size = memtable.size_bytes
        memtable.prune(1 << 40)  # drops nothing: every seq is above it
        assert memtable.size_bytes == size
    finally:
        tracemalloc.stop()


@LOCAL
def test_half_the_budget_wakes_the_in_process_compactor(backend: Backend) -> None:
    """With a compaction interval far longer than the test, writes past the budget only go on
    because the writer wakes its compactor at half of ``max_unflushed_bytes``."""
    settings = tight(
        backend,
        compactor="in-process",
        compaction_interval=3600.0,
        compactor_lease=3 * 3600.0,
        write_stall_timeout=10.0,
        flush_interval=0.01,
    )
    with Db.open(backend.target(), settings=settings) as db:
        for i in range(200):  # ~6x the budget
            db.put(b"key%04d" % i, b"x" * 200)
        assert db.wal_id_last_compacted > 0
        assert db.get(b"key0000") == b"x" * 200
