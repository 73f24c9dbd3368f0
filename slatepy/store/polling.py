"""How often to poll a store for changes: fast while things change, slowly while idle.

Every poll costs requests whether or not anything changed, and an idle database is polled far
more often than it changes. A poller therefore doubles its interval after each poll that found
nothing, up to a ceiling, and snaps back to the base interval as soon as one finds something
(or someone reports activity). While active, a change is seen within the base interval; while
idle, within the ceiling, at a cost of about one poll per ceiling.
"""

from __future__ import annotations

import threading


class IdleBackoff:
    """The interval to wait before the next poll (the poller owns the sleeping).

    ``polled`` (the poller's thread) and ``activity`` (writers) change ``current`` and
    ``idle`` together under a lock, so the two never disagree: an ``idle`` left false over a
    long interval would keep writes from waking the poller until its next poll.
    """

    def __init__(self, base: float, ceiling: float, *, factor: float = 2.0) -> None:
        if base <= 0 or factor < 1:
            raise ValueError("base must be > 0 and factor >= 1")
        self.base = base
        self.ceiling = max(base, ceiling)
        self.factor = factor
        self.current = base
        self.idle = False
        """Whether the last polls found nothing (the interval is above the base). An
        attribute kept with ``current``, not a property: every single put reads it."""
        self._lock = threading.Lock()

    def polled(self, *, changed: bool) -> float:
        """Record a poll's outcome; return the interval before the next one."""
        with self._lock:
            current = self.base if changed else min(self.ceiling, self.current * self.factor)
            self.current, self.idle = current, current > self.base
            return current

    def activity(self) -> bool:
        """Something changed that no poll has seen yet: back to the base interval. Returns
        whether the poller was idle (then it should be woken: it may be in a long sleep)."""
        with self._lock:
            was_idle = self.idle
            self.current, self.idle = self.base, False
            return was_idle
