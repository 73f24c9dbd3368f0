"""The writer's lock taken by ``locks.acquire``: at once when free, after the holder lets go
when held (whether it lets go within the tries or long after, when the caller blocks)."""

from __future__ import annotations

import threading
import time

import pytest

from slatepy.engine import locks


def test_a_free_lock_is_taken_at_once() -> None:
    lock = threading.Lock()
    locks.acquire(lock)
    assert lock.locked()
    assert not lock.acquire(False)


@pytest.mark.parametrize("hold", [0.0, 0.3])
def test_a_held_lock_is_taken_once_its_holder_lets_go(hold: float) -> None:
    """0 s: the holder lets go while the caller is still trying; 0.3 s: long after its
    ``SPINS`` tries, so it blocks."""
    lock = threading.Lock()
    held, released = threading.Event(), threading.Event()
    order: list[str] = []

    def holder() -> None:
        with lock:
            held.set()
            time.sleep(hold)
            order.append("released")
            released.set()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    locks.acquire(lock)
    order.append("acquired")
    thread.join(10)
    assert order == ["released", "acquired"]
    assert lock.locked()
