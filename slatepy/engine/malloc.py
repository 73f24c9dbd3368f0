"""The process's allocator: glibc's malloc keeps the memory of freed buffers.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at start) with
its own ``mmap``, returned to the system when freed, but its *dynamic* threshold rises to
the size of every such buffer freed (up to 32 MiB on 64-bit). A writer allocates and frees
buffers of megabytes all the time (WAL SSTs being encoded, compaction's read chunks and
output parts), so after the first few the threshold is high, later ones come from the heap
and its per-thread arenas, and their freed memory stays in the process, fragmented between
live small objects. Measured (issue 33, writes of 1,000,000 keys in unawaited batches,
default settings, one process each): peak RSS 227 MB, 173 MB with the threshold fixed at
128 KiB (``MALLOC_MMAP_THRESHOLD_=131072``), the Python objects traced being about 92 MB
either way. Setting the threshold explicitly turns the dynamic adjustment off
(``mallopt(3)``), which is what :func:`fix_mmap_threshold` does, once per process.

glibc also gives each thread that allocates an arena of its own (up to eight per core), and
an arena keeps what is freed into it for its own later allocations. A writer allocates in
four threads or more (the caller's, the WAL flusher, the compactor, obstore's runtime), so
its peak is each arena's peak added up. :func:`limit_arenas` caps the count with
``mallopt(M_ARENA_MAX)``: threads that start allocating afterwards share the arenas there
are. Measured (``python -m bench.growth``, default settings otherwise): 2M keys peaked at
142-147 MB with one arena, against 181-204 MB with glibc's default and 192 MB with two
(RFC 0006, stop 40 addendum). Under the GIL one arena costs little contention: two threads
of numpy arithmetic on 96 KB arrays ran no slower with one.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the mmap threshold (glibc's ``malloc.h``)."""
M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the most arenas (glibc's ``malloc.h``)."""

_lock = threading.Lock()
_set: dict[int, int] = {}  # mallopt parameter -> the value this process set it to


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None off Linux or under another C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (an AttributeError unless glibc)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def fix_mmap_threshold(threshold: int) -> bool:
    """Fix glibc malloc's mmap threshold at ``threshold`` bytes for this process (the first
    call decides; later calls change nothing). Returns whether it is fixed at
    ``threshold``.

    Does nothing (False) off Linux, under another C library (musl has no dynamic
    threshold), or when the environment sets ``MALLOC_MMAP_THRESHOLD_`` or its tunable in
    ``GLIBC_TUNABLES`` (the process's owner chose already).
    """
    return _set_once(M_MMAP_THRESHOLD, threshold, "MALLOC_MMAP_THRESHOLD_", "mmap_threshold")


def limit_arenas(arenas: int) -> bool:
    """Cap glibc malloc's arenas at ``arenas`` for this process (the first call decides;
    later calls change nothing). Returns whether they are capped at ``arenas``.

    Does nothing (False) off Linux, under another C library, or when the environment sets
    ``MALLOC_ARENA_MAX`` or its tunable in ``GLIBC_TUNABLES`` (the process's owner chose
    already). Threads that allocated before keep their arenas.
    """
    return _set_once(M_ARENA_MAX, arenas, "MALLOC_ARENA_MAX", "arena_max")


def _set_once(param: int, value: int, variable: str, tunable: str) -> bool:
    """``mallopt(param, value)`` once per process, unless the environment chose: the
    ``variable``, or ``glibc.malloc.<tunable>`` in ``GLIBC_TUNABLES``."""
    if variable in os.environ or f"glibc.malloc.{tunable}" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    with _lock:
        if param in _set:
            return _set[param] == value
        mallopt = _mallopt()
        if mallopt is None or mallopt(param, value) != 1:
            return False
        _set[param] = value
        return True


def fixed_threshold() -> int | None:
    """The threshold :func:`fix_mmap_threshold` fixed in this process, if it did."""
    return _set.get(M_MMAP_THRESHOLD)
