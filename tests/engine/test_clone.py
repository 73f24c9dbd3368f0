"""Clones (RFC 0017): a new database sharing its source's SSTs. Writing to, compacting and
collecting the clone never touches the source; the source's GC keeps what the clone shares
while the clone's checkpoint exists."""

from __future__ import annotations

import datetime as dt
import uuid

import msgspec
import pytest

from slatepy import AlreadyExists, Db, DbReader, InvalidArgument, NotFound, clone
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.clone import with_external
from slatepy.errors import StoreUnavailable
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.table.layout import compacted_path
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend

SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=4, target_sst_bytes=2000)


def elsewhere(backend: Backend) -> str:
    """A second, empty location on the backend of ``backend``."""
    if backend.name == "memory":
        pytest.skip("a clone reads its source by URL; memory:// cannot be reopened by URL")
    return f"{backend.url.rsplit('/', 1)[0]}/clone-{uuid.uuid4().hex[:8]}"


def listing(store: ObjectStore) -> dict[str, tuple[int, dt.datetime]]:
    return {m.path: (m.size, m.last_modified) for m in store.list("")}


def fill(db: Db, tag: bytes, keys: range) -> dict[bytes, bytes]:
    model = {b"key%03d" % i: tag + b"-%d" % i * 5 for i in keys}
    for key, value in model.items():
        db.put(key, value, await_durable=False)
    db.flush()
    return model


def compact_and_collect(store: ObjectStore, backend: Backend) -> None:
    """Compact everything (reading a clone's shared SSTs where they live), then two GC passes
    with gc_min_age 0: the second collects the manifest the first decided on."""
    Compactor(
        with_external(store, backend.settings), settings=backend.settings, policy=SMALL
    ).run_until_idle()
    gc = GarbageCollector(store, settings=backend.settings, min_age=0)
    gc.collect()
    gc.collect()


def newest(store: ObjectStore) -> int:
    stored = ManifestStore(store).load()
    assert stored is not None
    return stored.id


def shared_ids(store: ObjectStore) -> set[str]:
    stored = ManifestStore(store).load()
    assert stored is not None
    return {i for e in stored.manifest.external_dbs for i in e.sst_ids}


def test_a_clone_reads_its_source_and_writing_to_it_never_changes_the_source(
    backend: Backend,
) -> None:
    src = backend.store()
    with Db.open(backend.target(), settings=backend.settings) as db:
        model = fill(db, b"src", range(60))
        compact_and_collect(src, backend)
        model |= fill(db, b"wal", range(5))  # not compacted: the clone copies this WAL
        dst_url = elsewhere(backend)
        made = clone(backend.url, dst_url, settings=backend.settings)
        assert made.name == f"clone:{dst_url}" and made.expire_time is None
        dst = open_store(dst_url, backend.settings)
        shared = shared_ids(dst)
        assert shared and all(src.head(compacted_path(i)) for i in shared)
        assert not [m for m in dst.list("compacted/")]  # nothing compacted was copied
        before = listing(src)

        with Db.open(dst_url, settings=backend.settings) as copy:
            assert dict(copy.scan()) == model
            mine = fill(copy, b"clone", range(30, 90))
            copy.delete(b"key000")
            compact_and_collect(dst, backend)
            expected = {k: v for k, v in (model | mine).items() if k != b"key000"}
            assert dict(copy.scan()) == expected
        # The source: not one object written, changed or deleted under its location by the
        # clone's writes, compaction and GC, and its data unchanged, but for the one manifest
        # update that released the clone's checkpoint (its compactions rewrote every SST it
        # shared, and GC found that no manifest of the clone reads them).
        after = listing(src)
        assert {p: v for p, v in after.items() if p in before} == before
        assert [p for p in after if p not in before] == [ManifestStore(src).path(newest(src))]
        assert not shared_ids(dst) and db.list_checkpoints() == []
        assert dict(db.scan()) == model
        # The clone reopens (a new writer, a reader) and reads its own state.
        with Db.open(dst_url, settings=backend.settings) as copy:
            assert dict(copy.scan()) == expected
        with DbReader.open(dst_url, settings=backend.settings) as reader:
            assert dict(reader.scan()) == expected
            assert reader.get(b"key001") == model[b"key001"]


