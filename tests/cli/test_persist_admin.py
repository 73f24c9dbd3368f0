"""``slatepy persist admin force-compaction`` and ``force-gc`` on real ``file://`` shards:
dry runs write nothing, ``--commit`` compacts (same data, fewer batches) and collects (only
unreferenced parts past ``batch_lease``; readers still read), a held GC claim and a missing
shard exit 1, and nothing is ever created."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from slatepy.cli import persist_admin
from slatepy.cli.main import main
from slatepy.config import Settings
from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist.state.gc_rules import ClaimGc, claim_gc
from tests.persist.compaction_kit import Update, part_paths, referenced, snapshot, upd
from tests.persist.handles_kit import Clock

SHARD = "orders"

OFF = PersistSettings(
    compaction="off",
    inline_part_max_bytes=0,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
)
"""No background merges (the trace only grows), every part a blob, short leases."""

APPENDS = 24


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (blobs and the consensus log) with its bytes."""
    return {
        os.path.relpath(os.path.join(d, f), root): Path(d, f).read_bytes()
        for d, _, files in os.walk(root)
        for f in files
    }


@pytest.fixture(name="root")
def root_fixture(tmp_path: Path) -> Path:
    return tmp_path / "persist"


@pytest.fixture(name="url")
def url_fixture(root: Path) -> str:
    return f"file://{root}"


@pytest.fixture(name="clock")
def clock_fixture() -> Clock:
    import time

    return Clock(time.time())


@pytest.fixture(name="written")
def written_fixture(url: str, clock: Clock) -> list[Update]:
    """Shard 'orders': :data:`APPENDS` small appends (one blob part each, compaction off),
    some retracting earlier updates, and one batch written but never appended (a leak)."""
    updates: list[Update] = []
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        write = client.open_writer(SHARD)
        for t in range(APPENDS):
            batch = [upd(b"k%03d" % (t * 3 + i), t) for i in range(3)]
            if t % 4 == 3:
                batch.append(upd(b"k%03d" % ((t - 1) * 3), t, -1))
            write.compare_and_append(batch, t, t + 1)
            updates.extend(batch)
        write.batch([upd(b"leak", APPENDS)], APPENDS, APPENDS + 1)
        write.expire()
    return updates


def _contents(url: str, clock: Clock) -> list[Update]:
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        return sorted(snapshot(client, APPENDS - 1, SHARD))


def _batches(url: str, clock: Clock) -> int:
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        return len(client.machine(SHARD).fetch().trace)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    status = main(["persist", "admin", *argv])
    captured = capsys.readouterr()
    report = json.loads(captured.out) if captured.out.strip() else {}
    return status, report | ({"stderr": captured.err} if captured.err else {})


# -- force-compaction ---------------------------------------------------------------------


