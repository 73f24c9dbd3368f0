"""A bulk-load task's peak RSS does not grow with its partition (issue 28): the rows pass
``bufferBytes`` and spill to sorted runs merged at most ``FAN_IN`` at a time. Measured as
the whole process's peak RSS (``ru_maxrss``), which sees Arrow's buffers and the allocator
as well as Python objects, one child process per size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.processes import ROOT

BUDGET = 16 << 20


def peak_rss(tmp_path: Path, rows: int) -> int:
    url = f"file://{tmp_path}/{rows}"
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.load_task_rss", url, str(rows), str(BUDGET)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(done.stdout.split()[-1])


def test_a_load_task_four_times_larger_peaks_at_the_same_rss(tmp_path: Path) -> None:
    # 300,000 rows count ~4x the budget, 1,200,000 ~16x (a merge of FAN_IN runs). Without
    # the budget (buffering everything) this machine measured 233 vs 488 MB; with it 172
    # vs 174 MB.
    small = peak_rss(tmp_path, 300_000)
    large = peak_rss(tmp_path, 1_200_000)
    assert large <= small + (32 << 20), (small >> 20, large >> 20)
