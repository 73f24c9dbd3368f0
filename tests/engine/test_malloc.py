"""A writer fixes glibc malloc's mmap threshold (slatepy.engine.malloc), once per process,
unless told not to: in child processes, as the setting is process-wide."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CHILD = """
import sys
from slatepy import Db, Settings
from slatepy.engine.malloc import fixed_threshold
settings = Settings(compactor="off"{extra})
with Db.open("memory://", settings=settings) as db:
    db.put(b"k", b"v")
print(fixed_threshold())
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc only",
)


def child(extra: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(extra=extra)],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_a_writer_fixes_the_threshold_by_default() -> None:
    assert child("") == "131072"  # the default: 128 KiB


def test_none_or_the_environment_leave_the_allocator_alone() -> None:
    assert child(", malloc_mmap_threshold=None") == "None"
    assert child(", malloc_mmap_threshold=65536", MALLOC_MMAP_THRESHOLD_="262144") == "None"
