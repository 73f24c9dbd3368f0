"""Write batches and the validation every write goes through."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import cast, overload

from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE
from slatepy.errors import InvalidArgument, InvalidType
from slatepy.format.kinds import Expiring, Operands

Op = tuple[bytes, bytes | None]
"""``(key, value)``; value None deletes the key."""


def check_key(key: object) -> bytes:
    """Return ``key`` as bytes or raise ``InvalidArgument`` (``InvalidType``, also a
    ``TypeError``, for a key that is not bytes-like)."""
    # Every write and read passes here: plain, valid bytes are returned after one class
    # check (the union isinstance and the copy below cost ~5x more); the rest, errors
    # included, take the full path.
    if type(key) is bytes and 0 < len(key) <= MAX_KEY_SIZE:
        return key
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidType(f"keys must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise InvalidArgument("keys must not be empty")
    if len(key) > MAX_KEY_SIZE:
        raise InvalidArgument(f"key of {len(key)} bytes exceeds the limit of {MAX_KEY_SIZE}")
    return key


def check_value(value: object) -> bytes:
    """Return ``value`` as bytes or raise ``InvalidArgument``."""
    if type(value) is bytes and len(value) <= MAX_VALUE_SIZE:
        return value  # plain bytes: see check_key
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidType(f"values must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_VALUE_SIZE:
        raise InvalidArgument(f"value of {len(value)} bytes exceeds the limit of {MAX_VALUE_SIZE}")
    return value


def check_ttl(ttl: object) -> float:
    """Return ``ttl`` (seconds, a positive finite number) or raise ``InvalidArgument``."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidType(f"ttl must be a number of seconds, got {type(ttl).__name__}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise InvalidArgument(
            f"ttl must be a positive number of seconds, got {ttl!r} "
            "(use delete() to remove a key now)"
        )
    return float(ttl)


def expiring(value: bytes, ttl: float, now_ms: int) -> Expiring:
    """``value`` written at ``now_ms`` to live ``ttl`` seconds (at least 1 ms)."""
    return Expiring.make(value, now_ms + max(1, math.ceil(ttl * 1000)))


def check_delete_range(start: object, end: object) -> tuple[bytes, bytes]:
    """Return the bounds of a ``delete_range`` or raise ``InvalidArgument``; ``start`` may be
    empty (from the first key on)."""
    start = b"" if start == b"" else check_key(start)
    end = check_key(end)
    if start >= end:
        raise InvalidArgument(
            f"delete_range start {start!r} must be below end {end!r} (end is exclusive)"
        )
    return start, end


def check_range(start: object, end: object) -> None:
    """Raise ``InvalidArgument`` unless ``start``/``end`` are scan bounds (end may be None)."""
    if not isinstance(start, bytes) or not (end is None or isinstance(end, bytes)):
        raise InvalidType("scan bounds must be bytes (end may be None)")
    if end is not None and end < start:
        raise InvalidArgument(f"scan start {start!r} is after end {end!r}")


class PutColumns(Sequence[tuple[bytes, bytes]]):
    """A batch of puts alone, as a column of keys and one of values (``WriteBatch.puts_at``).

    It reads as the sequence of ``(key, value)`` ops ``Db._apply`` takes, so every path
    that takes ops takes it; ``Db._append_puts`` uses the columns themselves and skips
    splitting ops and checking their kinds (a pass over the batch each).
    """

    __slots__ = ("keys", "values")

    def __init__(self, keys: list[bytes], values: list[bytes]) -> None:
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return zip(self.keys, self.values, strict=True)

    @overload
    def __getitem__(self, index: int) -> tuple[bytes, bytes]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[bytes, bytes]]: ...

    def __getitem__(self, index: int | slice) -> tuple[bytes, bytes] | list[tuple[bytes, bytes]]:
        if isinstance(index, slice):
            return list(zip(self.keys[index], self.values[index], strict=True))
        return self.keys[index], self.values[index]


