"""Starting helper processes of the test suite (``python -m tests.…``) from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def spawn(module: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """Run ``python -m module args…`` with this interpreter, text pipes as given in ``popen``."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **popen,
    )
