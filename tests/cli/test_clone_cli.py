"""``slatepy clone`` and ``slatepy checkpoint`` on the command line (RFC 0017)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings
from slatepy.cli.main import main

OFF = Settings(compactor="off", flush_interval=0.02)


def test_clone_prints_the_checkpoint_to_delete_with_the_clone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    with Db.open(src, settings=OFF) as db:
        db.put(b"k", b"v")
    assert main(["compact", src]) == 0
    capsys.readouterr()
    assert main(["clone", src, dst]) == 0
    out = capsys.readouterr().out
    checkpoint_id = out.split("keeps checkpoint ")[1].split()[0]
    assert f"slatepy checkpoint delete {src} {checkpoint_id}" in out
    assert main(["checkpoint", "list", src]) == 0
    assert f"'clone:{dst}'" in capsys.readouterr().out
    assert main(["inspect", dst]) == 0
    assert f"shares 1 SSTs of {src}" in capsys.readouterr().out
    assert main(["gc", dst]) == 0
    assert "shared: 1 SSTs, " in capsys.readouterr().out
    with DbReader.open(dst, settings=OFF) as reader:
        assert reader.get(b"k") == b"v"
    assert main(["clone", src, dst]) == 1
    assert "AlreadyExists" in capsys.readouterr().err


def test_inspect_verify_and_doctor_find_a_clone_healthy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its shared SSTs live in the source: not missing (a repair must not drop them)."""
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    with Db.open(src, settings=OFF) as db:
        db.put(b"k", b"v")
    assert main(["compact", src]) == 0
    assert main(["clone", src, dst]) == 0
    capsys.readouterr()
    assert main(["inspect", dst, "--verify"]) == 0, capsys.readouterr().out
    assert main(["doctor", dst]) == 0, capsys.readouterr().out
