"""A process that exits without ``close()`` still makes its buffered writes durable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from slatepy import Db, Settings
from tests.processes import ROOT

CHILD = textwrap.dedent(
    """
    import sys
    from slatepy import Db, Settings
    db = Db.open(sys.argv[1], settings=Settings(flush_interval=60, compactor="off"))
    for i in range(100):
        db.put(b"k%03d" % i, b"v", await_durable=False)
    # exits without close(): before, these 100 writes were silently dropped
    """
)


def test_unclosed_database_flushes_at_exit_and_warns(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert "was not closed: flushing 100 buffered writes at exit" in child.stderr
    with Db.open(url, settings=Settings(compactor="off")) as db:
        assert [db.get(b"k%03d" % i) for i in range(100)] == [b"v"] * 100
