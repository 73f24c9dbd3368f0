"""A writer fixes glibc malloc's mmap threshold (slatepy.engine.malloc) when told to, once
per process: in child processes, as the setting is process-wide."""

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


def test_a_writer_fixes_the_threshold_when_told_to() -> None:
    assert child(", malloc_mmap_threshold=131072") == "131072"


def test_by_default_or_with_the_environment_the_allocator_is_left_alone() -> None:
    # Process-wide: a host application's large allocations would all become mmap/munmap.
    assert child("") == "None"
    assert child(", malloc_mmap_threshold=65536", MALLOC_MMAP_THRESHOLD_="262144") == "None"
