"""Frontiers of totally ordered u64 times (RFC 0015 §2).

A frontier is an ``int`` or ``None``; ``None`` is the empty antichain, greater than every
time (a closed upper, a since that allows no more reads). Only these helpers compare
frontiers, so the ``None`` case is never forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable

from slatepy.persist.errors import SinceError

Frontier = int | None


def le(a: Frontier, b: Frontier) -> bool:
    """``a <= b`` with ``None`` greatest."""
    return b is None or (a is not None and a <= b)


def lt(a: Frontier, b: Frontier) -> bool:
    """``a < b`` with ``None`` greatest."""
    return a is not None and (b is None or a < b)


def meet(frontiers: Iterable[Frontier]) -> Frontier:
    """The least of ``frontiers`` (``None`` when all are ``None`` or there are none)."""
    least: Frontier = None
    for f in frontiers:
        if f is not None and (least is None or f < least):
            least = f
    return least


def join(a: Frontier, b: Frontier) -> Frontier:
    """The greater of ``a`` and ``b``."""
    return a if le(b, a) else b


def contains(lower: int, upper: Frontier, t: int) -> bool:
    """Whether ``t`` is in ``[lower, upper)``."""
    return lower <= t and (upper is None or t < upper)


def check_as_of(as_of: Frontier, since: Frontier) -> int:
    """Return ``as_of`` if a handle whose since is ``since`` may read at it.

    Raises:
        SinceError: ``as_of`` is ``None`` or before ``since`` (those times may be compacted).
    """
    if as_of is None or not le(since, as_of):
        raise SinceError(as_of, since)
    return as_of
