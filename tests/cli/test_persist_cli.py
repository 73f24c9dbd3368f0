"""``slatepy persist inspect`` and ``slatepy persist admin finalize`` on a file store."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy.cli.main import main
from slatepy.persist import PersistClient


def _files(root: Path) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), root): Path(d, f).read_bytes()
        for d, _, files in os.walk(root)
        for f in files
    }


@pytest.fixture
def location(tmp_path: Path) -> Iterator[str]:
    """A shard 'orders' with an inline batch, a hollow part, a batch written but never
    applied, a writer, a leased reader and a critical since (the client stays open through
    the test: closing it would release the writer and the reader)."""
    url = f"file://{tmp_path}/persist"
    with PersistClient.open(url) as client:
        write = client.open_writer("orders", purpose="cli test")
        write.compare_and_append([((b"k1", b"v1"), 0, 1)], expected_upper=0, new_upper=1)
        big = [((b"key%05d" % i, b"x" * 100), 1, 1) for i in range(200)]  # > 4 KiB: a part
        write.compare_and_append(big, expected_upper=1, new_upper=2)
        write.batch([((b"never%04d" % i, b"y" * 100), 5, 1) for i in range(100)], 5, 6)
        client.open_leased_reader("orders")
        since = client.open_critical_since("orders", "controller")
        since.compare_and_downgrade_since(b"", b"\x01\x02", 1)
        client.open_writer("other").compare_and_append([], expected_upper=0, new_upper=7)
        yield url


def test_inspect_summarises_every_shard(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["persist", "inspect", location]) == 0
    summaries = {s["shard"]: s for s in json.loads(capsys.readouterr().out)}
    assert set(summaries) == {"orders", "other"}
    orders = summaries["orders"]
    assert (orders["upper"], orders["since"], orders["updates"]) == (2, 0, 201)
    assert orders["critical_readers"] == 1 and orders["writers"] == 1
    assert summaries["other"]["upper"] == 7 and summaries["other"]["updates"] == 0


def test_inspect_shows_a_shards_state_and_what_it_does_not_reference(
    location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(tmp_path / "persist")
    assert main(["persist", "inspect", location, "orders"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert _files(tmp_path / "persist") == before  # inspecting writes nothing
    parts = [p for b in report["trace"] for run in b["runs"] for p in run]
    hollow = [p for p in parts if "key" in p]
    assert len(hollow) == 1 and hollow[0]["updates"] == 200 and hollow[0]["bytes"] > 4096
    assert any(p.get("inline_bytes") for p in parts)
    assert report["critical_readers"]["controller"]["opaque"] == "0102"
    assert [w["upper"] for w in report["writers"].values()] == [2]
    assert "cli test" in next(iter(report["writers"].values()))["debug"]
    assert len(report["leased_readers"]) == 1
    # The batch written but never applied is under the shard, named by no state.
    unreferenced = report["unreferenced_parts"]
    assert len(unreferenced) == 1 and unreferenced[0]["path"].startswith("shards/orders/part/")


def test_inspect_of_a_missing_shard_is_an_error(
    location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["persist", "inspect", location, "nope"]) == 1
    assert "no shard 'nope'" in capsys.readouterr().err


def test_finalize_is_a_dry_run_until_commit(
    location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["persist", "admin", "finalize", location, "orders"]) == 1  # refused
    assert "cannot be finalized yet: since=0, upper=2" in capsys.readouterr().out
    assert main(["persist", "admin", "finalize", location, "orders", "--commit"]) == 1
    assert "UsageError" in capsys.readouterr().err
    with PersistClient.open(location) as client:
        client.open_writer("done").compare_and_append(
            [((b"k", b"v"), 0, 1)], expected_upper=0, new_upper=None
        )
        client.open_leased_reader("done").downgrade_since(None)
    assert main(["persist", "admin", "finalize", location, "done"]) == 0
    assert "can be finalized (dry run" in capsys.readouterr().out
    assert main(["persist", "admin", "finalize", location, "done", "--commit"]) == 0
    assert "finalized at seqno" in capsys.readouterr().out
    assert main(["persist", "admin", "finalize", location, "done"]) == 0
    assert "finalized already" in capsys.readouterr().out
    assert main(["persist", "inspect", location, "done"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["finalized"] and report["trace"] == [] and report["writers"] == {}


def test_inspect_never_creates_a_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["persist", "inspect", f"file://{tmp_path}/nothing"]) == 1
    assert "NotFound" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
