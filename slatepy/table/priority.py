"""Foreground priority over this process's background work, for the GIL (issue 33 item 2).

A caller waiting for its write to become durable spends most of that wait in system calls
(``write``, ``fsync``, ``link``, a store request), each of which releases the GIL and needs it
back when it returns. A background compaction in the same process takes the GIL meanwhile
and keeps it until its next yield point or until the interpreter's switch interval (5 ms)
forces it off, so the caller waits up to that long *after each call*: five or so per WAL
SST. Measured in ``python -m bench --workload reopen`` (200,000 awaited rows in batches of
1,000 right after 200,000 unawaited puts): the compactor used 0.7-1.0 s of CPU during that
phase against the writer's 0.45-0.55 s, and an awaited batch took 5-8 ms of wall time
against 2.1-2.6 ms in a process without compaction running.

:data:`FOREGROUND` is the process's gate: a durable write holds it (``with FOREGROUND:``)
while it waits for its WAL SST, and background work calls :meth:`Foreground.yield_to` at
its yield points (where it used to ``time.sleep(0)``): while a foreground wait is open it
blocks there, GIL released, until a foreground wait ends, for at most ``PAUSE_MAX`` seconds
per yield point, so background work always progresses (a yield point comes every few hundred
rows), and under overlapping waits (several writing threads) it moves on at each one's end.
The pause moves compaction work later, it does not remove it; a writer that outruns its
compactor still meets the write stall at ``max_unflushed_bytes``, during which nothing holds
the gate and compaction runs unhindered. A compactor in another process never pauses.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

PAUSE_MAX = 0.01
"""Seconds background work waits at one yield point for foreground waits to end: about
two switch intervals, longer than a WAL SST's write on a quiet disk."""


class Foreground:
    """Counts the foreground waits open in this process; background work yields to them.

    A context manager (re-entrant per thread and shared by threads: it only counts).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.active = 0
        """Foreground waits open now."""
        self._ended = 0  # foreground waits ended so far: a pause ends at the next one
        self.pauses = 0
        """Times background work paused for one (for tests and benchmarks)."""

    def __enter__(self) -> None:
        with self._cond:
            self.active += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._cond:
            self.active -= 1
            self._ended += 1
            self._cond.notify_all()

    def yield_to(self, max_wait: float = PAUSE_MAX, *, hand_off: bool = True) -> None:
        """A background yield point: if a foreground wait is open, wait until one ends, at
        most ``max_wait`` seconds; otherwise, with ``hand_off``, hand the GIL to any thread
        that wants it (``time.sleep(0)``).

        The hand-off is a timed sleep, 25-110 µs on the shared machine whether or not any
        thread wants the GIL (10-14% of a compaction's wall time at a yield point every
        millisecond), and without it a thread that gave up the GIL for I/O (a get's read)
        waits out the interpreter's switch interval: a compaction that handed off every 2 ms
        instead cut the gets running beside it by a third. So background work passes
        ``hand_off=False`` only when no foreground of its own is left (a closing writer's
        compactions)."""
        if self.active:  # read without the lock: a stale answer costs one pause or one skip
            with self._cond:
                if self.active:
                    # Until the first open wait ends, not until none is open: with writes
                    # overlapping (several threads, a slow store) none open is rare, and
                    # every yield point would cost the whole max_wait.
                    ended = self._ended
                    self.pauses += 1
                    self._cond.wait_for(lambda: self._ended != ended, max_wait)
                    return
        if hand_off:
            time.sleep(0)


FOREGROUND = Foreground()
"""The process's gate (the GIL is per process too)."""
