"""Merge operators: combining ``Db.merge`` operands into values (RFC 0019).

A merge operator is any callable ``(key, existing, operands) -> bytes``: ``existing`` is the
value beneath the operands (None: none, deleted or expired), ``operands`` the operands in the
order written. It must be deterministic and must not depend on how the operands are grouped
only in the sense that the engine always passes *every* operand above a base at once; it
never asks for a partial merge of operands alone (operands are stacked, not combined, until
a base or the bottom of the database is known).

:class:`Merging` carries the operator with the clock that says whether a TTL'd base is still
live; it is the one place operands meet values: the memtable and the WAL buffer stack a
newer operand on the version they hold (:meth:`Merging.stack`), reads and compaction fold a
key's versions (:meth:`Merging.fold`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slatepy.errors import InvalidArgument
from slatepy.format.kinds import Expiring, Operands


class MergeOperator(Protocol):
    """``(key, existing value or None, operands oldest first) -> new value``."""

    def __call__(self, key: bytes, existing: bytes | None, operands: list[bytes], /) -> bytes: ...


def missing_operator(key: bytes) -> InvalidArgument:
    return InvalidArgument(
        f"key {key!r} holds merge operands but no merge operator is configured: open the "
        "database (Db.open, DbReader.open, Compactor) with merge_operator=..."
    )


@dataclass(frozen=True, slots=True)
class Merging:
    """A merge operator (None: none configured) and the wall clock (seconds) that judges
    whether a TTL'd base value is live."""

    operator: MergeOperator | None = None
    clock: Callable[[], float] = time.time

    def at(self, clock: Callable[[], float]) -> Merging:
        """This operator judging a TTL'd base by ``clock``: a view's, stopped when it was
        taken, so a held view folds operands over a base the same way however long it is
        read (RFC 0026, stop 41)."""
        if self.operator is None or clock is self.clock:
            return self
        return Merging(self.operator, clock)

    def apply(self, key: bytes, base: bytes | None, operands: Operands) -> bytes:
        """The value of ``operands`` over ``base`` (a stored value: None, plain or
        :class:`Expiring`). Over a live TTL'd value the result keeps its expiry; over an
        expired one the operands apply to nothing.

        Raises:
            InvalidArgument: no operator, or it returned something other than bytes.
        """
        operator = self.operator
        if operator is None:
            raise missing_operator(key)
        if isinstance(base, Expiring):
            if base.expired(int(self.clock() * 1000)):
                return self._call(key, None, operands)
            return Expiring.make(self._call(key, base.value, operands), base.expire_at_ms)
        return self._call(key, None if base is None else bytes(base), operands)

    def _call(self, key: bytes, base: bytes | None, operands: Operands) -> bytes:
        assert self.operator is not None
        try:
            result = self.operator(key, base, operands.operands())
        except Exception as exc:
            # User code: a typed error naming the key, wherever the engine called it (a
            # write, a read, a compaction), with the operator's own error as the cause.
            raise InvalidArgument(
                f"the merge operator raised {type(exc).__name__} for key {key!r}: {exc}"
            ) from exc
        if not isinstance(result, bytes | bytearray | memoryview):
            raise InvalidArgument(
                f"the merge operator returned {type(result).__name__} for key {key!r}; "
                "it must return bytes"
            )
        return bytes(result)

    def stack(self, key: bytes, older: bytes | None, newer: Operands) -> bytes:
        """What a source holding ``older`` (the value of an existing version) holds once
        ``newer`` operands are written over it: more operands, or (over a base) a value.
        Without an operator, operands over a base replace it: such a key cannot be read
        anyway until an operator is configured (:meth:`apply` raises)."""
        if older.__class__ is Operands:
            return older.under(newer)
        if self.operator is None:
            return newer
        return self.apply(key, older, newer)

    def fold(self, key: bytes, values: Sequence[bytes | None], *, complete: bool) -> bytes | None:
        """One value for a key's ``values`` (newest first, those under a range tombstone
        left out) whose newest is :class:`Operands`: operands stack down to the first base,
        which they are applied to. With no base among them the result is the stacked
        operands, or with ``complete`` (nothing older exists) and an operator their value
        over nothing.

        Raises:
            InvalidArgument: a base is there but no operator (a compaction without one
                cannot write the key: run the compactor with the database's operator).
        """
        acc = values[0]
        assert isinstance(acc, Operands)
        for value in values[1:]:
            if value.__class__ is Operands:
                acc = value.under(acc)
            else:
                return self.apply(key, value, acc)
        if complete and self.operator is not None:
            return self.apply(key, None, acc)
        return acc


NO_MERGING = Merging()
