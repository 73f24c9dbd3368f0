"""Key ranges of a snapshot: split points from the parts' key bounds, and a run pruned to
the parts that may hold keys of a range (a snapshot read split across several readers,
RFC 0025 Addendum A).

A range is ``[lower, upper)`` of **update keys** (``None``: unbounded). Consolidation sums
diffs per ``(key, value, time)``, so a read that keeps whole keys in one range and the union
of the ranges covers every key gives exactly the consolidated snapshot, split.

Bounds come from ``HollowPart.key_lower`` (the first encoded key, truncated to
``KEY_LOWER_BYTES``): every entry of a part is at or above it, and below the first key of
any later part of its run. ``codec.escape`` is order preserving and prefix free, so an
encoded entry key is ``>= escape(k)`` exactly when its update key is ``>= k``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from itertools import pairwise

from slatepy.persist.codec import Update, escape
from slatepy.persist.parts import KEY_LOWER_BYTES
from slatepy.persist.state.records import HollowPart, Part, Run

_TERMINATOR = b"\0\x01"
_ESCAPED_NUL = b"\0\xff"


def part_key(key_lower: bytes) -> bytes | None:
    """The update key a part's ``key_lower`` starts with, or None when the truncation cut it."""
    end = key_lower.find(_TERMINATOR)  # an escaped NUL is "\0\xff": never a terminator
    if end < 0:
        return None
    field = key_lower[:end]
    if field.count(0) != field.count(_ESCAPED_NUL):
        return None
    return field.replace(_ESCAPED_NUL, b"\0")


def split_keys(runs: Sequence[Run], pieces: int) -> list[bytes]:
    """At most ``pieces - 1`` increasing update keys cutting the runs' parts into ``pieces``
    ranges of about as many parts (``[]``: one range; too few blob parts to split)."""
    if pieces < 2:
        return []
    keys = sorted(
        {
            key
            for run in runs
            for part in run
            if isinstance(part, HollowPart)
            for key in (part_key(part.key_lower),)
            if key is not None
        }
    )
    cuts = {keys[i * len(keys) // pieces] for i in range(1, pieces)} if len(keys) > 1 else set()
    cuts.discard(keys[0] if keys else b"")  # a cut at the smallest key leaves a range empty
    return sorted(cuts)


def ranges(cuts: Sequence[bytes]) -> list[tuple[bytes | None, bytes | None]]:
    """The ``len(cuts) + 1`` ranges the increasing ``cuts`` bound, together every key."""
    bounds: list[bytes | None] = [None, *cuts, None]
    return list(pairwise(bounds))


def prune(run: Run, lower: bytes | None, upper: bytes | None) -> Run:
    """``run`` without the blob parts that hold no key of ``[lower, upper)`` (inline parts
    are kept: they cost no GET)."""
    if lower is None and upper is None:
        return run
    low = None if lower is None else escape(lower)
    high = None if upper is None else escape(upper)
    hollow_lowers: list[bytes | None] = [
        p.key_lower if isinstance(p, HollowPart) else None for p in run
    ]
    kept: list[Part] = []
    for i, part in enumerate(run):
        if not isinstance(part, HollowPart):
            kept.append(part)
            continue
        if high is not None and part.key_lower >= high:
            continue  # every entry >= key_lower >= escape(upper)
        above = next((b for b in hollow_lowers[i + 1 :] if b is not None), None)
        if low is not None and above is not None and _all_below(above, low):
            continue
        kept.append(part)
    return tuple(kept)


def _all_below(prefix: bytes, bound: bytes) -> bool:
    """Whether every key below the first key ``F`` of a part whose ``key_lower`` is
    ``prefix`` (``F`` starts with it; is it when shorter than the cut) is below ``bound``."""
    if len(prefix) < KEY_LOWER_BYTES:
        return prefix <= bound
    return prefix < bound and not bound.startswith(prefix)


def in_range(
    updates: Iterable[Update], lower: bytes | None, upper: bytes | None
) -> Generator[Update, None, None]:
    """The updates whose key lies in ``[lower, upper)`` (byte order is the keys' order)."""
    for update in updates:
        key = update[0][0]
        if (lower is None or key >= lower) and (upper is None or key < upper):
            yield update
