"""A writer fixes glibc malloc's mmap threshold (slatepy.engine.malloc) when told to, and a
writer's or reader's open caps its arenas, once per process: in child processes, as the
settings are process-wide."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from slatepy import Db

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


ARENAS = """
import ctypes, threading
from slatepy import Db, DbReader, Settings

libc = ctypes.CDLL(None)
libc.open_memstream.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]


def arenas():  # malloc_info's XML has a <heap nr=...> per arena
    text, size = ctypes.c_char_p(), ctypes.c_size_t()
    out = libc.open_memstream(ctypes.byref(text), ctypes.byref(size))
    libc.malloc_info(0, out)
    libc.fclose(out)
    xml = ctypes.string_at(text, size.value)
    libc.free(text)
    return xml.count(b"<heap nr=")


settings = Settings(compactor="off"{extra})
before = arenas()
with {handle}:
    pass


together = threading.Barrier(6)


def allocate():  # blocks above pymalloc's 512 bytes: from this thread's arena
    keep = [bytearray(4096) for _ in range(64)]
    together.wait(30)  # all alive at once: an exited thread's arena would serve the next
    assert len(keep) == 64


threads = [threading.Thread(target=allocate) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(arenas() - before)
"""

WRITER = 'Db.open(f"file://{path}", settings=settings)'
READER = 'DbReader.open(f"file://{path}", settings=settings)'


def new_arenas(tmp_path: Path, handle: str, extra: str = "", **env: str) -> int:
    """Arenas created in a child process by six threads that allocate after ``handle``
    opened and closed (with ``extra`` settings and ``env``)."""
    environ = {
        k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")
    }
    code = ARENAS.replace("{extra}", extra).replace(
        "{handle}", handle.replace("{path}", str(tmp_path))
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


def test_a_writer_or_reader_open_caps_the_arenas_threads_then_share(tmp_path: Path) -> None:
    with Db.open(f"file://{tmp_path}"):
        pass  # the database a reader opens
    assert new_arenas(tmp_path, WRITER) == 0
    assert new_arenas(tmp_path, READER) == 0
    # The cap is what keeps them from growing: without it every thread gets its own arena.
    assert new_arenas(tmp_path, WRITER, ", malloc_arena_max=None") >= 5
    # Several arenas if asked (the six threads fill the new ones, then share).
    assert 1 <= new_arenas(tmp_path, WRITER, ", malloc_arena_max=3") <= 2


def test_an_environment_that_chose_its_arenas_is_left_alone(tmp_path: Path) -> None:
    assert new_arenas(tmp_path, WRITER, MALLOC_ARENA_MAX="8") >= 5
    assert new_arenas(tmp_path, WRITER, GLIBC_TUNABLES="glibc.malloc.arena_max=8") >= 5
