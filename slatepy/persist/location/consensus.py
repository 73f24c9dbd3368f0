"""The ``Consensus`` location: one linearizable, versioned log per shard (RFC 0015 §3.1).

Each shard's state is a sequence of diffs; ``Consensus`` holds that sequence as entries
``(seqno, data)`` numbered 1, 2, 3, ... with no gaps. Writers append with
:meth:`Consensus.compare_and_set`, which succeeds only if the log's newest entry (the *head*)
is the one the writer based its change on; readers read the head and scan ranges; garbage
collection truncates the prefix nobody needs any more.

Contract, checked by :mod:`slatepy.testing.persist_conformance` for every implementation:

* ``head`` is linearizable: it reflects every ``compare_and_set`` that returned
  :class:`Committed` before ``head`` was called.
* ``compare_and_set`` is atomic: of any number of calls with the same ``expected``, at most
  one commits. An uncertain outcome (a lost reply, a timeout) is resolved inside the call by
  reading the entry back; only if that read fails too does the call raise
  ``StoreUnavailable(definite=False)``. A ``StoreUnavailable(definite=True)`` means nothing
  was written.
* The log is contiguous: entries exist exactly at ``[earliest, head]``.
* ``truncate`` never deletes the head, and deletes in ascending order, so an interrupted
  truncation leaves a contiguous suffix.
* Every ``data`` written is unique (callers put a random nonce in each diff), so a read-back
  never mistakes another writer's entry for ours.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from types import TracebackType
from typing import TypeAlias

from slatepy.errors import InvalidArgument

SEQNO_MAX = 2**63 - 1
"""The largest seqno an entry may have (PostgreSQL's ``bigint``)."""

KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a consensus key (a shard id) looks like: it is a path component on the object store,
so no ``/``, no leading dot and a bounded length. The same alphabet as persist's shard ids."""


@dataclass(frozen=True, slots=True)
class VersionedData:
    """One log entry: ``data`` written at ``seqno`` (``1 <= seqno <= SEQNO_MAX``)."""

    seqno: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Committed:
    """``compare_and_set`` wrote its data at ``expected + 1`` (or 1 for an empty log)."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """``compare_and_set`` wrote nothing: ``expected`` was not the head.

    Attributes:
        current: An entry newer than ``expected``, for the caller to catch up from. The
            object-store log returns the entry that took ``expected + 1``; PostgreSQL the
            head. ``None`` when the log is empty (``expected`` was ahead of it).
    """

    current: VersionedData | None


CasResult: TypeAlias = Committed | Mismatch


class Consensus(abc.ABC):
    """A set of linearizable logs, one per key; see the module docstring for the contract.

    Instances are safe to share between threads and are context managers (``close`` on exit).
    Every method raises ``InvalidArgument`` for a malformed argument (nothing is written),
    ``StoreUnavailable`` when the location cannot be reached, ``CorruptionError`` (with the
    object's ``path`` where there is one) when an entry cannot be decoded, and
    ``ClosedError`` after :meth:`close`.
    """

    @abc.abstractmethod
    def head(self, key: str) -> VersionedData | None:
        """The newest entry of ``key``'s log, or ``None`` if the log is empty."""

    @abc.abstractmethod
    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CasResult:
        """Append ``data`` at ``(expected or 0) + 1`` iff the head's seqno is ``expected``
        (``None``: iff the log is empty).

        Returns:
            :class:`Committed`, or :class:`Mismatch` with a newer entry.

        Raises:
            StoreUnavailable: ``definite=True``: nothing was written; ``definite=False``: the
                entry may have been written and reading it back failed too.
        """

    @abc.abstractmethod
    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        """Up to ``limit`` entries with ``seqno >= from_seqno``, ascending and contiguous.

        Entries below the truncation point are gone: a scan from below it starts at the
        earliest retained entry.
        """

    @abc.abstractmethod
    def truncate(self, key: str, seqno: int) -> int:
        """Delete the entries below ``seqno``; returns how many were deleted.

        The head is never deleted. The object-store log may keep some (see its
        ``min_age``); it then deletes an ascending prefix of them.

        Raises:
            InvalidArgument: ``seqno`` is above the head (or the log is empty): the caller
                asked to delete an entry that is, or may become, the head.
        """

    @abc.abstractmethod
    def list_keys(self) -> list[str]:
        """Every key with at least one entry, sorted (for administration and GC)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and threads; idempotent. Later calls raise ``ClosedError``."""

    def __enter__(self) -> Consensus:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# Argument checks shared by the implementations, so every one refuses the same inputs with
# the same message before touching its location.


def check_key(key: str) -> str:
    """``key`` if it is a valid consensus key, else ``InvalidArgument``."""
    if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
        raise InvalidArgument(
            f"consensus key {key!r} is invalid: use 1-128 characters of [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return key


def check_seqno(seqno: int, what: str, *, minimum: int = 1) -> int:
    """``seqno`` if it is an int in ``[minimum, SEQNO_MAX]``, else ``InvalidArgument``."""
    if not isinstance(seqno, int) or isinstance(seqno, bool) or not minimum <= seqno <= SEQNO_MAX:
        raise InvalidArgument(f"{what} must be an int in [{minimum}, 2**63 - 1], not {seqno!r}")
    return seqno


def next_seqno(expected: int | None) -> int:
    """The seqno a ``compare_and_set`` with ``expected`` writes at (validated)."""
    if expected is None:
        return 1
    check_seqno(expected, "expected")
    if expected == SEQNO_MAX:
        raise InvalidArgument(f"expected={expected}: the log is full (seqnos end at 2**63 - 1)")
    return expected + 1


def check_data(data: bytes) -> bytes:
    """``data`` if it is ``bytes``, else ``InvalidArgument`` (a bytearray could change under
    us between the write and its read-back)."""
    if not isinstance(data, bytes):
        raise InvalidArgument(f"consensus data must be bytes, not {type(data).__name__}")
    return data


def check_limit(limit: int) -> int:
    """``limit`` if it is a positive int, else ``InvalidArgument``."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidArgument(f"scan limit must be an int >= 1, not {limit!r}")
    return limit
