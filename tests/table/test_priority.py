"""Foreground priority (``slatepy.table.priority``): a durable write holds the process's gate
while it waits for its WAL SST, and background compaction pauses at its yield points while
the gate is held, for a bounded time (issue 33 item 2)."""

from __future__ import annotations

import threading
import time

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.outputs import OutputWriter
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.store.url import open_store
from slatepy.table import priority
from slatepy.table.priority import FOREGROUND, Foreground


def test_yield_returns_at_once_without_a_foreground_wait() -> None:
    gate = Foreground()
    start = time.monotonic()
    for _ in range(100):
        gate.yield_to(1.0)
    assert time.monotonic() - start < 0.5
    assert gate.pauses == 0


def test_yield_points_hand_the_gil_off_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(priority.time, "sleep", sleeps.append)
    gate = Foreground()
    for _ in range(5):
        gate.yield_to()
    assert sleeps == [0] * 5
    for _ in range(5):
        gate.yield_to(hand_off=False)
    assert len(sleeps) == 5


def test_a_closing_writers_compactions_do_not_hand_the_gil_off(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-off is a timed sleep (10-14% of a compaction's wall time): a compaction hands
    off at its yield points while its writer runs, and not once the writer is closing."""
    url = f"file://{tmp_path}/db"
    settings = Settings(compactor="off")
    asked: list[bool] = []

    def yield_to(max_wait: float = priority.PAUSE_MAX, *, hand_off: bool = True) -> None:
        asked.append(hand_off)

    monkeypatch.setattr(FOREGROUND, "yield_to", yield_to)
    with Db.open(url, settings=settings) as db:
        compactor = Compactor(open_store(url), settings=settings)
        for closing in (False, True):
            batch = WriteBatch()
            for i in range(3000):
                batch.put(b"key%06d" % i, b"v" * 100)
            db.write(batch)
            if closing:
                compactor.closing(time.monotonic() + 60.0)
            asked.clear()
            assert compactor.run_once() is not None
            assert asked and set(asked) == {not closing}, closing


def test_background_waits_while_the_gate_is_held_and_resumes_when_it_ends() -> None:
    gate = Foreground()
    resumed = threading.Event()

    def background() -> None:
        gate.yield_to(30.0)
        resumed.set()

    with gate:
        thread = threading.Thread(target=background)
        thread.start()
        deadline = time.monotonic() + 30.0
        while gate.pauses == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.pauses == 1
        assert not resumed.wait(0.2)  # paused while the foreground wait is open
    assert resumed.wait(5.0)  # and resumes as soon as it ends, long before 30 s
    thread.join()
    assert gate.active == 0


def test_a_pause_is_bounded() -> None:
    gate = Foreground()
    with gate, gate:  # counts: nested and shared holds
        assert gate.active == 2
        start = time.monotonic()
        gate.yield_to(0.05)
        assert 0.04 <= time.monotonic() - start < 2.0
    assert gate.active == 0


class HeldWalPuts(WrappingStore):
    """Holds the first WAL PUT once ``armed`` until ``release``; records whether the gate
    was held while it waited."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.armed = False
        self.reached = threading.Event()
        self.release = threading.Event()
        self.gate_held = -1

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> ObjectMeta:
        if self.armed and path.startswith("wal/") and not self.reached.is_set():
            self.gate_held = FOREGROUND.active
            self.reached.set()
            assert self.release.wait(30.0)
        return self.inner.put(path, data, mode=mode)


def test_an_awaited_write_holds_the_gate_and_a_compaction_meanwhile_pauses_and_finishes(
    tmp_path: object,
) -> None:
    """The engine end to end: an awaited batch holds the gate until its WAL SST is written;
    a compaction running meanwhile pauses at its yield points (bounded) and still finishes,
    and the write is durable and read back."""
    store = HeldWalPuts(open_store(f"file://{tmp_path}/db", create=True))
    settings = Settings(compactor="off")
    db = Db.open(store, settings=settings)
    try:
        for round_ in range(3):  # WAL for the compaction to merge (columnar path)
            batch = WriteBatch()
            for i in range(3000):
                batch.put(b"key%06d" % i, b"v%d" % round_ * 20)
            db.write(batch)
        assert FOREGROUND.active == 0
        store.armed = True
        writer = threading.Thread(target=db.put, args=(b"late", b"value"))
        writer.start()
        assert store.reached.wait(30.0)
        assert store.gate_held == 1  # the awaited put holds the gate while its PUT is out
        pauses = FOREGROUND.pauses
        start = time.monotonic()
        assert Compactor(store.inner, settings=settings).run_once() is not None
        assert time.monotonic() - start < 20.0  # bounded pauses: it did not wait for the put
        assert FOREGROUND.pauses > pauses  # it did pause at its yield points
        store.release.set()
        writer.join(30.0)
        assert FOREGROUND.active == 0
        assert db.get(b"late") == b"value"
    finally:
        store.release.set()
        db.close()
    with Db.open(f"file://{tmp_path}/db", settings=settings) as again:
        assert again.get(b"late") == b"value"
        assert again.get(b"key002999") == b"v2" * 20


def test_outputs_yield_through_the_gate(tmp_path: object) -> None:
    """OutputWriter's yield points are the gate's (one per bulk add)."""
    store = open_store(f"file://{tmp_path}/s", create=True)
    writer = OutputWriter(
        store,
        CompactionPolicy(),
        drop_tombstones=False,
        block_size=4096,
        bloom_bits_per_key=10,
        compression="none",
        compression_level=0,
    )
    pauses = FOREGROUND.pauses
    with FOREGROUND:
        writer.add_plain([b"a", b"b"], [2, 2], [b"1", b"2"])
    assert FOREGROUND.pauses == pauses + 1
    assert len(writer.finish(())) == 1


def test_under_overlapping_waits_a_pause_ends_when_one_of_them_ends() -> None:
    """Two writers' waits overlap, so the gate is never free: the background pauses only
    until the first of them ends, not for the whole bound (review: with several threads
    writing, every yield point cost PAUSE_MAX and compaction ran 11x slower)."""
    gate = Foreground()
    gate.__enter__()
    gate.__enter__()
    timer = threading.Timer(0.05, gate.__exit__, (None, None, None))
    timer.start()
    start = time.monotonic()
    gate.yield_to(max_wait=5.0)
    waited = time.monotonic() - start
    timer.join()
    gate.__exit__(None, None, None)
    assert gate.active == 0 and 0.03 <= waited < 2.0
