"""What a ``Db`` says about itself: an INFO line on open, a ``ResourceWarning`` when it is
garbage-collected without ``close()`` (issue 12, "silent waits and loss")."""

from __future__ import annotations

import gc
import logging

import pytest

from slatepy import Db, Settings
from slatepy.store import open_store

OFF = Settings(compactor="off")


def test_open_logs_epoch_replay_and_time(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory://")
    with caplog.at_level(logging.INFO, logger="slatepy.engine.db"):
        with Db.open(store, settings=OFF) as db:
            db.put(b"a", b"1")
            db.put(b"b", b"2")
        with Db.open(store, settings=OFF):
            pass
    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("opened")]
    assert len(opened) == 2
    assert opened[0].startswith("opened memory:// (new database) as writer epoch 1 in ")
    assert "replayed 0 WAL SSTs" in opened[0]
    assert opened[1].startswith("opened memory:// as writer epoch 2 in ")
    # The first writer's fencing SST and its two puts.
    assert "replayed 3 WAL SSTs (2 keys; wal_id_last_compacted=0), next WAL id 5" in opened[1]


@pytest.mark.parametrize("compactor", ["in-process", "off"])
def test_an_unclosed_db_warns_when_collected_and_keeps_its_writes(compactor: str) -> None:
    store = open_store("memory://")
    settings = Settings(compactor=compactor, flush_interval=3600)  # type: ignore[arg-type]
    db = Db.open(store, settings=settings)
    db.put(b"k", b"unawaited", await_durable=False)
    with pytest.warns(ResourceWarning, match="garbage-collected without close"):
        del db
        gc.collect()
    with Db.open(store, settings=OFF) as again:
        assert again.get(b"k") == b"unawaited"  # closing on collection flushed it


def test_a_closed_or_failed_db_does_not_warn() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=OFF) as db:
        db.put(b"k", b"v")
    del db
    gc.collect()  # filterwarnings=error: a ResourceWarning here would fail the test
