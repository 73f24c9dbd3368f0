"""The process's allocator: glibc's malloc keeps the memory of freed large buffers.

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
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the mmap threshold (glibc's ``malloc.h``)."""

_lock = threading.Lock()
_fixed: int | None = None


def fix_mmap_threshold(threshold: int) -> bool:
    """Fix glibc malloc's mmap threshold at ``threshold`` bytes for this process (the first
    call decides; later calls change nothing). Returns whether it is fixed at
    ``threshold``.

    Does nothing (False) off Linux, under another C library (musl has no dynamic
    threshold), or when the environment sets ``MALLOC_MMAP_THRESHOLD_`` (the process's
    owner chose already).
    """
    global _fixed
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    with _lock:
        if _fixed is not None:
            return _fixed == threshold
        try:
            libc = ctypes.CDLL(None)
            libc.gnu_get_libc_version  # noqa: B018 (an AttributeError unless glibc)
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        if mallopt(M_MMAP_THRESHOLD, threshold) != 1:
            return False
        _fixed = threshold
        return True


def fixed_threshold() -> int | None:
    """The threshold :func:`fix_mmap_threshold` fixed in this process, if it did."""
    return _fixed
