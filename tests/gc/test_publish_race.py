"""A compactor's publishing manifest PUT racing the garbage collector (RFC 0003, defect 10).

A compactor checks its deadline (``gc_min_age / 2``) and then PUTs the manifest that
references its outputs. However slow that PUT is, GC must never delete an output the manifest
that lands references. Time is a fake clock (real time plus an offset) shared by the
compactor and the collector, so "gc_min_age passes while the PUT is in flight" takes no
sleeping and is deterministic.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import msgspec

from slatepy import Db, Settings
from slatepy.compactor import Compactor
from slatepy.errors import CompactionAbandoned, NotFound, SlatepyError
from slatepy.gc import GarbageCollector, GcReport
from slatepy.manifest.store import MANIFEST_DIR, ManifestStore
from slatepy.store import ObjectStore
from slatepy.store.twophase import TwoPhaseStore
from slatepy.table.layout import compacted_path
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend

MIN_AGE = 60.0


class FakeClock:
    """Real time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.time(), dt.UTC)


def race_settings(backend: Backend) -> Settings:
    return msgspec.structs.replace(backend.settings, gc_min_age=MIN_AGE)


def write_keys(backend: Backend, settings: Settings) -> dict[bytes, bytes]:
    model = {b"key%03d" % i: b"value-%03d" % i * 4 for i in range(40)}
    with Db.open(backend.target(), settings=settings) as db:
        for key, value in model.items():
            db.put(key, value, await_durable=False)
        db.flush()
    return model


def compacted(store: ObjectStore) -> set[str]:
    return {m.path for m in store.list("compacted/") if m.path.endswith(".sst")}


def assert_whole(
    backend: Backend, store: ObjectStore, settings: Settings, model: dict[bytes, bytes]
) -> None:
    """Every SST the current manifest references exists, and every key reads back."""
    stored = ManifestStore(store).load()
    assert stored is not None
    m = stored.manifest
    missing = set()
    for handle in (*m.l0, *(h for run in m.sorted_runs for h in run.ssts)):
        try:
            store.head(compacted_path(handle.id))
        except NotFound:
            missing.add(compacted_path(handle.id))
    assert not missing, f"manifest {stored.id} references deleted SSTs {missing}"
    with Db.open(store, settings=settings) as db:
        assert {k: db.get(k) for k in model} == model
        assert dict(db.scan()) == model
    if isinstance(store, TwoPhaseStore):
        store.drain()  # no two-phase completion outlives the test (and the moto server)


def test_gc_during_a_stalled_publishing_put_deletes_nothing_it_publishes(
    backend: Backend,
) -> None:
    """The publishing PUT stalls after the deadline check; gc_min_age passes and GC runs."""
    settings = race_settings(backend)
    store = backend.store()
    model = write_keys(backend, settings)
    clock = FakeClock()
    intercept = InterceptStore(store)
    compactor = Compactor(intercept, settings=settings, clock=clock.time)
    outputs: set[str] = set()
    reports: list[GcReport] = []

    def stall_publish(path: str) -> None:
        if path.startswith(MANIFEST_DIR + "/") and not reports:
            outputs.update(compacted(store))
            clock.offset += MIN_AGE + 1  # the PUT is that slow
            gc = GarbageCollector(store, settings=settings, clock=clock.now)
            reports.append(gc.collect())

    intercept.before_put = stall_publish
    abandoned = False
    try:
        compactor.run_once()
    except CompactionAbandoned:
        abandoned = True
    (report,) = reports
    assert outputs, "the compactor wrote outputs before its publishing PUT"
    # GC really did judge the (old, unreferenced) outputs garbage while the PUT was stalled.
    assert outputs <= {d.path for d in report.deletions}
    assert_whole(backend, store, settings, model)
    # Its PUT lost the compare-and-swap to GC's fence; the retry found the outputs too old.
    assert abandoned


def test_a_publish_landing_between_gc_decision_and_deletion_is_kept(backend: Backend) -> None:
    """GC decides to delete the outputs; the stalled publish lands before GC deletes them."""
    settings = race_settings(backend)
    store = backend.store()
    model = write_keys(backend, settings)
    clock = FakeClock()
    intercept = InterceptStore(store)
    compactor = Compactor(intercept, settings=settings, clock=clock.time)
    stalled, release = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def stall_publish(path: str) -> None:
        if path.startswith(MANIFEST_DIR + "/") and not stalled.is_set():
            stalled.set()
            assert release.wait(60)

    def compact() -> None:
        try:
            result["plan"] = compactor.run_once()
        except SlatepyError as exc:
            result["error"] = exc

    intercept.before_put = stall_publish
    thread = threading.Thread(target=compact)
    thread.start()
    try:
        assert stalled.wait(60), "the compactor never reached its publishing PUT"
        outputs = compacted(store)
        clock.offset += MIN_AGE + 1
        gc_store = InterceptStore(store)

        def land_publish_first(path: str) -> None:
            # GC has chosen what to delete and is about to write a manifest: let the stalled
            # publish land first.
            if path.startswith(MANIFEST_DIR + "/") and not release.is_set():
                release.set()
                thread.join(60)

        gc_store.before_put = land_publish_first
        report = GarbageCollector(gc_store, settings=settings, clock=clock.now).collect()
    finally:
        release.set()
        thread.join(60)
    assert "error" not in result, result
    assert result["plan"] is not None  # published: its deadline check passed before GC ran
    assert_whole(backend, store, settings, model)
    # GC had chosen the outputs (old, unreferenced by the manifest it read), then spared them.
    assert outputs and not outputs & {d.path for d in report.deletions}
    assert report.fence_manifest == report.current_manifest + 2
