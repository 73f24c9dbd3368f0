"""What an idle reader and an idle writer cost in requests, and that activity still shows fast.

Issue 15's targets at default settings are about one request a second for a reader and a
fifth of one for a writer with its compactor, with no LIST more often than every 10 s. Here
the same shape runs on scaled intervals (tens of milliseconds instead of seconds), counted on
a wrapper that records every request: polls back off while nothing changes, cost next to
nothing while idle, and snap back to the base interval as soon as something is written.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest

from slatepy import Db, DbReader, Settings
from slatepy.compactor.background import IDLE_MANIFEST_LOOK
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import POLL_PROBES, ManifestStore
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.store.polling import IdleBackoff
from slatepy.store.url import open_store

Request = tuple[float, str, str]
"""``(monotonic time, kind, path or prefix)``."""


class Recording(WrappingStore):
    """Records every request that reaches the store."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def _note(self, kind: str, path: str) -> None:
        with self._lock:
            self.requests.append((time.monotonic(), kind, path))

    def since(self, start: float, kind: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r[0] >= start and kind in (None, r[1])]

    def get(self, path: str) -> bytes:
        self._note("get", path)
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._note("get", path)
        return self.inner.get_range(path, start, end)

    def head(self, path: str) -> ObjectMeta:
        self._note("head", path)
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self._note("put", path)
        return self.inner.put(path, data, mode=mode)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self._note("list", prefix)
        return self.inner.list(prefix, offset=offset)

    def delete(self, path: str) -> None:
        self._note("delete", path)
        self.inner.delete(path)


def wait_until(condition: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``condition()`` held (polled every 5 ms); fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.005)
    return time.monotonic() - start


def test_backoff_doubles_to_the_ceiling_and_snaps_back() -> None:
    backoff = IdleBackoff(0.1, 1.0)
    assert [backoff.polled(changed=False) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.idle
    assert backoff.polled(changed=True) == 0.1 and not backoff.idle
    backoff.polled(changed=False)
    assert backoff.activity() is True and backoff.current == 0.1
    assert backoff.activity() is False  # not idle: nobody needs waking


READER = Settings(
    compactor="off",
    reader_poll_interval=0.02,
    reader_max_poll_interval=0.32,
    reader_snapshot_ttl=3600,  # no renewal inside the test
)


def test_an_idle_reader_backs_off_to_two_gets_per_ceiling_and_never_lists() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=READER) as db:
        db.put(b"k", b"v")
        recording = Recording(store)
        with DbReader.open(recording, settings=READER) as reader:
            opened = time.monotonic()
            time.sleep(1.5)  # 0.02 -> 0.32 s takes 0.6 s, then ~3 polls at the ceiling
            requests = recording.since(opened)
            assert reader.get(b"k") == b"v"
    kinds = {kind for _, kind, _ in requests}
    assert kinds == {"get"}, f"an idle poll only GETs the next WAL SST and manifest: {kinds}"
    polls = sorted({round(t, 3) for t, _, path in requests if path.startswith("wal/")})
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    # Each poll waits about twice as long as the one before, up to the ceiling.
    assert len(polls) <= 10, f"{len(polls)} polls in 1.5 s: no back-off ({gaps})"
    assert gaps[-1] >= 0.25, gaps
    assert all(b >= a * 1.4 for a, b in itertools.pairwise(gaps[:4])), gaps
    # Without the back-off the same 1.5 s would have cost 2 LISTs every 20 ms: 150 of them.
    assert len(requests) <= 2 * len(polls) + 2


def test_a_reader_sees_writes_at_the_base_interval_again_after_idling() -> None:
    settings = Settings(
        compactor="off",
        reader_poll_interval=0.02,
        reader_max_poll_interval=1.0,
        reader_snapshot_ttl=3600,
    )
    store = open_store("memory://")
    with Db.open(store, settings=settings) as db, DbReader.open(store, settings=settings) as reader:
        db.put(b"warm", b"up")
        wait_until(lambda: reader.get(b"warm") == b"up", 5)
        time.sleep(2.5)  # idle: the interval is at its 1 s ceiling now
        assert reader._backoff.current == 1.0
        db.put(b"first", b"1")  # durable: its WAL SST exists when put returns
        assert wait_until(lambda: reader.get(b"first") == b"1", 3) <= 1.0 + 0.5
        # The poll that found it brought the interval back to the base: the next writes show
        # within a base interval plus a GET, far below the ceiling.
        lags = []
        for i in range(5):
            db.put(b"next%d" % i, b"v")
            lags.append(wait_until(lambda i=i: reader.get(b"next%d" % i) == b"v", 3))
    assert max(lags) < 0.4, lags


WRITER = Settings(
    compaction_interval=0.05,
    compaction_max_interval=0.4,
    compactor_lease=1.0,
    gc_interval=0.1,
    gc_max_interval=0.8,
)


