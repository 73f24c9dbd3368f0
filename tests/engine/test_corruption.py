"""Corruption is named, a failed open changes nothing, and someone else's data is not
"corruption" (issue 12, RFC 0012)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, DbReader
from slatepy.compactor import Compactor
from slatepy.compactor.executor import plan_inputs
from slatepy.compactor.planner import L0ToRun
from slatepy.errors import CorruptionError, NotASlatepyDatabase
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.merge import merge_newest
from tests.engine.damaged import (
    OFF,
    Damaged,
    flipped_l0,
    flipped_run,
    flipped_wal,
    key,
    listing,
    manifest_path,
    missing_l0,
    missing_wal,
    put_all,
    slatedb_like,
    truncated_manifest,
)


@pytest.mark.parametrize("build", [flipped_wal, missing_wal, truncated_manifest])
def test_failed_open_names_the_object_and_changes_nothing(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    """The open fails on a read before its first manifest update: no epoch bump, no
    snapshot, no fencing SST, not a byte changed; the error names the object."""
    damaged: Damaged = build(tmp_path / "db")
    before = listing(damaged.root)
    with pytest.raises(CorruptionError) as caught:
        Db.open(damaged.url, settings=OFF)
    assert caught.value.path == damaged.damaged
    assert damaged.damaged in str(caught.value)
    assert listing(damaged.root) == before


@pytest.mark.parametrize("build", [flipped_l0, flipped_run])
def test_reads_of_a_damaged_compacted_sst_name_it(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    """The database opens; a get, a scan and a compaction that reach the SST all raise a
    CorruptionError naming it."""
    damaged: Damaged = build(tmp_path / "db")
    lost = next(k for k, v in damaged.survivors.items() if v is None)
    with Db.open(damaged.url, settings=OFF) as db:
        with pytest.raises(CorruptionError) as get:
            db.get(lost)
        with pytest.raises(CorruptionError) as scan:
            list(db.scan())
    assert get.value.path == scan.value.path == damaged.damaged
    assert get.value.offset is not None and scan.value.offset is not None  # the block's start
    compactor = Compactor(open_store(damaged.url), settings=OFF)
    manifest = compactor.manifests.load()
    assert manifest is not None
    m = manifest.manifest
    todo = L0ToRun(tuple(h.id for h in m.l0), tuple(r.id for r in m.sorted_runs), 99, True)
    with pytest.raises(CorruptionError) as merge:
        list(merge_newest(plan_inputs(todo, m, compactor.tables)))
    assert merge.value.path == damaged.damaged


def test_a_missing_compacted_sst_is_named(tmp_path: Path) -> None:
    damaged = missing_l0(tmp_path / "db")
    with Db.open(damaged.url, settings=OFF) as db:
        with pytest.raises(CorruptionError) as caught:
            db.get(key(0))
        assert caught.value.path == damaged.damaged
        with pytest.raises(CorruptionError) as caught:
            db.get_many([key(0), key(1)])
        assert caught.value.path == damaged.damaged
    with DbReader.open(damaged.url, settings=OFF) as reader:
        with pytest.raises(CorruptionError) as caught:
            reader.get(key(0))
        assert caught.value.path == damaged.damaged


def test_reader_open_names_a_damaged_wal_sst_and_leaves_no_snapshot(tmp_path: Path) -> None:
    damaged = flipped_wal(tmp_path / "db")
    manifests = ManifestStore(open_store(damaged.url))
    before = manifests.load()
    assert before is not None
    with pytest.raises(CorruptionError) as caught:
        DbReader.open(damaged.url, settings=OFF)
    assert caught.value.path == damaged.damaged
    after = manifests.load()
    assert after is not None and after.manifest.snapshots == before.manifest.snapshots


def test_a_slatedb_directory_is_not_a_slatepy_database(tmp_path: Path) -> None:
    """Not "checksum mismatch": its own error, not a CorruptionError (a repair must never
    write into another program's data), and nothing is written."""
    root = tmp_path / "slatedb"
    slatedb_like(root)
    before = listing(root)
    for open_ in (Db.open, DbReader.open):
        with pytest.raises(NotASlatepyDatabase) as caught:
            open_(f"file://{root}", settings=OFF)
        assert not isinstance(caught.value, CorruptionError)
        assert caught.value.path == manifest_path(2)
        assert "not a slatepy database" in str(caught.value)
    assert listing(root) == before


def test_random_files_where_the_manifest_should_be(tmp_path: Path) -> None:
    root = tmp_path / "other"
    (root / "manifest").mkdir(parents=True)
    (root / manifest_path(1)).write_text("name,age\nada,36\n")
    with pytest.raises(NotASlatepyDatabase):
        Db.open(f"file://{root}", settings=OFF)
    assert listing(root) == {manifest_path(1): b"name,age\nada,36\n"}


def test_our_manifest_overwritten_with_garbage_is_corruption(tmp_path: Path) -> None:
    """An older manifest of ours shows the newest one is damaged, not foreign."""
    root = tmp_path / "db"
    put_all(f"file://{root}", {b"a": b"1"})
    (root / manifest_path(2)).write_bytes(b"\x00\x01garbage that is not a manifest")
    with pytest.raises(CorruptionError) as caught:
        Db.open(f"file://{root}", settings=OFF)
    assert not isinstance(caught.value, NotASlatepyDatabase)
    assert caught.value.path == manifest_path(2)
