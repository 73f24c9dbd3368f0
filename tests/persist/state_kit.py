"""Helpers for the tests of the pure shard state: build parts and runs, and run a
transition the way the applier will, checking every invariant of the step on the way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from slatepy.persist.codec import Update, encode_inline
from slatepy.persist.config import PersistSettings
from slatepy.persist.consolidation import consolidate
from slatepy.persist.state.append import CompareAndAppend, compare_and_append
from slatepy.persist.state.diff import (
    StateDiff,
    apply,
    decode_state_diff,
    encode_state_diff,
)
from slatepy.persist.state.outcome import Break, Change, NoOp, Outcome, Refused
from slatepy.persist.state.records import HollowPart, InlinePart, RollupRef, Runs, State
from slatepy.persist.state.transitions import RegisterWriter, check_step, register_writer, step

SETTINGS = PersistSettings()
PAIRS = PersistSettings(small_merge_batches=2)
"""Small batches merge in pairs: two appends make a claim."""
SHARD = "orders"
A = TypeVar("A")
R = TypeVar("R")


def inline_runs(updates: Sequence[Update]) -> Runs:
    """One run of one inline part holding ``updates`` (none: no runs)."""
    data = consolidate(updates)
    if not data:
        return ()
    return ((InlinePart(encode_inline(data), len(data)),),)


def hollow_runs(key: str, updates: int, t_min: int = 0, t_max: int = 0) -> Runs:
    """One run of one blob part of ``updates`` updates."""
    return ((HollowPart(key, 100 + updates, updates, b"", t_min, t_max),),)


def rollup_ref(seqno: int, size: int = 1000) -> RollupRef:
    """A rollup reference at ``seqno`` (the same one every time)."""
    return RollupRef(f"rollup/{seqno:020}-{'0' * 32}.rollup", size)


def commit(
    state: State,
    transition: Callable[[State, int, PersistSettings, A], Outcome[R]],
    args: A,
    *,
    now: int | None = None,
    settings: PersistSettings = SETTINGS,
) -> Change[R]:
    """Run ``transition`` through ``step`` and require a ``Change``; check the new state's
    invariants, the step rules, and that its diff (encoded and decoded) rebuilds it."""
    outcome = step(state, state.walltime_ms + 1 if now is None else now, settings, transition, args)
    assert isinstance(outcome, Change), outcome
    check_transition(state, outcome.state)
    return outcome


def check_transition(old: State, new: State) -> None:
    new.validate()
    check_step(old, new)
    diff = StateDiff.between(old, new, nonce="n" * 32, prev_digest=0)
    assert apply(old, decode_state_diff(encode_state_diff(diff))) == new


def refused(
    state: State,
    transition: Callable[[State, int, PersistSettings, A], Outcome[Any]],
    args: A,
    *,
    now: int | None = None,
    settings: PersistSettings = SETTINGS,
) -> BaseException:
    """Run ``transition`` and require a ``Refused``; return its error."""
    outcome = step(state, state.walltime_ms + 1 if now is None else now, settings, transition, args)
    assert isinstance(outcome, Break) and isinstance(outcome.reason, Refused), outcome
    return outcome.reason.error


def noop(
    state: State,
    transition: Callable[[State, int, PersistSettings, A], Outcome[R]],
    args: A,
    *,
    now: int | None = None,
    settings: PersistSettings = SETTINGS,
) -> R:
    """Run ``transition`` and require a ``NoOp``; return its value."""
    outcome = step(state, state.walltime_ms + 1 if now is None else now, settings, transition, args)
    assert isinstance(outcome, Break) and isinstance(outcome.reason, NoOp), outcome
    return outcome.reason.value


def with_writer(state: State, writer_id: str = "w1", *, now: int | None = None) -> State:
    return commit(state, register_writer, RegisterWriter(writer_id), now=now).state


def append(
    state: State,
    expected: int,
    new: int | None,
    updates: Sequence[Update] = (),
    *,
    writer_id: str = "w1",
    token: str | None = None,
    runs: Runs | None = None,
    now: int | None = None,
    settings: PersistSettings = SETTINGS,
) -> State:
    """``state`` after a successful ``compare_and_append`` of ``updates`` (registering the
    writer if needed)."""
    args = CompareAndAppend(
        writer_id=writer_id,
        token=token or f"t{state.seqno}",
        expected=expected,
        new=new,
        runs=inline_runs(updates) if runs is None else runs,
        registered=writer_id in state.writers,
    )
    return commit(state, compare_and_append, args, now=now, settings=settings).state


def initial() -> State:
    return State.initial(SHARD)
