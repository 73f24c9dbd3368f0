"""``Db.close()`` lets the in-process compactor finish what is pending, for at most
``Settings.close_compaction_wait`` seconds (issue 33): the next open then reads SSTs, not a WAL
replayed into memory, whatever the compactor's interval had reached when the writer closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import WalToL0
from slatepy.store import open_store


def write_and_close(url: str, wait: float) -> None:
    # A compaction interval of an hour: only the close can make the compactor run.
    settings = Settings(
        compaction_interval=3600, compactor_lease=3 * 3600, close_compaction_wait=wait
    )
    db = Db.open(url, settings=settings)
    for first in range(0, 3000, 500):
        batch = WriteBatch()
        for i in range(first, first + 500):
            batch.put(b"key%06d" % i, b"v" * 50)
        db.write(batch)
    db.close()


def reopened(url: str) -> tuple[int, int, int]:
    """WAL SSTs replayed, L0 SSTs and sorted runs of a reopened writer."""
    with Db.open(url, settings=Settings(compactor="off")) as db:
        assert db.get(b"key002999") == b"v" * 50
        assert sum(1 for _ in db.scan()) == 3000
        return db.replayed_ssts, len(db._view.l0), len(db._view.sorted_runs)


def test_close_finishes_pending_compaction(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    write_and_close(url, wait=60)
    replayed, l0, runs = reopened(url)
    assert replayed == 0 and l0 + runs >= 1


def test_close_without_a_wait_abandons_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    write_and_close(url, wait=0)
    replayed, l0, runs = reopened(url)
    assert replayed >= 1 and l0 + runs == 0


def test_the_wait_is_checked() -> None:
    from slatepy import InvalidArgument

    with pytest.raises(InvalidArgument, match="close_compaction_wait"):
        Settings(close_compaction_wait=-1).validate()


def test_close_merges_l0_below_the_trigger(tmp_path: Path) -> None:
    """Three L0 SSTs, fewer than ``l0_trigger`` (4): a running writer leaves them, but a close
    merges them into one sorted run, so the next process's gets and scans ask one source
    (issue 33: reads after a reopen must not depend on where compaction was)."""
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=Settings(compactor="off")) as db:
        compactor = Compactor(open_store(url))
        for round_ in range(3):
            batch = WriteBatch()
            for i in range(round_, 3000, 3):
                batch.put(b"key%06d" % i, b"v" * 50)
            db.write(batch)
            assert isinstance(compactor.run_once(), WalToL0)  # one more L0 SST
        compactor.release()
    replayed, l0, runs = reopened(url)
    assert (replayed, l0, runs) == (0, 3, 0)
    # A writer that compacts only when closing (an hour's interval) and writes nothing.
    settings = Settings(compaction_interval=3600, compactor_lease=3 * 3600)
    Db.open(url, settings=settings).close()
    assert reopened(url) == (0, 0, 1)
