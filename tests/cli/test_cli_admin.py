"""Admin commands on a location without a database, ``gc``'s summary, torture's progress
(issue 12: a mistyped URL must be an error that creates nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slatepy import Db, Settings
from slatepy.cli.main import main
from slatepy.store import open_store
from slatepy.testing.moto import S3Endpoint
from slatepy.testing.torture import Torture
from tests.conftest import TEST_BUCKET

OFF = Settings(compactor="off")
ADMIN = [["inspect"], ["scan"], ["compact"], ["compactor"], ["gc"], ["gc", "--dry-run"]]


def run_admin(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and stderr of ``slatepy ARGS``. ``compactor`` runs in a child with a
    deadline: were it to start on the location, it would run until interrupted."""
    if args[0] != "compactor":
        status = main(args)
        return status, capsys.readouterr().err
    child = subprocess.run(
        [sys.executable, "-m", "slatepy.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return child.returncode, child.stderr


@pytest.mark.parametrize("command", ADMIN, ids=" ".join)
def test_admin_commands_refuse_a_missing_directory_and_create_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    missing = tmp_path / "typo"
    status, err = run_admin([*command, f"file://{missing}"], capsys)
    assert status == 1
    assert f"NotFound: no slatepy database at file://{missing}" in err
    assert not missing.exists()


@pytest.mark.parametrize("command", ADMIN, ids=" ".join)
def test_admin_commands_refuse_an_empty_directory_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    status, err = run_admin([*command, f"file://{tmp_path}"], capsys)
    assert status == 1
    assert f"no slatepy database at file://{tmp_path}" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.s3
def test_compact_of_a_mistyped_bucket_prefix_creates_no_database(
    s3_endpoint: S3Endpoint, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "SLATEPY_S3_ENDPOINT": s3_endpoint.url,
        "SLATEPY_S3_REGION": s3_endpoint.region,
        "SLATEPY_S3_ACCESS_KEY_ID": s3_endpoint.access_key_id,
        "SLATEPY_S3_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key,
    }.items():
        monkeypatch.setenv(name, value)
    url = f"s3://{TEST_BUCKET}/typo-{os.getpid()}"
    assert main(["compact", url]) == 1
    assert f"no slatepy database at {url}" in capsys.readouterr().err
    assert open_store(url, Settings.from_env()).list("") == []


def _database_with_garbage(url: str) -> None:
    with Db.open(url, settings=OFF) as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
    assert main(["compact", url]) == 0


def test_gc_prints_a_summary_by_kind_and_lists_objects_only_with_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path}/db"
    _database_with_garbage(url)
    monkeypatch.setenv("SLATEPY_GC_MIN_AGE", "0")
    capsys.readouterr()
    assert main(["gc", url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    # WAL SSTs 1..5 sit below wal_id_last_compacted=6; the manifests before the compaction's
    # are superseded. Counts and bytes per kind; a dry run lists each object (RFC 0017).
    assert "would delete" in out and ": wal 5 (" in out and "manifest " in out
    assert "wal/00000000000000000001.sst" in out
    assert main(["gc", url]) == 0
    out = capsys.readouterr().out
    assert "deleted" in out and ": wal 5 (" in out
    assert "wal/0000" not in out and "(-v or --dry-run lists the objects)" in out
    monkeypatch.delenv("SLATEPY_GC_MIN_AGE")  # a compactor abandons work with gc_min_age 0
    _database_with_garbage(url)  # six more WAL SSTs to collect (a fence, five writes)
    monkeypatch.setenv("SLATEPY_GC_MIN_AGE", "0")
    capsys.readouterr()
    assert main(["gc", url, "-v"]) == 0
    out = capsys.readouterr().out
    assert "deleted" in out and ": wal 6 (" in out
    assert "wal/00000000000000000007.sst" in out  # -v lists each object


def test_torture_prints_progress_while_it_runs() -> None:
    lines: list[str] = []
    torture = Torture(open_store("memory://"), seed=3, fault_rate=0.05)
    report = torture.run(steps=300, progress=lines.append, progress_interval=0.0)
    assert len(lines) >= 300  # one per step at interval 0, then one before verifying
    assert "operations" in lines[0] and "acknowledged writes" in lines[0]
    assert lines[-1].endswith("; verifying")
    assert report.lost_acknowledged_writes == 0


def test_torture_command_creates_its_location_and_prints_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/soak"
    assert main(["torture", url, "--seconds", "0.5", "--fault-rate", "0.02"]) == 0
    out = capsys.readouterr().out
    assert "; verifying" in out and "lost acknowledged writes: 0" in out