def test_source_gc_keeps_shared_ssts_while_the_clone_checkpoint_exists(
    backend: Backend,
) -> None:
    src = backend.store()
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model = fill(db, b"src", range(60))
        compact_and_collect(src, backend)
        made = clone(backend.url, dst_url, settings=backend.settings)
        dst = open_store(dst_url, backend.settings)
        shared = shared_ids(dst)
        # The source moves on: new data, compaction rewrites every SST it had, GC at age 0.
        fill(db, b"moved-on", range(60))
        compact_and_collect(src, backend)
        assert not shared & {h.id for h in _handles(src)}
        for sst_id in shared:
            src.head(compacted_path(sst_id))  # still there: the clone's checkpoint holds it
        with DbReader.open(dst_url, settings=backend.settings) as reader:
            assert dict(reader.scan()) == model
        # Deleting the clone: its objects, then its checkpoint in the source, whose GC then
        # takes the shared SSTs.
        for meta in dst.list(""):
            dst.delete(meta.path)
        db.delete_checkpoint(made.id)
        compact_and_collect(src, backend)
        for sst_id in shared:
            with pytest.raises(NotFound):
                src.head(compacted_path(sst_id))


def test_a_clone_of_a_checkpoint_has_the_checkpoint_data(backend: Backend) -> None:
    src = backend.store()
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        old = fill(db, b"old", range(40))
        checkpoint = db.create_checkpoint(name="v1")
        fill(db, b"new", range(40))
        compact_and_collect(src, backend)
        made = clone(backend.url, dst_url, checkpoint=checkpoint.id, settings=backend.settings)
        assert (made.manifest_id, made.wal_id) == (checkpoint.manifest_id, checkpoint.wal_id)
        db.delete_checkpoint(checkpoint.id)  # the clone's own checkpoint still holds the view
        compact_and_collect(src, backend)
        with DbReader.open(dst_url, settings=backend.settings) as reader:
            assert dict(reader.scan()) == old


def test_clone_refuses_an_existing_database_and_a_memory_source(backend: Backend) -> None:
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"k", b"v")
    with Db.open(dst_url, settings=backend.settings) as other:
        other.put(b"k", b"other")
    with pytest.raises(AlreadyExists, match="already holds a database"):
        clone(backend.url, dst_url, settings=backend.settings)
    with Db.open(backend.target(), settings=backend.settings) as db:
        assert db.list_checkpoints() == []  # nothing left behind in the source
    memory = open_store("memory://")
    with Db.open(memory, settings=backend.settings) as db:
        db.put(b"k", b"v")
    with pytest.raises(InvalidArgument, match="memory://"):
        clone(memory, f"{dst_url}-2", settings=backend.settings)
    with pytest.raises(NotFound, match="no checkpoint"):
        clone(backend.url, f"{dst_url}-3", checkpoint="missing", settings=backend.settings)


def _handles(store: ObjectStore) -> list[SstHandle]:
    stored = ManifestStore(store).load()
    assert stored is not None
    m = stored.manifest
    return [*m.l0, *(h for run in m.sorted_runs for h in run.ssts)]


def test_a_clone_of_a_clone_outlives_the_clone_between(backend: Backend) -> None:
    src = backend.store()
    middle_url, last_url = elsewhere(backend), elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model = fill(db, b"src", range(40))
        compact_and_collect(src, backend)
    clone(backend.url, middle_url, settings=backend.settings)
    middle = open_store(middle_url, backend.settings)
    with Db.open(middle_url, settings=backend.settings) as copy:
        model |= fill(copy, b"middle", range(5))  # in its WAL: the source's SSTs stay shared
    clone(middle_url, last_url, settings=backend.settings)
    last = open_store(last_url, backend.settings)
    stored = ManifestStore(last).load()
    assert stored is not None
    assert [e.url for e in stored.manifest.external_dbs] == [backend.url, middle_url]
    # Delete the clone in the middle, and its checkpoint in the source; the source's GC
    # keeps what the last clone shares, under the last clone's own checkpoint there.
    stored_middle = ManifestStore(middle).load()
    assert stored_middle is not None
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.delete_checkpoint(stored_middle.manifest.external_dbs[0].checkpoint_id)
        fill(db, b"moved-on", range(40))  # the source rewrites every SST it had
        compact_and_collect(src, backend)
    for meta in middle.list(""):
        middle.delete(meta.path)
    with DbReader.open(last_url, settings=backend.settings) as reader:
        assert dict(reader.scan()) == model
    with Db.open(backend.target(), settings=backend.settings) as db:
        assert [c.name for c in db.list_checkpoints()] == [f"clone:{last.url}"]


# Releasing the source (RFC 0017, "Releasing the source"): once no active manifest of the
# clone references an SST it shares, its GC drops the record and then the source checkpoint.

