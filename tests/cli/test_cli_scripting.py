"""Issue 32 item 6, a CLI that scripts well: one escaping rule for keys and values, in and
out; ``--json`` parsed; exit codes 1 (refused), 2 (usage), no traceback for bad input or a
closed pipe; help on every argument; plain paths; ``--log-level`` (docs/cli-conventions.md)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy import Db, Settings, WriteBatch
from slatepy.cli.main import build_parser, main
from slatepy.cli.output import escape, unescape
from tests.cli.output import run

OFF = Settings(compactor="off")
AWKWARD = b"a\tb\nc\\d \x1b[31m\xff\x00\xe2\x80\x8b\xc3\xa9"
"""A key with a tab, a newline, a backslash, a space, a terminal escape, a byte that is not
UTF-8, a NUL, an unprintable character (U+200B) and a printable one (é)."""


@pytest.fixture
def url(tmp_path: Path) -> str:
    location = f"file://{tmp_path}/db"
    with Db.open(location, settings=OFF) as db:
        db.put(b"a", b"1")
        db.put(AWKWARD, b"v\tw")
        db.put(b"z", b"26")
    return location


@given(st.binary(max_size=40))
def test_escape_round_trips_and_keeps_one_line_one_field(data: bytes) -> None:
    text = escape(data)
    assert unescape(text) == data
    assert not any(c in text for c in "\t\n\r") and text.isprintable()


def test_escape_is_readable_where_it_can_be() -> None:
    assert escape(AWKWARD) == "a\\tb\\nc\\\\d \\x1b[31m\\xff\\x00\\xe2\\x80\\x8bé"


def test_scan_and_wal_tail_print_keys_alike_and_start_takes_them_back(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 32): scan printed raw bytes (tabs, newlines, terminal escapes) and
    wal tail Python literals; fails on /work/base."""
    shown = escape(AWKWARD)
    assert run(capsys, "scan", url).splitlines() == ["a\t1", f"{shown}\tv\\tw", "z\t26"]
    tail = run(capsys, "wal", "tail", url).splitlines()
    assert tail[1] == f"seq=4\twal=3\tput\tkey={shown}\tvalue=v\\tw"
    assert run(capsys, "scan", url, "--start", shown, "--limit", "1") == f"{shown}\tv\\tw\n"
    assert run(capsys, "scan", url, "--end", shown) == "a\t1\n"


def test_scan_start_with_bytes_that_are_not_utf8(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 32): a raw non-UTF-8 byte in ``--start`` (Python passes it as a
    surrogate escape) ended in a UnicodeEncodeError traceback; fails on /work/base."""
    assert run(capsys, "scan", url, "--start", "b\udcff") == "z\t26\n"


def test_a_bad_escape_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["scan", url, "--start", "k\\q"])
    assert usage.value.code == 2
    assert "unknown escape" in capsys.readouterr().err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    return json.loads(run(capsys, *args, "--json"))


def _json_lines(capsys: pytest.CaptureFixture[str], *args: str) -> list[Any]:
    return [json.loads(line) for line in run(capsys, *args, "--json").splitlines()]


def test_json_outputs_parse(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (issue 32): no ``--json`` outside ``persist``; fails on /work/base."""
    shown = escape(AWKWARD)
    assert _json_lines(capsys, "scan", url, "--limit", "2") == [
        {"key": "a", "value": "1"},
        {"key": shown, "value": "v\\tw"},
    ]
    feed = _json_lines(capsys, "wal", "tail", url)
    assert feed[1] == {
        "seq": 4,
        "wal": 3,
        "kind": "put",
        "key": shown,
        "value": "v\\tw",
        "expire_at_ms": None,
    }
    inspected = _json(capsys, "inspect", url)
    assert inspected["status"] == 0 and inspected["manifest"]["writer_epoch"] == 1
    assert any(line.startswith("manifest ") for line in inspected["lines"])
    assert _json(capsys, "inspect", url, "--verify")["status"] == 0
    assert _json(capsys, "doctor", url)["status"] == 0
    assert _json(capsys, "compact", url)["l0"] == 1
    gc = _json(capsys, "gc", url, "--dry-run")
    assert gc["dry_run"] is True and isinstance(gc["deletions"], list) and gc["summary"]
    made = _json(capsys, "checkpoint", "create", url, "--name", "nightly")
    assert made["name"] == "nightly" and made["expire_time"] is None
    assert [c["id"] for c in _json(capsys, "checkpoint", "list", url)] == [made["id"]]
    refreshed = _json(capsys, "checkpoint", "refresh", url, made["id"], "--lifetime", "60")
    assert refreshed["expire_time"] is not None
    assert _json(capsys, "checkpoint", "delete", url, made["id"]) == {"deleted": made["id"]}
    cloned = _json(capsys, "clone", url, str(tmp_path / "clone"))
    assert cloned["dst"] == (tmp_path / "clone").as_uri() and cloned["held_checkpoints"]


