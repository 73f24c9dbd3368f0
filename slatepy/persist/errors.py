"""The errors of persist shards (RFC 0015 §6.2, §9).

Two tiers, as the seed asks. *Usage errors* are caller bugs: raised at once, before anything
is written, never retried (:class:`UsageError`, :class:`InvalidBounds`, :class:`SinceError`).
*Location errors* are storage trouble and stay the store's ``StoreError`` family; the one a
persist call adds is :class:`Indeterminate`, for a write whose outcome nothing can decide.
:class:`UpperMismatch` and :class:`OpaqueMismatch` are neither: the caller lost a race that
the API makes observable, and answers it with the current value they carry.
"""

from __future__ import annotations

from slatepy.errors import InvalidArgument, InvalidType, SlatepyError, StoreUnavailable


def _frontier(value: int | None) -> str:
    return "None (closed)" if value is None else str(value)


class UsageError(InvalidArgument):
    """The call is not allowed: wrong types, times outside ``[lower, upper)``, an expired
    handle, a batch of another shard, a finalized shard... Nothing was written; fix the
    caller (retrying the same call fails the same way)."""


class UsageTypeError(UsageError, InvalidType):
    """A usage error of the wrong Python type: a ``str`` key or value, a time or diff that
    is no ``int``, an update that is no ``((key, value), time, diff)``. Also a
    ``TypeError`` (as the engine's :class:`slatepy.errors.InvalidType`)."""


class InvalidBounds(UsageError):
    """``lower``/``upper`` (or ``expected``/``new``) are out of order: a lower beyond its
    upper, or a new upper not beyond the expected one. Checked before the shard's upper is
    looked at, so it is raised even when the upper has moved too."""


class UpperMismatch(SlatepyError):
    """The shard's upper is not the one the call expected; nothing was appended.

    Attributes:
        expected: The upper the call expected.
        current: The shard's upper when the call was decided (``None``: the shard is closed).
    """

    def __init__(self, expected: int | None, current: int | None) -> None:
        what_to_do = (
            "the shard is closed; nothing more can be appended"
            if current is None
            else "append from the current upper, or re-read it with fetch_recent_upper()"
        )
        super().__init__(
            f"upper mismatch: expected {_frontier(expected)}, the shard's upper is "
            f"{_frontier(current)}; {what_to_do}"
        )
        self.expected = expected
        self.current = current


class SinceError(UsageError):
    """A read ``as_of`` is before this handle's since (or the since is ``None``): those
    times may have been compacted away. Read at or after ``since``.

    Attributes:
        since: The handle's since.
    """

    def __init__(self, as_of: int | None, since: int | None) -> None:
        super().__init__(
            f"cannot read as of {_frontier(as_of)}: this handle's since is {_frontier(since)}; "
            "read as of a time at or after it"
        )
        self.since = since


class OpaqueMismatch(SlatepyError):
    """``compare_and_downgrade_since`` expected another opaque token: someone else holds
    this critical since now. Nothing changed; re-read the opaque before deciding again.

    Attributes:
        expected: The opaque the call expected.
        current: The opaque stored for the reader.
    """

    def __init__(self, expected: bytes, current: bytes) -> None:
        super().__init__(
            f"opaque mismatch: expected {expected!r}, the critical since holds {current!r}; "
            "nothing changed"
        )
        self.expected = expected
        self.current = current


class Indeterminate(StoreUnavailable):
    """A write failed indefinitely and its retry cannot tell whether it landed (its writer's
    entry expired meanwhile, taking the idempotency token with it). It may or may not have
    been applied: read the shard to find out; never blindly write the same data again."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message, path=path, definite=False)


class StateConflictError(SlatepyError):
    """A state change kept losing the compare-and-set race on the shard's consensus log and
    gave up (nothing was committed). Try again later; heavy contention is the cause."""