class WriteBatch:
    """Puts, deletes and range deletes applied atomically by ``Db.write``: all become
    durable, or none.

    Arguments are validated as they are added, so a bad call fails before the batch is
    written. Within a batch the last operation on a key wins (a ``delete_range`` removes the
    batch's earlier operations on keys in its range; later ones stay).
    """

    # The ops are two parallel columns rather than a list of (key, value) tuples: a put
    # appends to both (no tuple to allocate), and a batch of puts alone reaches the memtable
    # and the WAL buffer as the columns they take (``puts_at``).
    __slots__ = ("_keys", "_puts_only", "_ranges", "_ttls", "_values")

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []  # None deletes; Operands merge
        self._ttls: dict[int, float | None] = {}  # index in the columns -> ttl, for puts given one
        self._ranges: list[tuple[bytes, bytes]] = []
        self._puts_only = True
        """True while every op is a put (no delete or merge was added): the values are bytes."""

    def put(self, key: bytes, value: bytes, *, ttl: float | None = None) -> WriteBatch:
        """Set ``key``; with ``ttl`` (seconds, counted from when the batch is written) it
        reads as absent once that time has passed (RFC 0019)."""
        # check_key/check_value's fast paths inlined: this runs once per entry of a batch.
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_SIZE:
            key = check_key(key)
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE:
            value = check_value(value)
        if ttl is not None:
            self._ttls[len(self._keys)] = check_ttl(ttl)
        self._keys.append(key)
        self._values.append(value)
        return self

    def delete(self, key: bytes) -> WriteBatch:
        self._keys.append(check_key(key))
        self._values.append(None)
        self._puts_only = False
        return self

    def merge(self, key: bytes, operand: bytes) -> WriteBatch:
        """Add a merge operand to ``key`` (see ``Db.merge``); the database must have a merge
        operator. Operands on one key in a batch apply in the order added."""
        key, operand = check_key(key), check_value(operand)
        self._keys.append(key)
        self._values.append(Operands.of([operand]))
        self._puts_only = False
        return self

    @property
    def has_merges(self) -> bool:
        if self._puts_only:
            return False
        return Operands in set(map(type, self._values))  # C-level: once a batch

    def delete_range(self, start: bytes, end: bytes) -> WriteBatch:
        """Delete every key ``start <= key < end`` (as of this batch)."""
        start, end = check_delete_range(start, end)
        keys, values = self._keys, self._values
        kept = [i for i, key in enumerate(keys) if not start <= key < end]
        if len(kept) < len(keys):
            self._ttls = {j: self._ttls[i] for j, i in enumerate(kept) if i in self._ttls}
            self._keys = [keys[i] for i in kept]
            self._values = [values[i] for i in kept]
        self._ranges.append((start, end))
        return self

    def __len__(self) -> int:
        return len(self._keys) + len(self._ranges)

    @property
    def ops(self) -> list[Op]:
        """The puts (without their TTLs), deletes and merges (values of class ``Operands``)."""
        return list(zip(self._keys, self._values, strict=True))

    @property
    def ranges(self) -> list[tuple[bytes, bytes]]:
        """The ``delete_range`` bounds, in the order given."""
        return list(self._ranges)

    def ops_at(self, now_ms: int, default_ttl: float | None) -> list[Op]:
        """The puts and deletes as written at ``now_ms``: a put with a TTL (its own, else
        ``default_ttl``) becomes an expiring value."""
        return list(zip(self._keys, self._values_at(now_ms, default_ttl), strict=True))

    def puts_at(self, now_ms: int, default_ttl: float | None) -> PutColumns | None:
        """:meth:`ops_at` as columns if the batch holds puts alone (no delete, merge or
        range delete), else None."""
        if not self._puts_only or self._ranges:
            return None
        # Only puts were added, so every value is bytes (an Expiring once a TTL applies).
        values = cast(list[bytes], self._values_at(now_ms, default_ttl))
        return PutColumns(list(self._keys), values)

    def _values_at(self, now_ms: int, default_ttl: float | None) -> list[bytes | None]:
        """A copy of the values as written at ``now_ms`` (see :meth:`ops_at`)."""
        if not self._ttls and default_ttl is None:
            return list(self._values)
        out: list[bytes | None] = []
        ttls = self._ttls
        for i, value in enumerate(self._values):
            ttl = ttls.get(i, default_ttl)
            written = value
            if ttl is not None and value is not None and value.__class__ is bytes:
                written = expiring(value, ttl, now_ms)  # deletes and merges take no TTL
            out.append(written)
        return out