def test_wal_tail_into_a_closed_pipe(tmp_path: Path) -> None:
    """Regression (issue 32): ``slatepy wal tail URL | head -1`` ended in a BrokenPipeError
    traceback; fails on /work/base. Exit status 1 and nothing on stderr, as Python's docs
    on SIGPIPE recommend."""
    url = f"file://{tmp_path}/db"
    batch = WriteBatch()
    for i in range(3000):  # ~0.5 MB of lines: far more than a pipe buffers
        batch.put(b"k%05d" % i, b"v" * 150)
    with Db.open(url, settings=OFF) as db:
        db.write(batch)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slatepy.cli.main", "wal", "tail", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"seq=2")
    proc.stdout.close()  # what head does after one line
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert b"Traceback" not in err and err == b""


@pytest.mark.parametrize(
    "args",
    [
        ["gc", "URL", "--min-age", "-5"],
        ["gc", "URL", "--min-age", "nan"],
        ["scan", "URL", "--limit", "-1"],
        ["inspect", "URL", "--limit", "-1"],
        ["wal", "tail", "URL", "--from-seq", "-3"],
        ["checkpoint", "create", "URL", "--lifetime", "-1"],
        ["torture", "URL", "--fault-rate", "2"],
        ["--log-level", "LOUD", "inspect", "URL"],
    ],
)
def test_bad_arguments_are_usage_errors(
    url: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 32): ``gc --min-age -5`` was accepted and deleted; fails on
    /work/base (as do the other negative limits)."""
    with pytest.raises(SystemExit) as usage:
        main([url if a == "URL" else a for a in args])
    assert usage.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_every_argument_has_help() -> None:
    """Regression (issue 32): the ``url`` argument had no help; fails on /work/base."""
    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        parser.format_help()  # a stray % in a help text fails only here
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {action.dest}")

    walk(build_parser(), "slatepy")
    assert missing == []


def test_plain_paths_are_accepted_where_urls_are(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 32): ``slatepy scan ./db`` was refused (UnsupportedStore) though
    ``Db.open(Path)`` takes a path; fails on /work/base."""
    assert run(capsys, "scan", str(tmp_path / "db"), "--limit", "1") == "a\t1\n"
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "scan", "db", "--start", "z") == "z\t26\n"
    assert main(["inspect", "nothing-here"]) == 1  # still an error, not a new database
    assert "no slatepy database" in capsys.readouterr().err
    assert not (tmp_path / "nothing-here").exists()


def test_a_file_where_a_database_should_be_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a database")
    assert main(["scan", str(tmp_path / "file")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("slatepy: ") and "Traceback" not in err


def test_log_level(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (issue 32): there was no log-level flag; fails on /work/base."""
    root = logging.getLogger()
    before = root.level
    try:
        run(capsys, "--log-level", "debug", "inspect", url)
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(before)


def test_torture_refuses_a_location_in_use_with_status_1(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal is status 1 (it was 2, the usage status); nothing is written."""
    assert main(["torture", url, "--seconds", "0"]) == 1
    assert "torture needs a location of its own" in capsys.readouterr().err


def test_wal_tail_follow_exits_143_on_sigterm(url: str) -> None:
    """A long-running command stopped by a service manager exits 128 + SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "slatepy.cli.main", "wal", "tail", url, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"seq=2")  # it is running and following
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    proc.stdout.close()
    assert proc.returncode == 143 and b"Traceback" not in err


@pytest.mark.parametrize("command", [["doctor"], ["inspect", "--verify"]])
def test_json_reports_on_a_damaged_database(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Damage is status 1 with ``--json`` too, and the report still parses."""
    from tests.engine.damaged import BUILDERS

    damaged = BUILDERS[sorted(BUILDERS)[0]](tmp_path / "db")
    assert main([command[0], damaged.url, *command[1:], "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == 1 and any(damaged.damaged in line for line in report["lines"])
