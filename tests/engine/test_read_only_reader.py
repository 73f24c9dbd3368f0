"""``DbReader.open(url, read_only=True)``: a reader for locations it may not write (issue 12).

It writes nothing (no snapshot, no ``wal_id_last_seen``), still follows the writer and the
compactor, and catches up when GC collected its view (its only protection is ``gc_min_age``).
Tested through a store that refuses every write (the suite runs as root in CI, where a
read-only directory still accepts writes) and, when not root, a ``chmod``-ed directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings, StoreUnavailable
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import open_store
from slatepy.store.base import ObjectStore, PutMode, WrappingStore

OFF = Settings(compactor="off", reader_poll_interval=3600)  # the tests poll by hand
EAGER = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=4, target_sst_bytes=2000)


class RefuseWrites(WrappingStore):
    """Reads pass through; every write is recorded and refused like read-only credentials."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.refused: list[str] = []

    def _refuse(self, what: str) -> None:
        self.refused.append(what)
        raise StoreUnavailable(f"access denied: {what}", path=what, definite=True)

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        self._refuse(f"PUT {path}")
        return None

    def delete(self, path: str) -> None:
        self._refuse(f"DELETE {path}")

    def copy(self, source: str, destination: str) -> None:
        self._refuse(f"COPY {source} {destination}")


def manifest_ids(store: ObjectStore) -> list[str]:
    return [m.path for m in store.list("manifest/")]


def test_a_read_only_reader_follows_the_writer_and_the_compactor_writing_nothing() -> None:
    store = open_store("memory://")
    refusing = RefuseWrites(store)
    with Db.open(store, settings=OFF) as db:
        for i in range(6):
            db.put(b"k%d" % i, b"v%d" % i)
        with pytest.raises(StoreUnavailable, match="access denied"):
            DbReader.open(refusing, settings=OFF)  # a snapshot reader must write
        refusing.refused.clear()
        with DbReader.open(refusing, settings=OFF, read_only=True) as reader:
            assert reader.read_only and reader.snapshot_id == ""
            assert dict(reader.scan()) == {b"k%d" % i: b"v%d" % i for i in range(6)}
            db.put(b"k0", b"new")
            db.delete(b"k1")
            reader.refresh()
            assert reader.get(b"k0") == b"new" and reader.get(b"k1") is None
            Compactor(store, settings=OFF, policy=EAGER).run_until_idle()
            db.put(b"k9", b"after compaction")
            reader.refresh()
            assert reader.view.wal_id_last_compacted > 0  # adopted the compacted state
            assert dict(reader.scan()) == dict(db.scan())
        assert refusing.refused == []  # every request of the reader went through it


def test_a_read_only_reader_catches_up_when_gc_collected_its_view() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=OFF) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"v%d" % i)
        Compactor(store, settings=OFF, policy=EAGER).run_until_idle()
        with DbReader.open(RefuseWrites(store), settings=OFF, read_only=True) as reader:
            view = reader.view
            held = [h.id for h in view.l0] + [h.id for r in view.sorted_runs for h in r.ssts]
            assert held
            for i in range(20):
                db.put(b"k%02d" % i, b"w%d" % i)
            Compactor(store, settings=OFF, policy=EAGER).run_until_idle()
            # No snapshot holds the reader's manifest: a GC with no grace period deletes the
            # SSTs it references (what gc_min_age normally prevents).
            for _ in range(2):
                GarbageCollector(store, settings=OFF, min_age=0).collect()
            assert not [i for i in held if store.list(f"compacted/{i}")]
            assert reader.get(b"k03") == b"w3"  # adopted the newest manifest and retried


def test_scan_command_is_read_only_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        db.put(b"a", b"1")
    store = open_store(url)
    before = manifest_ids(store)
    assert main(["scan", url]) == 0
    assert capsys.readouterr().out == "a\t1\n"
    assert manifest_ids(store) == before  # no snapshot registered and removed
    assert main(["scan", url, "--snapshot"]) == 0
    assert len(manifest_ids(store)) == len(before) + 2  # registered, then removed


@pytest.fixture
def read_only_database(tmp_path: Path) -> Iterator[str]:
    """A database in a directory tree made read-only with chmod (not enforced for root)."""
    root = tmp_path / "db"
    with Db.open(f"file://{root}", settings=OFF) as db:
        db.put(b"a", b"1")
        db.put(b"b", b"2")
    paths = [root, *root.rglob("*")]
    for path in paths:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield f"file://{root}"
    finally:
        for path in paths:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only directories"
)
def test_read_only_reader_and_scan_on_a_read_only_directory(
    read_only_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(StoreUnavailable):
        DbReader.open(read_only_database, settings=OFF)  # registering needs a manifest write
    with DbReader.open(read_only_database, settings=OFF, read_only=True) as reader:
        assert dict(reader.scan()) == {b"a": b"1", b"b": b"2"}
    assert main(["scan", read_only_database]) == 0
    assert capsys.readouterr().out == "a\t1\nb\t2\n"
