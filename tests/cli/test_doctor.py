"""``slatepy inspect --verify`` and ``slatepy doctor [--repair]`` on every kind of damage the
tests can build (issue 12, RFC 0012): what is listed, what is explained, and after the
repair exactly which acknowledged writes survive and that the report named the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, FencedError
from slatepy.cli.main import main
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from tests.engine.damaged import (
    BUILDERS,
    OFF,
    Damaged,
    flipped_l0,
    flipped_wal,
    key,
    listing,
    manifest_path,
    put_all,
    slatedb_like,
)

Capture = pytest.CaptureFixture[str]


def run(capsys: Capture, *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_verify_lists_doctor_explains_repair_repairs(
    tmp_path: Path, capsys: Capture, kind: str
) -> None:
    damaged: Damaged = BUILDERS[kind](tmp_path / "db")
    before = listing(damaged.root)

    status, out = run(capsys, "inspect", damaged.url, "--verify")
    assert status == 1
    assert damaged.damaged in out

    status, out = run(capsys, "doctor", damaged.url)
    assert status == 1
    assert f"{damaged.damaged}: " in out.split("what this means:")[1]  # explained
    plan = out.split("and give up:")[1]
    for path in damaged.given_up:
        assert path in plan
    assert listing(damaged.root) == before  # the diagnosis writes nothing

    status, out = run(capsys, "doctor", damaged.url, "--repair")
    assert status == 0, out
    report = out.split("given up:")[1]
    for path in damaged.given_up:
        assert path in report
    named = {p for p in {*before, *listing(damaged.root)} if p in report}
    assert named == set(damaged.given_up) - {p for p in damaged.given_up if p not in before}
    assert set(before) <= set(listing(damaged.root))  # nothing deleted

    with Db.open(damaged.url, settings=OFF) as db:
        assert {k: db.get(k) for k in damaged.survivors} == damaged.survivors
        assert dict(db.scan()) == {k: v for k, v in damaged.survivors.items() if v is not None}
        db.put(b"after", b"repair")
    with Db.open(damaged.url, settings=OFF) as db:
        assert db.get(b"after") == b"repair"
    status, out = run(capsys, "doctor", damaged.url, "--repair")
    assert status == 0 and "repaired" not in out


def test_repair_reports_the_exact_entries_given_up(tmp_path: Path, capsys: Capture) -> None:
    damaged = flipped_wal(tmp_path / "db")
    status, out = run(capsys, "doctor", damaged.url, "--repair")
    assert status == 0
    assert "wal/00000000000000000005.sst: 1 entry, seq 8..8, keys b'k003'" in out
    assert "wal/00000000000000000009.sst: 1 entry, seq 16..16, keys b'k007'" in out
    assert "the WAL from id 5 on, 5 entries (seq 8..16)" in out
    assert "compact the intact WAL before the cut (ids 1..4, 3 entries) into L0" in out


def test_repair_fences_a_live_writer(tmp_path: Path, capsys: Capture) -> None:
    """A writer still running on the damaged database halts at its next write; nothing it
    writes after the repair appears."""
    damaged = flipped_l0(tmp_path / "db")
    live = Db.open(damaged.url, settings=OFF)
    try:
        status, _ = run(capsys, "doctor", damaged.url, "--repair")
        assert status == 0
        with pytest.raises(FencedError):
            live.put(b"zombie", b"write")
    finally:
        live._crash()
    with Db.open(damaged.url, settings=OFF) as db:
        assert db.get(b"zombie") is None
        assert db.epoch > live.epoch + 1


def test_a_damaged_older_manifest_needs_no_repair(tmp_path: Path, capsys: Capture) -> None:
    root = tmp_path / "db"
    put_all(f"file://{root}", {b"a": b"1"})
    put_all(f"file://{root}", {b"b": b"2"})
    (root / manifest_path(1)).write_bytes(b"SLPM\x01\x00cut short")
    status, out = run(capsys, "inspect", f"file://{root}", "--verify")
    assert status == 1 and manifest_path(1) in out
    status, out = run(capsys, "doctor", f"file://{root}")
    assert status == 0 and "no repair needed" in out
    assert ManifestStore(open_store(f"file://{root}")).latest_id() == 4


def test_healthy_database(tmp_path: Path, capsys: Capture) -> None:
    url = f"file://{tmp_path}/db"
    put_all(url, {key(i): b"v" for i in range(3)})
    status, out = run(capsys, "inspect", url, "--verify")
    assert status == 0 and "no damage found" in out
    status, out = run(capsys, "doctor", url, "--repair")
    assert status == 0 and "no damage found" in out and "repaired" not in out


@pytest.mark.parametrize("command", [["inspect", "--verify"], ["doctor"], ["doctor", "--repair"]])
def test_not_a_slatepy_database(tmp_path: Path, capsys: Capture, command: list[str]) -> None:
    root = tmp_path / "slatedb"
    slatedb_like(root)
    before = listing(root)
    status, out = run(capsys, command[0], f"file://{root}", *command[1:])
    assert status == 1
    assert "NotASlatepyDatabase" in out and "not a slatepy database" in out
    assert listing(root) == before
