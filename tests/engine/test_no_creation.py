"""Only ``Db.open`` creates a database: readers, the compactor and GC create nothing (issue 12).

A mistyped location used to become a directory (``file://``) or a fresh empty database (a
compactor's epoch claim wrote manifest 1); each of these now fails with ``NotFound`` naming
the location and leaves it as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, DbReader, NotFound, Settings
from slatepy.compactor import Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import open_store

OFF = Settings(compactor="off")


def test_db_open_without_create_if_missing_refuses_a_location_without_a_database(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "typo"
    with pytest.raises(NotFound, match=f"no slatepy database at file://{missing}"):
        Db.open(f"file://{missing}", settings=OFF, create_if_missing=False)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFound, match=f"no slatepy database at file://{empty}"):
        Db.open(f"file://{empty}", settings=OFF, create_if_missing=False)
    assert list(empty.iterdir()) == []
    store = open_store("memory://")
    with pytest.raises(NotFound, match="create_if_missing=True"):
        Db.open(store, settings=OFF, create_if_missing=False)
    assert store.list("") == []


def test_db_open_creates_by_default_and_then_opens_without_creating(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/a/b/db"  # fsync (the default) creates the missing parents too
    with Db.open(url, settings=OFF) as db:
        db.put(b"k", b"v")
    with Db.open(url, settings=OFF, create_if_missing=False) as db:
        assert db.get(b"k") == b"v"
        assert db.epoch == 2


def test_reader_of_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    with pytest.raises(NotFound, match=f"file://{missing}"):
        DbReader.open(f"file://{missing}", settings=OFF)
    with pytest.raises(NotFound, match=f"file://{missing}"):
        DbReader.open(f"file://{missing}", settings=OFF, read_only=True)
    assert not missing.exists()


def test_compactor_refuses_a_location_without_a_database() -> None:
    store = open_store("memory://")
    with pytest.raises(NotFound, match="no slatepy database at memory://"):
        Compactor(store, settings=OFF)
    assert store.list("") == []  # no manifest claimed an epoch: no database appeared


def test_garbage_collector_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    with pytest.raises(NotFound):
        GarbageCollector(open_store(f"file://{missing}", OFF), settings=OFF)
    assert not missing.exists()
    store = open_store("memory://")
    report = GarbageCollector(store, settings=OFF, min_age=0).collect()
    assert report.deletions == [] and store.list("") == []


def test_open_store_creates_only_when_asked(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        open_store(f"file://{tmp_path}/nothing")
    assert not (tmp_path / "nothing").exists()
    open_store(f"file://{tmp_path}/made", create=True).put("x", b"1")
    assert (tmp_path / "made" / "x").read_bytes() == b"1"
