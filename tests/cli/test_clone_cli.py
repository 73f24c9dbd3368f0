"""``slatepy clone`` and ``slatepy checkpoint`` on the command line (RFC 0017)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings
from slatepy.cli.main import main
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.clone import with_external
from slatepy.store import open_store
from tests.cli.output import held_line, run

OFF = Settings(compactor="off", flush_interval=0.02)
FULL = CompactionPolicy(l0_trigger=1, size_ratio=1e9)
"""Every compaction merges everything: no SST of before survives it."""


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


def test_gc_and_inspect_say_a_clone_holds_the_checkpoint_until_its_gc_releases_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    with Db.open(src, settings=OFF) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"v")
    assert main(["compact", src]) == 0
    assert main(["clone", src, dst]) == 0
    out = capsys.readouterr().out
    checkpoint_id = out.split("keeps checkpoint ")[1].split()[0]
    assert "the clone's GC releases it once its compactions have rewritten" in out
    with Db.open(src, settings=OFF) as db:  # the source moves on: only the clone holds them
        db.put(b"k00", b"newer")
    Compactor(open_store(src), settings=OFF, policy=FULL).run_until_idle()
    held = held_line(run(capsys, "gc", src, "--min-age", "0"))
    assert (
        f"by checkpoint {checkpoint_id} (clone:{dst}) (no expiry: held by a clone: its GC "
        "releases it once it reads nothing here)" in held
    ), held
    assert f"checkpoint 'clone:{dst}'" in (inspected := run(capsys, "inspect", src))
    assert f"(held by the clone {dst}: its GC releases it once" in inspected

    with Db.open(dst, settings=OFF) as copy:
        copy.put(b"k01", b"clone")
    Compactor(with_external(dst, OFF), settings=OFF, policy=FULL).run_until_idle()
    out = run(capsys, "gc", dst, "--dry-run", "--min-age", "0")
    assert f"would release checkpoint {checkpoint_id} in {src}: the clone reads nothing" in out
    inspected = run(capsys, "inspect", dst)  # gc_min_age keeps the older manifests active
    assert f"shares no SST of {src} any more: GC releases its checkpoint {checkpoint_id}" in (
        inspected
    )
    assert "GC would release" not in inspected
    out = run(capsys, "gc", dst, "--min-age", "0")
    assert f"released checkpoint {checkpoint_id} in {src}" in out and "shared:" not in out
    assert "shares" not in run(capsys, "inspect", dst)

    # The source no longer says anything of the clone, and its GC collects what it shared.
    assert "no checkpoints" in run(capsys, "checkpoint", "list", src)
    assert "clone" not in run(capsys, "gc", src, "--min-age", "0")
    assert "clone" not in run(capsys, "inspect", src)
    with DbReader.open(dst, settings=OFF) as reader:
        assert dict(reader.scan()) == {b"k%02d" % i: b"v" for i in range(20)} | {b"k01": b"clone"}
