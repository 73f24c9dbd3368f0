"""The write path's validate step (``persist/pipeline.py``): bounds and updates from a
caller are checked before anything is written (RFC 0015 §2, §6.2).

Keys and values must be ``bytes``, times u64 within the bounds, diffs i64, and the encoded
key at most 65,535 bytes; a malformed value raises ``UsageError`` (``UsageTypeError`` for a
wrong type), an empty range ``InvalidBounds``. Nothing here does I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any, TypeGuard

from slatepy.persist.codec import (
    ALWAYS_FITS,
    I64_MAX,
    I64_MIN,
    MAX_ENCODED_KEY,
    U64_MAX,
    Update,
    encoded_key_size,
)
from slatepy.persist.errors import InvalidBounds, UsageError, UsageTypeError
from slatepy.persist.frontier import Frontier

_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_third = operator.itemgetter(2)


def check_time(time: object, what: str = "time") -> int:
    """Return ``time`` if it is a u64 ``int``; else raise ``UsageError``."""
    if type(time) is not int:
        raise UsageTypeError(
            f"{what} must be an int in [0, 2**64), not {type(time).__name__} {time!r}"
        )
    if not 0 <= time <= U64_MAX:
        raise UsageError(f"{what} must be an int in [0, 2**64), not {time!r}")
    return time


def check_frontier(frontier: object, what: str) -> Frontier:
    """Return ``frontier`` if it is a u64 ``int`` or ``None``; else raise ``UsageError``."""
    return None if frontier is None else check_time(frontier, what)


def check_bounds(lower: int | None, upper: Frontier, *, names: tuple[str, str]) -> None:
    """Raise ``InvalidBounds`` unless ``lower < upper`` (``None`` greatest; a ``None``
    lower is beyond every upper). ``names`` name the two arguments in the message."""
    if lower is None or (upper is not None and upper <= lower):
        raise InvalidBounds(
            f"{names[1]} {upper!r} must be beyond {names[0]} {lower!r} "
            "(None, the closed frontier, is beyond every time; nothing is beyond None)"
        )


def check_updates(updates: Iterable[object], lower: int, upper: Frontier) -> list[Update]:
    """Validate ``updates`` for a batch or append over ``[lower, upper)``.

    Keys and values must be ``bytes``, times u64 within ``[lower, upper)``, diffs i64, and
    the encoded key at most 65,535 bytes. Returns the updates as a new list.

    Raises:
        UsageError: the first update that breaks a rule, with its index.
    """
    items = list(updates)
    if _plainly_valid(items, lower, upper):
        return items
    return _check_each(items, lower, upper)


def _plainly_valid(items: list[Any], lower: int, upper: Frontier) -> TypeGuard[list[Update]]:
    """Whether every update is a plain ``((bytes, bytes), int, int)`` tuple within the rules,
    found by C-level maps over whole columns (a large batch is checked at a fraction of the
    per-update loop's cost). False sends the batch to :func:`_check_each`, which names the
    first update that breaks a rule (or accepts what is merely not a plain tuple)."""
    if not items:
        return True
    if set(map(type, items)) != {tuple} or set(map(len, items)) != {3}:
        return False
    pairs = list(map(_first, items))
    if set(map(type, pairs)) != {tuple} or set(map(len, pairs)) != {2}:
        return False
    keys, values = list(map(_first, pairs)), list(map(_second, pairs))
    times, diffs = list(map(_second, items)), list(map(_third, items))
    if {*map(type, keys), *map(type, values)} != {bytes}:
        return False
    if {*map(type, times), *map(type, diffs)} != {int}:
        return False
    return (
        0 <= lower <= min(times)
        and max(times) < (U64_MAX + 1 if upper is None else upper)
        and min(diffs) >= I64_MIN
        and max(diffs) <= I64_MAX
        and max(map(len, keys)) + max(map(len, values)) <= ALWAYS_FITS
    )


def _check_each(items: list[object], lower: int, upper: Frontier) -> list[Update]:
    checked: list[Update] = []
    key: object
    value: object
    time: object
    diff: object
    for i, update in enumerate(items):
        try:
            (key, value), time, diff = update  # type: ignore[misc]
        except (TypeError, ValueError):
            raise UsageTypeError(
                f"update {i} is not ((key, value), time, diff): {update!r}"
            ) from None
        if type(key) is not bytes or type(value) is not bytes:
            what, field = ("key", key) if type(key) is not bytes else ("value", value)
            raise UsageTypeError(
                f"update {i}: the {what} must be bytes, not {type(field).__name__}"
            )
        time = check_time(time, f"update {i}: time")
        if not (lower <= time and (upper is None or time < upper)):
            raise UsageError(f"update {i}: time {time} is outside [{lower}, {upper})")
        if type(diff) is not int:
            raise UsageTypeError(
                f"update {i}: diff must be an int in [-2**63, 2**63), "
                f"not {type(diff).__name__} {diff!r}"
            )
        if not I64_MIN <= diff <= I64_MAX:
            raise UsageError(f"update {i}: diff must be an int in [-2**63, 2**63), not {diff!r}")
        if len(key) + len(value) > ALWAYS_FITS and encoded_key_size(key, value) > MAX_ENCODED_KEY:
            raise UsageError(
                f"update {i}: key and value are too large together "
                f"(encoded {encoded_key_size(key, value)} bytes > {MAX_ENCODED_KEY})"
            )
        checked.append(((key, value), time, diff))
    return checked


def check_range(lower: object, upper: object, names: tuple[str, str]) -> None:
    """:func:`check_bounds` for values from a caller: u64 ints (a None upper), else
    ``UsageError``; then ``InvalidBounds`` unless ``lower < upper``. A None lower passes
    to ``check_bounds``, which calls it out of order (nothing is beyond None)."""
    checked = None if lower is None else check_time(lower, names[0])
    check_bounds(checked, check_frontier(upper, names[1]), names=names)
