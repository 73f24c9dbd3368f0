"""Clones (RFC 0017): a new database sharing its source's SSTs. Writing to, compacting and
collecting the clone never touches the source; the source's GC keeps what the clone shares
while the clone's checkpoint exists."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from slatepy import AlreadyExists, Db, DbReader, InvalidArgument, NotFound, clone
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.clone import with_external
from slatepy.gc import GarbageCollector
from slatepy.manifest.record import SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.table.layout import compacted_path
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
        # The source: not one object written, changed or deleted under its location, and
        # its data unchanged, by the clone's writes, compaction and GC.
        assert listing(src) == before
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