FULL = CompactionPolicy(l0_trigger=1, size_ratio=1e9, target_sst_bytes=2000)
"""Every compaction merges all of L0 and every run: nothing shared survives one."""


class Crash(Exception):
    """A process dying at a chosen request (not a SlatepyError: nothing catches it)."""


def moved_on_source(backend: Backend, db: Db, dst_url: str) -> tuple[dict[bytes, bytes], str]:
    """Fill and compact the source, clone it to ``dst_url``, then let the source rewrite
    every SST it had, so only the clone's checkpoint keeps the shared ones. Returns the
    cloned data and the clone's checkpoint id."""
    model = fill(db, b"src", range(60))
    compact_and_collect(backend.store(), backend)
    made = clone(backend.url, dst_url, settings=backend.settings)
    fill(db, b"moved-on", range(60))
    compact_and_collect(backend.store(), backend)
    return model, made.id


def rewrite_clone(dst_url: str, backend: Backend, tag: bytes) -> dict[bytes, bytes]:
    """Write to the clone and compact it fully: every SST it shared is rewritten."""
    with Db.open(dst_url, settings=backend.settings) as copy:
        mine = fill(copy, tag, range(50, 70))
    dst = open_store(dst_url, backend.settings)
    Compactor(
        with_external(dst, backend.settings), settings=backend.settings, policy=FULL
    ).run_until_idle()
    return mine


def externals(store: ObjectStore) -> list[tuple[str, str, int]]:
    stored = ManifestStore(store).load()
    assert stored is not None
    return [(e.url, e.checkpoint_id, len(e.sst_ids)) for e in stored.manifest.external_dbs]


def assert_collected(store: ObjectStore, sst_ids: set[str]) -> None:
    for sst_id in sst_ids:
        with pytest.raises(NotFound):
            store.head(compacted_path(sst_id))


def test_clone_gc_releases_the_source_checkpoint_once_nothing_is_shared(
    backend: Backend,
) -> None:
    src = backend.store()
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model, checkpoint_id = moved_on_source(backend, db, dst_url)
        dst = open_store(dst_url, backend.settings)
        shared = shared_ids(dst)
        mine = rewrite_clone(dst_url, backend, b"clone")
        # The clone no longer references any shared SST, yet the checkpoint stays until the
        # clone's GC has seen that no active manifest of it does either.
        assert not shared & {h.id for h in _handles(dst)}
        assert [c.id for c in db.list_checkpoints()] == [checkpoint_id]
        report = GarbageCollector(dst, settings=backend.settings, min_age=0).collect()
        assert report.released == ((backend.url, checkpoint_id),)
        assert externals(dst) == [] and db.list_checkpoints() == []
        # The source's GC now collects what only the clone shared, and the clone still
        # reads everything (from its own SSTs).
        compact_and_collect(src, backend)
        assert_collected(src, shared)
        with DbReader.open(dst_url, settings=backend.settings) as reader:
            assert dict(reader.scan()) == model | mine
        # Another pass has nothing left to release.
        assert GarbageCollector(dst, settings=backend.settings, min_age=0).collect().released == ()


def test_an_old_manifest_a_clone_reader_holds_keeps_the_source_checkpoint(
    backend: Backend,
) -> None:
    """The release waits for every active manifest: a reader's snapshot of a manifest that
    still shares SSTs keeps them (and the checkpoint) until the reader moves on."""
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model, checkpoint_id = moved_on_source(backend, db, dst_url)
        dst = open_store(dst_url, backend.settings)
        slow = msgspec.structs.replace(backend.settings, reader_poll_interval=3600)
        with DbReader.open(dst_url, settings=slow) as reader:
            mine = rewrite_clone(dst_url, backend, b"clone")
            gc = GarbageCollector(dst, settings=backend.settings, min_age=0)
            assert gc.collect().released == ()
            assert [c.id for c in db.list_checkpoints()] == [checkpoint_id]
            assert {n for _, _, n in externals(dst)} != {0}
            compact_and_collect(backend.store(), backend)  # the source's GC keeps them
            assert dict(reader.scan()) == model  # its view: the shared SSTs
        assert gc.collect().released == ((backend.url, checkpoint_id),)
        with DbReader.open(dst_url, settings=backend.settings) as reader:
            assert dict(reader.scan()) == model | mine


