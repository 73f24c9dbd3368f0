"""The ``slatepy`` command: demo and inspect."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, WriteBatch
from slatepy.cli.demo import run_demo
from slatepy.cli.main import main


def test_demo_runs_and_verifies(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = run_demo(tmp_path / "demo", orders=3000, out=lines.append)
    text = "\n".join(lines)
    assert "every acknowledged write verified" in text
    assert "2900 live orders" in text
    assert figures["ingest_rows_per_s"] > 0


def test_inspect_reports_manifest_and_wal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url) as db:
        db.write(WriteBatch().put(b"alpha", b"1").delete(b"beta"))
    assert main(["inspect", url, "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "writer_epoch=1" in out
    assert "WAL: 2 SSTs, ids 1..2" in out
    assert "entries=2 tombstones=1" in out and "keys=b'alpha'..b'beta'" in out


def test_inspect_of_an_empty_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", f"file://{tmp_path}/nothing"]) == 0
    assert "holds no slatepy database" in capsys.readouterr().out


def test_cli_reports_errors_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "ftp://nowhere/x"]) == 1
    assert "UnsupportedStore" in capsys.readouterr().err


def test_compact_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url) as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
    assert main(["compact", url]) == 0
    assert "wal_id_last_compacted=6, l0=1" in capsys.readouterr().out
    with Db.open(url) as db:
        assert db.replayed_ssts == 0
        assert [k for k, _ in db.scan()] == [b"k0", b"k1", b"k2", b"k3", b"k4"]
