"""A closed database holds no data in memory, even while its object stays referenced (issue
18: ``with Db.open(...) as db:`` leaves ``db`` bound, with its memtable and caches), and a get
racing ``close()`` raises ``ClosedError`` rather than miss a write the closing emptied."""

from __future__ import annotations

import gc
import threading
import tracemalloc

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.engine.memtable import Memtable, Version
from slatepy.errors import ClosedError
from slatepy.store import open_store

SETTINGS = Settings(compactor="off", flush_interval=60)


def test_closing_releases_the_memtable_and_caches_while_referenced() -> None:
    store = open_store("memory://")
    tracemalloc.start()
    try:
        db = Db.open(store, settings=SETTINGS)
        for first in range(0, 20_000, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(b"key%08d" % i, b"%010d" % i * 10)
            db.write(batch)
        assert db.get(b"key00000007") == b"%010d" % 7 * 10
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        db.close()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 20k entries of ~330 B with their objects (6.6 MB); the store keeps its own copy of the
    # WAL SSTs, outside what the database object holds.
    assert held - after > 5_000_000, (held, after)
    with pytest.raises(ClosedError):
        db.get(b"key00000007")
    with Db.open(store, settings=SETTINGS) as reopened:
        assert reopened.get(b"key00019999") == b"%010d" % 19999 * 10


def test_a_get_racing_close_raises_rather_than_miss_a_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = Db.open(open_store("memory://"), settings=SETTINGS)
    db.put(b"k", b"v")  # in the memtable only (and durable in the WAL)
    passed_the_check, closed = threading.Event(), threading.Event()
    memtable_get = Memtable.get

    def pause_after_the_open_check(memtable: Memtable, key: bytes) -> Version | None:
        if memtable is db._memtable and not passed_the_check.is_set():
            passed_the_check.set()
            assert closed.wait(5)
            # As if paused before reading db._memtable: close() has replaced it since.
            return memtable_get(db._memtable, key)
        return memtable_get(memtable, key)

    monkeypatch.setattr(Memtable, "get", pause_after_the_open_check)
    outcome: list[object] = []

    def get() -> None:
        try:
            outcome.append(db.get(b"k"))
        except ClosedError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=get)
    reader.start()
    assert passed_the_check.wait(5)
    db.close()
    closed.set()
    reader.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError), outcome
