"""What a transition returns (RFC 0015 §6.1), and the one way a transition makes a new state.

A transition is a pure function ``fn(state, now_ms, settings, args)`` returning either a
:class:`Change` (the next state, a result for the caller, and the maintenance it makes due)
or a :class:`Break` that commits nothing: a :class:`NoOp` that still answers the caller
(e.g. ``AlreadyCommitted``, the current since), or a :class:`Refused` carrying the error the
applier raises. Transitions never raise for a caller's mistake: an applier loop can then
treat every outcome uniformly, and the decision is a value tests can inspect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from slatepy.errors import SlatepyError
from slatepy.persist.state.records import HollowBatch, State

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True, slots=True)
class MergeReq:
    """A merge claimed in the change: the compactor merges ``inputs`` (oldest first) and
    applies the result with ``apply_merge(merge_id, ...)``."""

    merge_id: int
    inputs: tuple[HollowBatch, ...]


@dataclass(frozen=True, slots=True)
class Maintenance:
    """Background work a committed change makes due; the handle queues it, never runs it
    inline. (Whether a rollup is due depends on the diff bytes written since the latest
    rollup, which only the applier knows: ``gc_rules.rollup_due``.)"""

    gc: bool = False
    merges: tuple[MergeReq, ...] = ()


NO_MAINTENANCE = Maintenance()


@dataclass(frozen=True, slots=True)
class Change(Generic[R_co]):
    """Commit ``state`` (whose seqno is the input's + 1), then answer ``result``."""

    state: State
    result: R_co
    maintenance: Maintenance = NO_MAINTENANCE


@dataclass(frozen=True, slots=True)
class NoOp(Generic[R_co]):
    """Nothing to commit; answer ``value`` (the call already had its effect)."""

    value: R_co


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing to commit; the applier raises ``error`` (a usage error, an upper or opaque
    mismatch, ``Indeterminate``, ``WriteStalled``)."""

    error: SlatepyError


@dataclass(frozen=True, slots=True)
class Break(Generic[R_co]):
    """The transition commits nothing, for ``reason``."""

    reason: NoOp[R_co] | Refused

    def answer(self) -> R_co:
        """What the call answers without committing: the NoOp's value, or the refusal's
        error raised."""
        if isinstance(self.reason, Refused):
            raise self.reason.error
        return self.reason.value


Outcome = Change[R] | Break[R]


def refuse(error: SlatepyError) -> Break[Any]:
    return Break(Refused(error))


def noop(value: R) -> Break[R]:
    return Break(NoOp(value))


def walltime_after(state: State, now_ms: int) -> int:
    """The walltime of the state after ``state`` when the clock says ``now_ms``: strictly
    increasing even if clocks go back or disagree between processes. Leases and claims
    are judged by it, so every process judges them by the same, durable clock."""
    return max(state.walltime_ms + 1, now_ms)


def successor(state: State, now_ms: int, **changes: Any) -> State:
    """``state`` with ``changes``, at the next seqno and walltime."""
    return msgspec.structs.replace(
        state, seqno=state.seqno + 1, walltime_ms=walltime_after(state, now_ms), **changes
    )
