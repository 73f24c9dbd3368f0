"""docs/cli-conventions.md runs as shown: its ``sh`` blocks, in order, by ``bash`` in one
empty directory with this checkout's ``slatepy``; a ``text`` block right after one is its
expected standard output. (No ``pipefail``: the page shows ``| head -1``, whose writer may
see the closed pipe, exit status 1, by design.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli-conventions.md"
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def test_the_cli_conventions_page_runs_as_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("SLATEPY_") and not name.startswith("SLATEPY_TEST_"):
            monkeypatch.delenv(name)
    root = str(DOC.parents[1])
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    blocks = [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text())]
    ran = 0
    for i, (language, code) in enumerate(blocks):
        if language != "sh":
            continue
        done = subprocess.run(
            ["bash", "-eu", "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{code}\n{done.stderr}"
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        if after is not None and after[0] == "text":
            assert done.stdout == after[1], f"{code}\nprinted {done.stdout!r}"
        ran += 1
    assert ran == 4
