"""``slatepy gc`` and ``inspect`` say what GC held back and why (issue 15 part 2, RFC 0017):
gc_min_age, a reader's snapshot, a checkpoint; a dry run lists each object and deletes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from slatepy import Db, DbReader, Settings
from slatepy.cli.main import main
from slatepy.store import ObjectStore, open_store
from tests.cli.output import held_line, run

OFF = Settings(compactor="off", flush_interval=0.02)


def _write_and_compact(url: str, rounds: int = 3, *, value: bytes = b"v" * 200) -> None:
    with Db.open(url, settings=OFF) as db:
        for r in range(rounds):
            for i in range(20):
                db.put(b"k%02d" % i, value + b"%d" % r, await_durable=False)
            db.flush()
    assert main(["compact", url]) == 0


def _objects(store: ObjectStore) -> dict[str, int]:
    return {m.path: m.size for m in store.list("")}


def test_gc_after_compact_says_what_waits_for_gc_min_age_and_until_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    _write_and_compact(url)
    out = run(capsys, "gc", url)
    # The case: nothing deleted, and now it says why.
    assert "deleted 0 objects, 0 bytes" in out
    held = held_line(out)
    # The date is named too when the hour ahead ends on another day (in the hour before
    # midnight UTC).
    assert re.search(
        r"held back: \d+ objects, [\d.]+ kB by gc_min_age \(collectable from "
        r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC \(in (59|60) min\)",
        held,
    ), held
    assert "kept: WAL SST at wal_id_last_compacted" in held
    assert re.search(r"live: 2 objects, [\d.]+ kB", out), out  # the manifest and one L0 SST


def test_dry_run_lists_each_held_object_with_reason_and_time_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    _write_and_compact(url)
    store = open_store(url)
    before = _objects(store)
    out = run(capsys, "gc", url, "--dry-run")
    assert _objects(store) == before
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    # Every object of the database is named: live ones are not listed, the rest are held.
    assert "wal/00000000000000000002.sst" in lines
    assert "gc_min_age: compacted WAL SST, collectable " in lines["wal/00000000000000000002.sst"]
    assert "gc_min_age: superseded manifest" in lines["manifest/00000000000000000001.manifest"]
    # With gc_min_age 0 the dry run would delete them, and still deletes nothing.
    out = run(capsys, "gc", url, "--dry-run", "--min-age", "0")
    assert _objects(store) == before
    assert "would delete" in out and "wal/00000000000000000002.sst" in out
    assert "would delete: WAL below" in out


def test_gc_names_the_snapshot_that_holds_objects_and_when_it_expires(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"old")
    # The reader must hold the pre-compaction manifest through the gc: a poll that sees the
    # compaction, or a renewal after a third of reader_snapshot_ttl, registers a new snapshot
    # id (on a busy machine the line named that one).
    settings = msgspec.structs.replace(
        OFF,
        reader_snapshot_ttl=3600.0,
        reader_poll_interval=3600.0,
        reader_max_poll_interval=3600.0,
    )
    with DbReader.open(url, settings=settings) as reader:
        assert main(["compact", url]) == 0
        out = run(capsys, "gc", url, "--min-age", "0")
        held = held_line(out)
        assert f"by snapshot {reader.snapshot_id} (expires " in held, held
        # The reader's view is intact: what the snapshot holds was not deleted.
        assert reader.get(b"k00") == b"old"


def test_gc_names_the_checkpoint_that_holds_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"old")
    created = run(capsys, "checkpoint", "create", url, "--name", "nightly")
    checkpoint_id = created.split()[0]
    assert "'nightly' manifest" in created and "never expires" in created
    listed = run(capsys, "checkpoint", "list", url)
    assert listed.startswith(checkpoint_id)
    with Db.open(url, settings=OFF) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"new")
    _write_and_compact(url, rounds=1)
    out = run(capsys, "gc", url, "--min-age", "0")
    held = held_line(out)
    assert f"by checkpoint {checkpoint_id} (nightly) (no expiry: delete it to release)" in held
    assert "gc_min_age" not in held
    inspected = run(capsys, "inspect", url)
    assert "GC live: " in inspected and "; held back: " in inspected
    assert f"by checkpoint {checkpoint_id}" in inspected
    assert "checkpoint 'nightly'" in inspected
    with DbReader.open(url, settings=OFF, checkpoint=checkpoint_id) as reader:
        assert reader.get(b"k00") == b"old"
    scanned = run(capsys, "scan", url, "--checkpoint", checkpoint_id, "--limit", "2")
    assert scanned.splitlines()[:2] == ["k00\told", "k01\told"]
    refreshed = run(capsys, "checkpoint", "refresh", url, checkpoint_id, "--lifetime", "600")
    assert refreshed.startswith(checkpoint_id) and "expires 20" in refreshed
    run(capsys, "checkpoint", "delete", url, checkpoint_id)
    assert run(capsys, "checkpoint", "list", url) == "no checkpoints\n"
    out = run(capsys, "gc", url, "--min-age", "0")
    assert "checkpoint" not in held_line(out)
    assert main(["checkpoint", "delete", url, checkpoint_id]) == 1
    assert "NotFound: no checkpoint" in capsys.readouterr().err
