"""``Db.close()`` lets the in-process compactor finish what is pending, for at most
``Settings.close_compaction_wait`` seconds (issue 33): the next open then reads SSTs, not a WAL
replayed into memory, whatever the compactor's interval had reached when the writer closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, WalToL0
from slatepy.store import ObjectStore, open_store
from slatepy.table.layout import compacted_path
from slatepy.testing.intercept import InterceptStore


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


def reopened(url: str | ObjectStore, keys: int = 3000) -> tuple[int, int, int]:
    """WAL SSTs replayed, L0 SSTs and sorted runs of a reopened writer."""
    with Db.open(url, settings=Settings(compactor="off")) as db:
        assert db.get(b"key%06d" % (keys - 1)) == b"v" * 50
        assert sum(1 for _ in db.scan()) == keys
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


class HeldRunReads(InterceptStore):
    """Reads of the SSTs in ``held`` wait ``hold`` seconds (the first one only: enough to
    outlast the close's wait, and the merge then meets its cancellation at its next progress
    check); ``reads`` counts them, i.e. closes whose merge took the run along."""

    def __init__(self, inner: ObjectStore, hold: float) -> None:
        super().__init__(inner, before_read=self._read)
        self.hold = hold
        self.held: set[str] = set()
        self.reads = 0

    def _read(self, path: str) -> None:
        if path in self.held:
            self.reads += 1
            if self.reads == 1:
                time.sleep(self.hold)


def write_l0(db: Db, compactor: Compactor, keys: range) -> None:
    batch = WriteBatch()
    for i in keys:
        batch.put(b"key%06d" % i, b"v" * 50)
    db.write(batch)
    assert isinstance(compactor.run_once(), WalToL0)


def test_a_close_takes_along_only_runs_its_wait_can_merge() -> None:
    """Two L0 SSTs and a run four times their size: size-tiering merges them together, but
    with a wait that fits only L0 (at ``close_merge_rate``), a close that took the run along
    would be abandoned, and so would every later close, each rewriting it in vain. The close
    merges L0 alone instead, in time, and the next close has nothing left to redo."""
    wait = 2.0
    store = HeldRunReads(open_store("memory://"), hold=2 * wait)
    with Db.open(store, settings=Settings(compactor="off")) as db:
        compactor = Compactor(store, policy=CompactionPolicy(l0_trigger=1))
        write_l0(db, compactor, range(0, 40_000, 1))
        assert isinstance(compactor.run_once(), L0ToRun)  # the run
        write_l0(db, compactor, range(0, 40_000, 7))
        write_l0(db, compactor, range(3, 40_000, 7))
        compactor.release()
        manifest = compactor.last_published.manifest
        (run,) = manifest.sorted_runs
        l0_bytes = sum(h.object_size for h in manifest.l0)
        run_bytes = sum(h.object_size for h in run.ssts)
    assert l0_bytes < run_bytes <= 4 * l0_bytes  # size-tiering would take the run along
    held = {compacted_path(h.id) for h in run.ssts}
    # A merge rate at which the wait fits L0 and half the run: not the run.
    rate = int((l0_bytes + run_bytes / 2) / wait)
    settings = Settings(
        compaction_interval=3600,
        compactor_lease=3 * 3600,
        close_compaction_wait=wait,
        close_merge_rate=rate,
    )
    for _ in range(2):
        store.held = held
        Db.open(store, settings=settings).close()
        store.held = set()
        assert reopened(store, keys=40_000) == (0, 0, 2)
    assert store.reads == 0


class RunReadsUntil(HeldRunReads):
    """Reads of the SSTs in ``held`` from a background thread wait until ``until()`` is true
    (or ``hold`` seconds pass); ``entered`` is set once one waits."""

    def __init__(self, inner: ObjectStore, hold: float) -> None:
        super().__init__(inner, hold)
        self.until: Callable[[], bool] = lambda: False
        self.entered = threading.Event()

    def _read(self, path: str) -> None:
        if path not in self.held or threading.current_thread() is threading.main_thread():
            return
        self.reads += 1
        self.entered.set()
        deadline = time.monotonic() + self.hold
        while not self.until() and time.monotonic() < deadline:
            time.sleep(0.01)


def test_a_close_stops_a_running_merge_it_cannot_wait_for_and_merges_l0_alone() -> None:
    """The running compactor began merging L0 (at ``l0_trigger``) with a run the close's wait
    cannot merge: the close stops it at once and merges L0 alone instead, within its wait,
    rather than waiting it out to abandon it (and leave L0 for the next process to begin
    the same merge again)."""
    wait = 3.0
    store = RunReadsUntil(open_store("memory://"), hold=2 * wait)
    with Db.open(store, settings=Settings(compactor="off")) as db:
        compactor = Compactor(store, policy=CompactionPolicy(l0_trigger=1))
        write_l0(db, compactor, range(0, 40_000))
        assert isinstance(compactor.run_once(), L0ToRun)  # the run
        for first in range(4):  # l0_trigger L0 SSTs
            write_l0(db, compactor, range(first, 40_000, 4))
        compactor.release()
        manifest = compactor.last_published.manifest
        (run,) = manifest.sorted_runs
        l0_bytes = sum(h.object_size for h in manifest.l0)
        run_bytes = sum(h.object_size for h in run.ssts)
    assert run_bytes <= 4 * l0_bytes  # size-tiering takes the run along
    store.held = {compacted_path(h.id) for h in run.ssts}
    settings = Settings(
        compaction_interval=0.01,
        close_compaction_wait=wait,
        close_merge_rate=int((l0_bytes + run_bytes / 2) / wait),
    )
    db = Db.open(store, settings=settings)
    assert db._compactor is not None
    running = db._compactor.compactor
    store.until = lambda: getattr(running, "_close_by", None) is not None
    assert store.entered.wait(10)  # the running compactor is merging the run along
    started = time.monotonic()
    db.close()
    assert time.monotonic() - started < wait
    store.held = set()
    assert reopened(store, keys=40_000) == (0, 0, 2)
