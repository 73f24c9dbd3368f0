"""Running the CLI in-process and picking lines out of what it printed."""

from __future__ import annotations

import pytest

from slatepy.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``slatepy ARGS``, assert it succeeded, and return its standard output."""
    capsys.readouterr()
    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def held_line(out: str) -> str:
    """The line of ``slatepy gc`` output that says what is held back."""
    return next(line for line in out.splitlines() if "held back:" in line)
