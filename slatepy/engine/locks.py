"""Taking the writer's lock without queueing behind the GIL.

When a thread blocks on a ``threading.Lock`` and the holder releases it, the sleeper is
given the lock at once but must still win the GIL to run. Meanwhile the thread that holds
the GIL needs the lock for its next write, blocks, and hands the GIL on; with several
threads writing, almost every write then pays a kernel sleep and wake-up instead of the few
microseconds it holds the lock for (4 threads committing transactions ran at half of one
thread's rate; RFC 0020, "Several threads").

:func:`acquire` tries first; on contention it gives up the GIL (``time.sleep(0)``) so the
holder, which only loses the lock when it runs, can finish, and tries again. Only after
``SPINS`` tries, when the holder is doing something long under the lock, does it block.
"""

from __future__ import annotations

import threading
import time

SPINS = 20
"""Tries before blocking. A write holds the lock for a few microseconds and a GIL hand-off
takes about as long, so a holder that is running lets go within a try or two."""


def acquire(lock: threading.Lock) -> None:
    """Take ``lock``, yielding the GIL between tries before blocking on it."""
    if lock.acquire(False):
        return
    for _ in range(SPINS):
        time.sleep(0)
        if lock.acquire(False):
            return
    lock.acquire()