def test_shared_ssts_a_compaction_rewrote_leave_the_record_one_by_one(backend: Backend) -> None:
    """Partial pruning: a compaction that rewrites the shared L0 but not the shared run cuts
    the record to the run's SSTs; the checkpoint stays for them."""
    src = backend.store()
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model = fill(db, b"run", range(40))
        Compactor(src, settings=backend.settings, policy=FULL).run_until_idle()
        model |= fill(db, b"l0", range(40, 45))
        keep_l0 = CompactionPolicy(l0_trigger=100)
        Compactor(src, settings=backend.settings, policy=keep_l0).run_until_idle()
    made = clone(backend.url, dst_url, settings=backend.settings)
    dst = open_store(dst_url, backend.settings)
    stored = ManifestStore(dst).load()
    assert stored is not None and len(stored.manifest.l0) == 1
    in_run = {h.id for run in stored.manifest.sorted_runs for h in run.ssts}
    with Db.open(dst_url, settings=backend.settings) as copy:
        model |= fill(copy, b"clone", range(44, 46))
    # L0 into a new run of its own: the old run is far bigger than what L0 merges.
    l0_only = CompactionPolicy(l0_trigger=1, size_ratio=1e-9)
    Compactor(
        with_external(dst, backend.settings), settings=backend.settings, policy=l0_only
    ).run_until_idle()
    gc = GarbageCollector(dst, settings=backend.settings, min_age=0)
    assert gc.collect().released == ()
    assert shared_ids(dst) == in_run
    assert externals(dst) == [(backend.url, made.id, len(in_run))]
    before = newest(dst)
    assert gc.collect().released == () and newest(dst) == before  # nothing more to cut
    with DbReader.open(dst_url, settings=backend.settings) as reader:
        assert dict(reader.scan()) == model


def test_a_crash_between_the_clone_manifest_update_and_the_release_is_finished_later(
    backend: Backend,
) -> None:
    """The clone's manifest stops naming the shared SSTs first; the empty record left by a
    crash before (or during) the release tells the next pass what to release."""
    src = backend.store()
    dst_url = elsewhere(backend)
    settings = backend.settings
    with Db.open(backend.target(), settings=settings) as db:
        model, checkpoint_id = moved_on_source(backend, db, dst_url)
        dst = open_store(dst_url, settings)
        shared = shared_ids(dst)
        mine = rewrite_clone(dst_url, backend, b"clone")

        def unreachable(url: str) -> ObjectStore:
            raise Crash(f"died before opening {url}")

        with pytest.raises(Crash):
            GarbageCollector(dst, settings=settings, min_age=0, open_source=unreachable).collect()
        assert externals(dst) == [(backend.url, checkpoint_id, 0)]  # the pending release
        assert [c.id for c in db.list_checkpoints()] == [checkpoint_id]

        def failing_put(path: str) -> None:
            if path.startswith("manifest/"):
                raise Crash(f"died before {path} landed")

        def crashing(url: str) -> ObjectStore:
            return InterceptStore(open_store(url, settings), before_put=failing_put)

        with pytest.raises(Crash):  # the release's manifest update never lands
            GarbageCollector(dst, settings=settings, min_age=0, open_source=crashing).collect()
        assert externals(dst) == [(backend.url, checkpoint_id, 0)]
        assert [c.id for c in db.list_checkpoints()] == [checkpoint_id]
        compact_and_collect(src, backend)
        for sst_id in shared:  # still held
            src.head(compacted_path(sst_id))

        def landed_put(path: str) -> None:
            if path.startswith("manifest/"):
                raise Crash(f"died once {path} landed")

        def crash_after(url: str) -> ObjectStore:
            return InterceptStore(open_store(url, settings), after_put=landed_put)

        with pytest.raises(Crash):  # released, but the record is not dropped yet
            GarbageCollector(dst, settings=settings, min_age=0, open_source=crash_after).collect()
        assert externals(dst) == [(backend.url, checkpoint_id, 0)]
        assert db.list_checkpoints() == []
        # The next pass finds the checkpoint gone (released) and drops the record.
        report = GarbageCollector(dst, settings=settings, min_age=0).collect()
        assert report.released == ((backend.url, checkpoint_id),) and externals(dst) == []
        compact_and_collect(src, backend)
        assert_collected(src, shared)
        with DbReader.open(dst_url, settings=settings) as reader:
            assert dict(reader.scan()) == model | mine


