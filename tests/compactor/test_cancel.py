"""Closing a writer while its compactor merges a large backlog returns at once."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import BackgroundCompactor, CompactionPolicy, Compactor
from slatepy.errors import CompactionAbandoned
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import WrappingStore

QUIET = Settings(compactor="off", flush_interval=60)


class ReadSignal(WrappingStore):
    """Sets ``reading`` once a compactor reads WAL SST data (its merge has begun)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.reading = threading.Event()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if path.startswith("wal/"):
            self.reading.set()
        return self.inner.get_range(path, start, end)


def backlog(store: ObjectStore, keys: int) -> None:
    with Db.open(store, settings=QUIET) as db:
        for first in range(0, keys, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(b"key%09d" % i, b"v" * 100)
            db.write(batch)


def test_cancel_stops_a_compaction_in_progress_and_publishes_nothing() -> None:
    store = open_store("memory://")
    backlog(store, 120_000)
    signal = ReadSignal(store)
    compactor = Compactor(signal, settings=QUIET, policy=CompactionPolicy())
    before = ManifestStore(store).latest_id()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            compactor.run_once()
            outcome.append(None)
        except CompactionAbandoned as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert signal.reading.wait(10)
    start = time.monotonic()
    compactor.cancel()
    thread.join(10)
    assert time.monotonic() - start < 1.0, "cancel did not stop the merge promptly"
    assert outcome and isinstance(outcome[0], CompactionAbandoned)
    assert ManifestStore(store).latest_id() == before, "a cancelled compaction published"
    with pytest.raises(CompactionAbandoned):
        compactor.run_once()  # cancelled for good


def test_closing_the_background_compactor_mid_compaction_returns_quickly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store("memory://")
    backlog(store, 120_000)
    signal = ReadSignal(store)
    settings = Settings(compactor="off", compaction_interval=0.01)
    background = BackgroundCompactor(Compactor(signal, settings=settings))
    assert signal.reading.wait(10)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        background.close()
    assert time.monotonic() - start < 1.0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with Db.open(store, settings=QUIET) as db:  # nothing half done: the data reads back
        assert db.get(b"key000119999") == b"v" * 100
