"""A scan keeps ``Settings.scan_requests_in_flight`` ranged GETs in flight ahead of what it
decodes (issue 33: through a slow store, bandwidth is requests per round trip), never more."""

from __future__ import annotations

import threading

import pytest

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import WrappingStore

KEYS = 12_000


class GatedReads(WrappingStore):
    """While ``gated``, a read-ahead thread's ranged GET of a compacted SST waits until
    ``target`` of them are in flight together (or 5 s pass: then the test fails on the
    count), so the most a scan can have in flight is reached deterministically; ``most``
    records it (the scanning thread's own GETs count too, and are not held)."""

    def __init__(self, inner: ObjectStore, target: int) -> None:
        super().__init__(inner)
        self.target = target
        self.gated = False
        self.in_flight = 0
        self.most = 0
        self._reached = False
        self._cond = threading.Condition()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if not (self.gated and path.startswith("compacted/")):
            return self.inner.get_range(path, start, end)
        with self._cond:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self._reached = self._reached or self.in_flight >= self.target
            self._cond.notify_all()
            if threading.current_thread().name.startswith("slatepy-read-ahead"):
                self._cond.wait_for(lambda: self._reached, timeout=5)
        try:
            return self.inner.get_range(path, start, end)
        finally:
            with self._cond:
                self.in_flight -= 1


@pytest.mark.parametrize("in_flight", [1, 3])
def test_a_scan_keeps_the_set_number_of_requests_in_flight(in_flight: int) -> None:
    gate = GatedReads(open_store("memory://"), in_flight)
    off = Settings(compactor="off")
    with Db.open(gate, settings=off) as db:
        for first in range(0, KEYS, 1000):
            batch = WriteBatch()
            for i in range(first, first + 1000):
                batch.put(b"key%08d" % i, b"v" * 100)
            db.write(batch)
    # One SST: no other SST's top level is opened in the background during the scan.
    Compactor(gate, settings=off, policy=CompactionPolicy(l0_trigger=1)).run_until_idle()
    settings = Settings(
        compactor="off",
        scan_read_ahead_bytes=64 * 1024,  # chunks of one 64 KiB GET: ~25 of them
        scan_requests_in_flight=in_flight,
    )
    with DbReader.open(gate, settings=settings) as reader:
        assert len(reader._view.sorted_runs[0].ssts) == 1 and not reader._view.l0
        before = reader.metrics.requests("get_range")
        gate.gated = True
        rows = sum(1 for _ in reader.scan())
        gate.gated = False
        assert rows == KEYS
        assert gate.most == in_flight
        # ~1.5 MB of blocks in 64 KiB GETs (and a partition or two): read ahead, not again.
        assert 20 <= reader.metrics.requests("get_range") - before <= 40


def test_the_setting_is_checked() -> None:
    from slatepy import InvalidArgument

    with pytest.raises(InvalidArgument, match="scan_requests_in_flight"):
        Settings(scan_requests_in_flight=0).validate()