def test_a_source_that_fails_keeps_the_record_and_the_next_pass_retries(
    backend: Backend,
) -> None:
    """A release that fails as the store can (a typed error) does not fail the pass."""
    dst_url = elsewhere(backend)
    settings = backend.settings
    with Db.open(backend.target(), settings=settings) as db:
        _, checkpoint_id = moved_on_source(backend, db, dst_url)
        dst = open_store(dst_url, settings)
        rewrite_clone(dst_url, backend, b"clone")

        def refuse(path: str) -> None:
            raise StoreUnavailable(f"injected: {path}", definite=True)

        def flaky(url: str) -> ObjectStore:
            return InterceptStore(open_store(url, settings), before_list=refuse)

        report = GarbageCollector(dst, settings=settings, min_age=0, open_source=flaky).collect()
        assert report.released == ()
        assert externals(dst) == [(backend.url, checkpoint_id, 0)]
        assert [c.id for c in db.list_checkpoints()] == [checkpoint_id]
        report = GarbageCollector(dst, settings=settings, min_age=0).collect()
        assert report.released == ((backend.url, checkpoint_id),)
        assert db.list_checkpoints() == []


def test_a_clone_of_a_clone_releases_its_own_checkpoints_and_then_its_source_does(
    backend: Backend,
) -> None:
    src = backend.store()
    middle_url, last_url = elsewhere(backend), elsewhere(backend)
    settings = backend.settings
    with Db.open(backend.target(), settings=settings) as db:
        model = fill(db, b"src", range(40))
        compact_and_collect(src, backend)
    clone(backend.url, middle_url, settings=settings)
    middle = open_store(middle_url, settings)
    with Db.open(middle_url, settings=settings) as copy:
        model |= fill(copy, b"middle", range(5))
    # The middle clone's own L0 SST, besides the source's SSTs it shares.
    Compactor(
        with_external(middle, settings), settings=settings, policy=CompactionPolicy(l0_trigger=9)
    ).run_until_idle()
    from_source = shared_ids(middle)
    clone(middle_url, last_url, settings=settings)
    last = open_store(last_url, settings)
    inherited = externals(last)
    assert [(url, n > 0) for url, _, n in inherited] == [(backend.url, True), (middle_url, True)]
    with Db.open(backend.target(), settings=settings) as db:
        assert sorted(c.name for c in db.list_checkpoints()) == sorted(
            [f"clone:{middle.url}", f"clone:{last.url}"]
        )
        fill(db, b"moved-on", range(40))  # the source rewrites every SST it had
    compact_and_collect(src, backend)

    # The last clone rewrites everything: it releases its checkpoints in both databases.
    last_model = model | rewrite_clone(last_url, backend, b"last")
    report = GarbageCollector(last, settings=settings, min_age=0).collect()
    assert sorted(report.released) == sorted((url, cp) for url, cp, _ in inherited)
    assert externals(last) == []
    with Db.open(middle_url, settings=settings) as copy:
        assert copy.list_checkpoints() == []
    with Db.open(backend.target(), settings=settings) as db:
        assert [c.name for c in db.list_checkpoints()] == [f"clone:{middle.url}"]
    compact_and_collect(src, backend)
    for sst_id in from_source:  # the middle clone still shares them
        src.head(compacted_path(sst_id))

    # Then the middle one does, and the source collects what they shared.
    middle_model = model | rewrite_clone(middle_url, backend, b"middle2")
    assert len(GarbageCollector(middle, settings=settings, min_age=0).collect().released) == 1
    compact_and_collect(src, backend)
    assert_collected(src, from_source)
    with Db.open(backend.target(), settings=settings) as db:
        assert db.list_checkpoints() == []
    for url, expected in ((middle_url, middle_model), (last_url, last_model)):
        with DbReader.open(url, settings=settings) as reader:
            assert dict(reader.scan()) == expected


def test_a_clone_that_shares_no_sst_releases_its_checkpoint_at_its_first_gc(
    backend: Backend,
) -> None:
    """A source with nothing compacted yet: the clone copied the WAL, so its checkpoint
    holds nothing the clone reads."""
    dst_url = elsewhere(backend)
    with Db.open(backend.target(), settings=backend.settings) as db:
        model = fill(db, b"wal", range(10))
        made = clone(backend.url, dst_url, settings=backend.settings)
        dst = open_store(dst_url, backend.settings)
        assert externals(dst) == [(backend.url, made.id, 0)]
        report = GarbageCollector(dst, settings=backend.settings).collect()  # default min_age
        assert report.released == ((backend.url, made.id),) and externals(dst) == []
        assert db.list_checkpoints() == []
    with DbReader.open(dst_url, settings=backend.settings) as reader:
        assert dict(reader.scan()) == model