def test_force_compaction_dry_run_writes_nothing_and_shows_the_plan(
    url: str, root: Path, written: list[Update], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(root)
    status, report = _run(["force-compaction", url, SHARD], capsys)
    assert status == 0 and report["mode"] == "dry-run", report
    assert _files(root) == before  # no claim, no merge output, no rollup
    trace = report["trace"]
    assert isinstance(trace, list) and len(trace) == APPENDS
    assert all(b["parts"] == 1 and b["bytes"] > 0 for b in trace)
    merges = report["merges"]
    assert isinstance(merges, list) and merges
    assert sum(m["updates"] for m in merges) > 3  # more than one append's worth


def test_force_compaction_commit_reduces_the_trace_and_keeps_the_data(
    url: str,
    root: Path,
    clock: Clock,
    written: list[Update],
    capsys: pytest.CaptureFixture[str],
) -> None:
    contents = _contents(url, clock)
    status, report = _run(["force-compaction", url, SHARD, "--commit"], capsys)
    assert status == 0, report
    assert report["batches_before"] == APPENDS
    assert report["batches_after"] == _batches(url, clock) < APPENDS
    statuses = report["statuses"]
    assert isinstance(statuses, dict) and statuses.get("applied", 0) >= 1
    assert report["converged"] and report["lost_races"] == 0
    assert _contents(url, clock) == contents
    # Converged: a dry run now plans nothing, and a second commit changes nothing.
    status, again = _run(["force-compaction", url, SHARD], capsys)
    assert status == 0 and again["merges"] == []
    files = _files(root)
    status, again = _run(["force-compaction", url, SHARD, "--commit"], capsys)
    assert status == 0 and again["batches_after"] == report["batches_after"]
    assert again["statuses"] == {}
    assert _files(root) == files


def test_force_compaction_beside_a_live_writer_with_background_compaction(
    url: str, clock: Clock, written: list[Update]
) -> None:
    live = PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    expected = list(written)
    with PersistClient.open(url, settings=live, clock=clock) as client:
        write = client.open_writer(SHARD)

        def appends() -> None:
            for t in range(APPENDS, APPENDS + 20):
                batch = [upd(b"live%03d" % t, t)]
                write.compare_and_append(batch, t, t + 1)
                expected.extend(batch)

        writer = threading.Thread(target=appends)
        writer.start()
        # Who merges what is a race (the writer claims spans as it appends, its background
        # compactor runs them, the admin merges the rest): only the outcome is checked.
        results = []
        while writer.is_alive() or not results:
            results.append(
                persist_admin.force_compaction(
                    url, SHARD, consensus=None, settings=Settings(), commit=True, clock=clock
                )
            )
        writer.join()
        assert all(result.status == 0 for result in results)
        assert len(expected) == len(written) + 20  # every append landed
        as_of = APPENDS + 19
        got = sorted(snapshot(client, as_of, SHARD))
    assert got == sorted(_consolidated(expected, as_of))


def _consolidated(updates: list[Update], as_of: int) -> list[Update]:
    """``updates`` as a snapshot at ``as_of`` shows them: times forwarded, diffs summed."""
    sums: dict[tuple[bytes, bytes], int] = {}
    for kv, _, diff in updates:
        sums[kv] = sums.get(kv, 0) + diff
    return [(kv, as_of, diff) for kv, diff in sums.items() if diff]


def test_force_compaction_of_a_closed_or_finalized_shard_says_so(
    url: str, written: list[Update], capsys: pytest.CaptureFixture[str]
) -> None:
    with PersistClient.open(url, settings=OFF) as client:
        client.open_writer("done").compare_and_append(
            [((b"k", b"v"), 0, 1)], expected_upper=0, new_upper=None
        )
        client.open_leased_reader("done").downgrade_since(None)
    status, report = _run(["force-compaction", url, "done", "--commit"], capsys)
    assert status == 0 and "closed since" in str(report["message"])
    assert main(["persist", "admin", "finalize", url, "done", "--commit"]) == 0
    capsys.readouterr()
    status, report = _run(["force-compaction", url, "done", "--commit"], capsys)
    assert status == 0 and "is finalized" in str(report["message"])


def test_force_gc_of_a_finalized_shard_collects_it_then_says_so(
    url: str, root: Path, clock: Clock, written: list[Update]
) -> None:
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        client.open_writer("done").compare_and_append(
            [upd(b"k", 0)], expected_upper=0, new_upper=None
        )
        client.open_leased_reader("done").downgrade_since(None)
        client.finalize_shard("done")
    clock.advance(OFF.batch_lease + 1)

    def gc() -> persist_admin.AdminReport:
        return persist_admin.force_gc(
            url, "done", consensus=None, settings=Settings(), commit=True,
            persist_settings=OFF, clock=clock,
        )  # fmt: skip

    first = gc()
    assert first.status == 0 and first.report["status"] == "done"
    assert first.report["finalized"] and first.report["parts"] == 1
    assert not list((root / "shards" / "done").glob("part/**/*.sst"))
    clock.advance(OFF.batch_lease + 1)
    second = gc()
    assert second.status == 0 and second.report["status"] == "skipped"
    assert "finalized and fully collected" in str(second.report["message"])


@pytest.mark.parametrize(
    "command",
    [["admin", "force-gc"], ["admin", "force-compaction"], ["admin", "finalize"], ["inspect"]],
)
def test_a_dry_run_writes_no_rollup_even_after_a_long_replay(
    url: str, root: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A cold load that replays more than ``rollup_replay_limit`` diffs makes a client write
    a rollup; the dry-run client must not."""
    lazy = PersistSettings(compaction="off", rollup_min_diffs=10**9)
    with PersistClient.open(url, settings=lazy) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0), upd(b"b", 1)], 0, 2)
        end = PersistSettings().rollup_replay_limit + 10
        for t in range(2, end):
            write.compare_and_append([], t, t + 1)
        write.compare_and_append([upd(b"c", end)], end, end + 1)
    before = _files(root)
    refused = command[-1] == "finalize"  # the shard is not closed: the dry run refuses
    assert main(["persist", *command, url, SHARD]) == (1 if refused else 0)
    assert SHARD in capsys.readouterr().out
    assert _files(root) == before


# -- force-gc -----------------------------------------------------------------------------


def test_force_gc_dry_run_writes_nothing_and_lists_what_it_would_delete(
    url: str, root: Path, clock: Clock, written: list[Update], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(root)
    # Production leases: the leaked part is younger than batch_lease, nothing would go.
    status, report = _run(["force-gc", url, SHARD], capsys)
    assert status == 0 and report["status"] == "planned" and report["part_keys"] == []
    clock.advance(OFF.batch_lease + 1)
    result = persist_admin.force_gc(
        url, SHARD, consensus=None, settings=Settings(), commit=False,
        persist_settings=OFF, clock=clock,
    )  # fmt: skip
    assert result.status == 0 and result.report["mode"] == "dry-run"
    leaked = [key for key in result.report["part_keys"] if key not in _referenced(url, clock)]
    assert len(leaked) == 1 == result.report["parts"]
    assert result.report["part_bytes"] == (root / "shards" / SHARD / leaked[0]).stat().st_size
    assert _files(root) == before


def test_force_gc_commit_deletes_unreferenced_parts_past_the_lease_and_readers_still_read(
    url: str, clock: Clock, written: list[Update], capsys: pytest.CaptureFixture[str]
) -> None:
    contents = _contents(url, clock)
    assert _run(["force-compaction", url, SHARD, "--commit"], capsys)[0] == 0
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        unreferenced = part_paths(client, SHARD) - referenced(client.machine(SHARD).fetch())
    assert len(unreferenced) > 1  # the leak and the merged inputs

    def gc() -> persist_admin.AdminReport:
        return persist_admin.force_gc(
            url, SHARD, consensus=None, settings=Settings(), commit=True,
            persist_settings=OFF, clock=clock,
        )  # fmt: skip

    young = gc()  # every unreferenced part is younger than batch_lease: none goes
    assert young.status == 0 and young.report["status"] == "done" and young.report["parts"] == 0
    clock.advance(OFF.batch_lease + 1)
    result = gc()
    assert result.status == 0 and result.report["status"] == "done"
    assert set(result.report["part_keys"]) == unreferenced
    assert result.report["part_bytes"] > 0
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        assert part_paths(client, SHARD) == referenced(client.machine(SHARD).fetch())
    assert _contents(url, clock) == contents


def test_force_gc_exits_1_while_another_pass_holds_the_claim(
    url: str, root: Path, written: list[Update], capsys: pytest.CaptureFixture[str]
) -> None:
    with PersistClient.open(url, settings=OFF) as client:
        assert client.machine(SHARD).run(claim_gc, ClaimGc("other-gc"))
    before = _files(root)
    assert main(["persist", "admin", "force-gc", url, SHARD, "--commit"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "skipped"
    assert "another GC pass holds the claim ('other-gc'" in captured.err
    assert _files(root) == before


# -- missing shards and locations ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [c, *commit]
        for c in ("force-gc", "force-compaction", "finalize")
        for commit in ([], ["--commit"])
    ],
)
def test_a_missing_shard_exits_1_and_creates_nothing(
    url: str, root: Path, written: list[Update], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(root)
    assert main(["persist", "admin", argv[0], url, "nope", *argv[1:]]) == 1
    assert "no shard 'nope'" in capsys.readouterr().err
    assert _files(root) == before


@pytest.mark.parametrize("command", ["force-gc", "force-compaction"])
def test_a_missing_location_exits_1_and_is_not_created(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/nothing"
    assert main(["persist", "admin", command, url, SHARD, "--commit"]) == 1
    assert "NotFound" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def _referenced(url: str, clock: Clock) -> set[str]:
    with PersistClient.open(url, settings=OFF, clock=clock) as client:
        return referenced(client.machine(SHARD).fetch())
