"""Write batches and the validation every write goes through."""

from __future__ import annotations

from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE
from slatepy.errors import InvalidArgument

Op = tuple[bytes, bytes | None]
"""``(key, value)``; value None deletes the key."""


def check_key(key: object) -> bytes:
    """Return ``key`` as bytes or raise ``InvalidArgument``."""
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidArgument(f"keys must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise InvalidArgument("keys must not be empty")
    if len(key) > MAX_KEY_SIZE:
        raise InvalidArgument(f"key of {len(key)} bytes exceeds the limit of {MAX_KEY_SIZE}")
    return key


def check_value(value: object) -> bytes:
    """Return ``value`` as bytes or raise ``InvalidArgument``."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(f"values must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_VALUE_SIZE:
        raise InvalidArgument(f"value of {len(value)} bytes exceeds the limit of {MAX_VALUE_SIZE}")
    return value


def check_range(start: object, end: object) -> None:
    """Raise ``InvalidArgument`` unless ``start``/``end`` are scan bounds (end may be None)."""
    if not isinstance(start, bytes) or not (end is None or isinstance(end, bytes)):
        raise InvalidArgument("scan bounds must be bytes (end may be None)")
    if end is not None and end < start:
        raise InvalidArgument(f"scan start {start!r} is after end {end!r}")


class WriteBatch:
    """Puts and deletes applied atomically by ``Db.write``: all become durable, or none.

    Arguments are validated as they are added, so a bad call fails before the batch is
    written. Within a batch the last operation on a key wins.
    """

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[Op] = []

    def put(self, key: bytes, value: bytes) -> WriteBatch:
        self._ops.append((check_key(key), check_value(value)))
        return self

    def delete(self, key: bytes) -> WriteBatch:
        self._ops.append((check_key(key), None))
        return self

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def ops(self) -> list[Op]:
        return list(self._ops)