def test_an_idle_writer_with_its_compactor_backs_off_and_wakes_on_the_next_write() -> None:
    recording = Recording(open_store("memory://"))
    with Db.open(recording, settings=WRITER) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"v")
        compactor = db._compactor
        assert compactor is not None
        wait_until(lambda: db.wal_id_last_compacted >= db.next_wal_id - 1, 5)
        time.sleep(1.5)  # compaction 0.05 -> 0.4 s, GC 0.1 -> 0.8 s
        assert compactor.backoff.current == 0.4
        start, passes = time.monotonic(), compactor.passes
        time.sleep(2.0)
        idle = recording.since(start)
        idle_passes = compactor.passes - passes
        # One compaction pass per 0.4 s, each a manifest GET and a WAL HEAD; the LISTs are
        # GC passes', one per 0.8 s at most.
        assert idle_passes <= 2.0 / 0.4 + 2, idle_passes
        assert len(recording.since(start, "head")) <= idle_passes
        # Only every IDLE_MANIFEST_LOOK-th idle pass looks for a newer manifest.
        looks = [r for r in recording.since(start, "get") if r[2].startswith("manifest/")]
        assert len(looks) <= idle_passes // IDLE_MANIFEST_LOOK + 2, (looks, idle_passes)
        lists = recording.since(start, "list")
        # A pass's LISTs come within milliseconds, passes at least gc_interval (0.1 s) apart
        # (counting distinct times rounded to 10 ms split a pass that straddled a boundary).
        times = sorted(t for t, _, _ in lists)
        gaps = [t - before for before, t in zip([-1.0, *times[:-1]], times, strict=True)]
        gc_passes = sum(gap > 0.05 for gap in gaps)
        assert gc_passes <= 2.0 / 0.8 + 1, f"GC did not back off: {lists}"
        # Before: at the base intervals, 2 LISTs per 50 ms compaction pass alone.
        assert len(idle) < 2.0 / 0.05, f"{len(idle)} requests in 2 s of idling"

        # A write ends the idle spell: compacted within a few base intervals, not a ceiling.
        wal_before = db.wal_id_last_compacted
        written = time.monotonic()
        db.put(b"again", b"v")
        wait_until(lambda: db.wal_id_last_compacted > wal_before, 2)
        assert time.monotonic() - written < 0.35
        assert compactor.backoff.current < 0.4


def test_the_compactor_ceiling_is_capped_at_half_the_lease() -> None:
    settings = Settings(compaction_max_interval=60.0, compactor_lease=10.0)
    with Db.open("memory://", settings=settings) as db:
        assert db._compactor is not None
        assert db._compactor.backoff.ceiling == 5.0


def manifests_with(store: ObjectStore, count: int) -> ManifestStore:
    writer = ManifestStore(store)
    for _ in range(count):
        writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    return writer


def test_manifest_poll_probes_with_gets_and_lists_only_when_it_must() -> None:
    recording = Recording(open_store("memory://"))
    writer = manifests_with(recording.inner, 3)
    poller = ManifestStore(recording, probe_window=60.0)
    assert poller.poll() is not None  # nothing known yet: lists
    assert [k for _, k, _ in recording.requests].count("list") == 1

    start = time.monotonic()
    stored = poller.poll()
    assert stored is not None and stored.id == 3
    assert [(k, p) for _, k, p in recording.since(start)] == [("get", poller.path(4))]

    writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    start = time.monotonic()
    stored = poller.poll()
    assert stored is not None and stored.id == 4 and stored.manifest.writer_epoch == 4
    assert [(k, p) for _, k, p in recording.since(start)] == [
        ("get", poller.path(4)),
        ("get", poller.path(5)),
    ]

    # A busy database: after POLL_PROBES new manifests in a row, one listing catches up.
    for _ in range(POLL_PROBES + 3):
        writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    start = time.monotonic()
    stored = poller.poll()
    assert stored is not None and stored.id == 4 + POLL_PROBES + 3
    assert [k for _, k, _ in recording.since(start)].count("list") == 1


def test_manifest_poll_lists_once_the_probe_window_passed() -> None:
    """A missing next manifest may have been written and collected since the last look if
    that look is older than the collector's grace period: then only a listing tells."""
    store = open_store("memory://")
    writer = manifests_with(store, 2)
    poller = ManifestStore(store, probe_window=0.2)
    assert poller.poll() is not None
    for _ in range(3):
        writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    for manifest_id in (3, 4):  # collected: superseded long enough for a collector
        store.delete(poller.path(manifest_id))
    time.sleep(0.25)
    stored = poller.poll()
    assert stored is not None and stored.id == 5

    never_trusting = ManifestStore(store)  # probe_window 0: every poll lists
    assert never_trusting.poll() is not None
    writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    writer.update(lambda m, _: Manifest(writer_epoch=m.writer_epoch + 1))
    store.delete(poller.path(6))
    stored = never_trusting.poll()
    assert stored is not None and stored.id == 7


def test_a_collector_reads_each_active_manifest_once_across_passes() -> None:
    """Every pass reads all manifests superseded within gc_min_age; they never change, so
    a long-lived collector (the in-process one) reads each one once."""
    from slatepy.gc import GarbageCollector

    recording = Recording(open_store("memory://"))
    manifests_with(recording, 30)
    collector = GarbageCollector(recording, settings=Settings())
    collector.collect()
    start = time.monotonic()
    collector.collect()
    again = [p for _, kind, p in recording.since(start, "get") if p.startswith("manifest/")]
    assert again == [], again


def test_gc_waits_for_the_first_held_object_to_become_collectable_not_a_whole_back_off() -> None:
    import datetime as dt

    from slatepy.compactor.background import _gc_wait
    from slatepy.gc import GcReport
    from slatepy.gc.holds import Hold

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def report(*in_seconds: float, deleted: bool = False) -> GcReport:
        holds = tuple(
            Hold("wal/x", 1, "min_age", "WAL", now + dt.timedelta(seconds=s)) for s in in_seconds
        )
        deletions = [object()] if deleted else []
        return GcReport(1, [1], deletions, holds=holds, now=now)  # type: ignore[arg-type]

    backoff = IdleBackoff(60.0, 600.0)
    assert _gc_wait(report(), backoff) == 120.0  # nothing deleted, nothing waiting: back off
    assert _gc_wait(report(300.0, 900.0), backoff) == 240.0  # the back-off comes first
    assert _gc_wait(report(100.0), backoff) == 100.0  # then the first held object
    assert _gc_wait(report(5.0), backoff) == 60.0  # never more often than gc_interval
    assert _gc_wait(report(5.0, deleted=True), backoff) == 60.0
