"""Fencing across processes: an older leader's commit fails with ``FencedError`` and none of
its writes is visible, whichever process is the older leader (issue 31). In one process the
behaviour suite covers it (``test_an_older_leaders_commit_is_fenced_and_writes_nothing``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy.errors import FencedError
from tests.catalog.conftest import Place, make_place

CHILD = Path(__file__).with_name("fencing_child.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["persist-file", "sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """A catalog another process can open by URL alone (no S3 settings to hand over)."""
    found = make_place(request.param, request, tmp_path)
    yield found
    found.close_all()


def _child(place: Place, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), place.url, place.shard, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _names(place: Place) -> list[str]:
    state = place.state()
    state.open_read_only()
    return [v["name"] for _, v in state.entries("databases")]


def _audited(place: Place) -> list[tuple[str, str, str]]:
    """``(event_type, collection, user)`` of every audit event."""
    state = place.state()
    state.open_read_only()
    return [(v["event_type"], v["collection"], v["user"]) for _, v in state.entries("audit_log")]


def test_a_leader_in_another_process_is_fenced_by_a_newer_open(shared: Place) -> None:
    child = _child(shared, "lead")
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "1"
        leader = shared.state()
        leader.open()
        assert leader.epoch == 2
        tx = leader.transaction()
        tx.create_database("parent", "memory://")
        leader.commit_transaction(tx)
        out, err = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.startswith("fenced:"), (out, err)
    assert child.returncode == 0, err
    assert _names(shared) == ["parent"]
    assert all(user != "child" for _, _, user in _audited(shared))  # no event of its commit


def test_this_process_is_fenced_by_a_newer_open_in_another(shared: Place) -> None:
    leader = shared.state()
    leader.open()
    tx = leader.transaction()
    tx.create_database("before", "memory://")
    leader.commit_transaction(tx)
    tx = leader.transaction()
    tx.create_database("stale", "memory://")
    out, err = _child(shared, "open").communicate(timeout=60)
    assert out.strip() == "2", err
    with pytest.raises(FencedError):
        leader.commit_transaction(tx)
    with pytest.raises(FencedError):
        leader.confirm_leadership()
    assert _names(shared) == ["before", "child"]
    creates = [e for e in _audited(shared) if e[:2] == ("create", "databases")]
    assert creates == [("create", "databases", ""), ("create", "databases", "child")]
