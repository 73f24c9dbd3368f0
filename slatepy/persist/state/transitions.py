"""Transitions of handles and of the shard's life: registration, heartbeats, since
downgrades, expiry, finalization, rollups (RFC 0015 §6.1, §7.1, §7.5, §10).

Every transition is ``fn(state, now_ms, settings, args) -> Change | Break`` (``outcome``)
and pure. The applier runs them through :func:`step`, which first expires lapsed leases
(:func:`expire_at`), so every transition sees the handles that are alive by state time.
``compare_and_append`` lives in ``append``, the merge transitions in ``spine``, the GC
ones in ``gc_rules``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from slatepy.errors import CorruptionError
from slatepy.persist import frontier
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import OpaqueMismatch, UsageError
from slatepy.persist.ids import rollup_seqno, validate_critical_reader_id
from slatepy.persist.state.outcome import (
    Break,
    Change,
    Outcome,
    noop,
    refuse,
    successor,
    walltime_after,
)
from slatepy.persist.state.records import (
    CriticalReader,
    LeasedReader,
    RollupRef,
    State,
    Writer,
)

A = TypeVar("A")
R = TypeVar("R")


def step(
    state: State,
    now_ms: int,
    settings: PersistSettings,
    transition: Callable[[State, int, PersistSettings, A], Outcome[R]],
    args: A,
) -> Outcome[R]:
    """Run ``transition`` as the applier does: on ``state`` with lapsed leases expired.
    A ``Change`` commits the expiry with the transition; a ``Break`` commits neither."""
    return transition(expire_at(state, now_ms), now_ms, settings, args)


def expire_at(state: State, now_ms: int) -> State:
    """``state`` without the leased readers and writers whose lease lapsed by the walltime
    the next state will have, with ``since`` recomputed (same seqno: the next transition
    commits it). Lease expiry needs no sweeper and no agreement on clocks: it is decided by
    the state's own walltime, in whichever transition comes next.
    Keeps: since is the meet of the remaining readers, and never regresses."""
    now = walltime_after(state, now_ms)
    leased = {i: r for i, r in state.leased_readers.items() if not r.expired(now)}
    writers = {i: w for i, w in state.writers.items() if not w.expired(now)}
    if len(leased) == len(state.leased_readers) and len(writers) == len(state.writers):
        return state
    return with_since(msgspec.structs.replace(state, leased_readers=leased, writers=writers))


def with_since(state: State) -> State:
    """``state`` with its since recomputed as the meet of its readers (leased and
    critical), never below the old since; unchanged without readers."""
    if not state.has_readers():
        return state
    since = frontier.join(state.since, frontier.meet(state.reader_sinces()))
    return state if since == state.since else msgspec.structs.replace(state, since=since)


def check_step(old: State, new: State) -> None:
    """Check what a single state cannot show: ``new`` follows ``old`` (same shard, next
    seqno, later walltime) and neither frontier regressed.

    Raises:
        CorruptionError: the first rule broken.
    """
    if new.shard_id != old.shard_id or new.seqno != old.seqno + 1:
        raise CorruptionError(f"state {new.seqno} does not follow {old.seqno}")
    if new.walltime_ms <= old.walltime_ms:
        raise CorruptionError(f"state {new.seqno}: walltime went back")
    if not frontier.le(old.upper, new.upper) or not frontier.le(old.since, new.since):
        raise CorruptionError(
            f"state {new.seqno}: a frontier regressed (upper {old.upper} -> {new.upper}, "
            f"since {old.since} -> {new.since})"
        )


def _unregistered(kind: str, handle_id: str, what_to_do: str) -> Break[Any]:
    gone = (
        "it was expired" if kind == "critical reader" else "its lease expired (or it was expired)"
    )
    return refuse(UsageError(f"{kind} {handle_id} is not registered: {gone}; {what_to_do}"))


def _finalized(state: State) -> UsageError:
    return UsageError(f"shard {state.shard_id!r} is finalized; it accepts no handles or writes")


@dataclass(frozen=True, slots=True)
class RegisterWriter:
    """Args of :func:`register_writer`."""

    writer_id: str
    debug: str = ""


def register_writer(
    state: State, now_ms: int, settings: PersistSettings, args: RegisterWriter
) -> Outcome[Writer]:
    """Register a write handle with a fresh lease.

    Rules: ``UsageError`` on a finalized shard or at ``max_handles`` writers; NoOp(entry)
    if already registered; else add ``Writer(heartbeat=now, writer_lease, token "",
    most_recent_upper=upper)``.
    Keeps: at most ``max_handles`` writers; nothing is registered on a finalized shard.
    """
    if state.finalized:
        return refuse(_finalized(state))
    existing = state.writers.get(args.writer_id)
    if existing is not None:
        return noop(existing)
    if len(state.writers) >= settings.max_handles:
        return refuse(UsageError(f"shard {state.shard_id!r} has {settings.max_handles} writers"))
    writer = Writer(
        last_heartbeat_ms=walltime_after(state, now_ms),
        lease_ms=settings.writer_lease_ms,
        most_recent_upper=state.upper,
        debug=args.debug,
    )
    new = successor(state, now_ms, writers={**state.writers, args.writer_id: writer})
    return Change(new, writer)


@dataclass(frozen=True, slots=True)
class RegisterLeasedReader:
    """Args of :func:`register_leased_reader`."""

    reader_id: str
    debug: str = ""


def register_leased_reader(
    state: State, now_ms: int, settings: PersistSettings, args: RegisterLeasedReader
) -> Outcome[LeasedReader]:
    """Register a read handle at the shard's since, holding the new state's seqno.

    Rules: ``UsageError`` on a finalized shard or at ``max_handles`` leased readers;
    NoOp(entry) if already registered; else add ``LeasedReader(seqno=new seqno,
    since=since, heartbeat=now, reader_lease)``.
    Keeps: since is the meet of the readers (the new one holds exactly the since).
    """
    if state.finalized:
        return refuse(_finalized(state))
    existing = state.leased_readers.get(args.reader_id)
    if existing is not None:
        return noop(existing)
    if len(state.leased_readers) >= settings.max_handles:
        return refuse(
            UsageError(f"shard {state.shard_id!r} has {settings.max_handles} leased readers")
        )
    reader = LeasedReader(
        seqno=state.seqno + 1,
        since=state.since,
        last_heartbeat_ms=walltime_after(state, now_ms),
        lease_ms=settings.reader_lease_ms,
        debug=args.debug,
    )
    readers = {**state.leased_readers, args.reader_id: reader}
    return Change(successor(state, now_ms, leased_readers=readers), reader)


@dataclass(frozen=True, slots=True)
class RegisterCriticalReader:
    """Args of :func:`register_critical_reader`."""

    reader_id: str
    debug: str = ""


def register_critical_reader(
    state: State, now_ms: int, settings: PersistSettings, args: RegisterCriticalReader
) -> Outcome[CriticalReader]:
    """Register a critical since hold, once per (shard, reader id).

    Rules: ``UsageError`` for an invalid id or a finalized shard; NoOp(entry) when the id
    is registered (opening it again never resets its since or opaque); else add
    ``CriticalReader(since=since, opaque=b"")``.
    Keeps: since is the meet of the readers.
    """
    try:
        validate_critical_reader_id(args.reader_id)
    except UsageError as exc:
        return refuse(exc)
    if state.finalized:
        return refuse(_finalized(state))
    existing = state.critical_readers.get(args.reader_id)
    if existing is not None:
        return noop(existing)
    reader = CriticalReader(since=state.since, debug=args.debug)
    readers = {**state.critical_readers, args.reader_id: reader}
    return Change(successor(state, now_ms, critical_readers=readers), reader)


@dataclass(frozen=True, slots=True)
class HeartbeatWriter:
    """Args of :func:`heartbeat_writer`."""

    writer_id: str


def heartbeat_writer(
    state: State, now_ms: int, settings: PersistSettings, args: HeartbeatWriter
) -> Outcome[Writer]:
    """Extend a writer's lease.

    Rules: ``UsageError`` when the writer is not registered (expired); else stamp
    ``last_heartbeat_ms`` with the new walltime.
    Keeps: an expired writer stays expired (a heartbeat never registers).
    """
    writer = state.writers.get(args.writer_id)
    if writer is None:
        return _unregistered("writer", args.writer_id, "open a new writer")
    beat = msgspec.structs.replace(writer, last_heartbeat_ms=walltime_after(state, now_ms))
    return Change(successor(state, now_ms, writers={**state.writers, args.writer_id: beat}), beat)


@dataclass(frozen=True, slots=True)
class HeartbeatLeasedReader:
    """Args of :func:`heartbeat_leased_reader`: ``seqno`` is the oldest state the handle
    still reads from (its pinned snapshots, else its current state)."""

    reader_id: str
    seqno: int


def heartbeat_leased_reader(
    state: State, now_ms: int, settings: PersistSettings, args: HeartbeatLeasedReader
) -> Outcome[LeasedReader]:
    """Extend a leased reader's lease and move its seqno hold forward.

    Rules: ``UsageError`` when the reader is not registered (expired); else stamp
    ``last_heartbeat_ms`` and set ``seqno = max(held, min(args.seqno, new seqno))``.
    Keeps: a reader's seqno never goes back (GC may already have deleted what is below).
    """
    reader = state.leased_readers.get(args.reader_id)
    if reader is None:
        return _unregistered("leased reader", args.reader_id, "open a new reader")
    beat = msgspec.structs.replace(
        reader,
        last_heartbeat_ms=walltime_after(state, now_ms),
        seqno=max(reader.seqno, min(args.seqno, state.seqno + 1)),
    )
    readers = {**state.leased_readers, args.reader_id: beat}
    return Change(successor(state, now_ms, leased_readers=readers), beat)


@dataclass(frozen=True, slots=True)
class DowngradeSince:
    """Args of :func:`downgrade_since`."""

    reader_id: str
    new_since: int | None


def downgrade_since(
    state: State, now_ms: int, settings: PersistSettings, args: DowngradeSince
) -> Outcome[int | None]:
    """Move a leased reader's since forward; answers the reader's since.

    Rules: ``UsageError`` when the reader is not registered (expired); NoOp(since) when
    ``new_since`` is not beyond the reader's since (since only moves forward); else set it
    (and the heartbeat) and recompute the shard's since as the meet of all readers.
    Keeps: since is the meet and never regresses.
    """
    reader = state.leased_readers.get(args.reader_id)
    if reader is None:
        return _unregistered("leased reader", args.reader_id, "open a new reader")
    if frontier.le(args.new_since, reader.since):
        return noop(reader.since)
    moved = msgspec.structs.replace(
        reader, since=args.new_since, last_heartbeat_ms=walltime_after(state, now_ms)
    )
    readers = {**state.leased_readers, args.reader_id: moved}
    new = with_since(successor(state, now_ms, leased_readers=readers))
    return Change(new, moved.since)


@dataclass(frozen=True, slots=True)
class CompareAndDowngradeSince:
    """Args of :func:`compare_and_downgrade_since`."""

    reader_id: str
    expected_opaque: bytes
    new_opaque: bytes
    new_since: int | None


def compare_and_downgrade_since(
    state: State, now_ms: int, settings: PersistSettings, args: CompareAndDowngradeSince
) -> Outcome[int | None]:
    """Move a critical reader's since forward iff its opaque is the expected one; answers
    the reader's since.

    Rules: ``UsageError`` when the opaques are not bytes or the reader is not registered;
    ``OpaqueMismatch(expected, current)`` when the stored opaque differs (nothing changes);
    NoOp(since) when neither the opaque nor the since would change; else store
    ``new_opaque`` and ``since = max(since, new_since)`` — the opaque is stored even when
    the since does not move — and recompute the shard's since.
    Keeps: since is the meet and never regresses.
    """
    if type(args.expected_opaque) is not bytes or type(args.new_opaque) is not bytes:
        return refuse(UsageError("opaque tokens must be bytes"))
    reader = state.critical_readers.get(args.reader_id)
    if reader is None:
        return _unregistered("critical reader", args.reader_id, "open it again")
    if reader.opaque != args.expected_opaque:
        return refuse(OpaqueMismatch(args.expected_opaque, reader.opaque))
    since = frontier.join(reader.since, args.new_since)
    if since == reader.since and args.new_opaque == reader.opaque:
        return noop(reader.since)
    moved = msgspec.structs.replace(reader, since=since, opaque=args.new_opaque)
    readers = {**state.critical_readers, args.reader_id: moved}
    return Change(with_since(successor(state, now_ms, critical_readers=readers)), since)


@dataclass(frozen=True, slots=True)
class ExpireWriter:
    """Args of :func:`expire_writer`."""

    writer_id: str


def expire_writer(
    state: State, now_ms: int, settings: PersistSettings, args: ExpireWriter
) -> Outcome[bool]:
    """Remove a writer (its handle closed). Rule: NoOp(False) if absent; else remove it.
    Keeps: its merge claims, until their lease lapses (a merge in flight may still apply)."""
    if args.writer_id not in state.writers:
        return noop(False)
    writers = {i: w for i, w in state.writers.items() if i != args.writer_id}
    return Change(successor(state, now_ms, writers=writers), True)


@dataclass(frozen=True, slots=True)
class ExpireLeasedReader:
    """Args of :func:`expire_leased_reader`."""

    reader_id: str


def expire_leased_reader(
    state: State, now_ms: int, settings: PersistSettings, args: ExpireLeasedReader
) -> Outcome[bool]:
    """Remove a leased reader. Rule: NoOp(False) if absent; else remove it and recompute
    since. Keeps: since is the meet of the remaining readers, never regressing."""
    if args.reader_id not in state.leased_readers:
        return noop(False)
    readers = {i: r for i, r in state.leased_readers.items() if i != args.reader_id}
    return Change(with_since(successor(state, now_ms, leased_readers=readers)), True)


@dataclass(frozen=True, slots=True)
class ExpireCriticalReader:
    """Args of :func:`expire_critical_reader`."""

    reader_id: str


def expire_critical_reader(
    state: State, now_ms: int, settings: PersistSettings, args: ExpireCriticalReader
) -> Outcome[bool]:
    """Remove a critical reader. Rule: NoOp(False) if absent; else remove it and
    recompute since. Keeps: since is the meet of the remaining readers, never regressing."""
    if args.reader_id not in state.critical_readers:
        return noop(False)
    readers = {i: r for i, r in state.critical_readers.items() if i != args.reader_id}
    return Change(with_since(successor(state, now_ms, critical_readers=readers)), True)


@dataclass(frozen=True, slots=True)
class Finalize:
    """Args of :func:`finalize` (none)."""


def finalize(state: State, now_ms: int, settings: PersistSettings, args: Finalize) -> Outcome[None]:
    """Finalize a shard nobody can write or read any more.

    Rules: NoOp(None) when already finalized (idempotent); ``UsageError`` unless since and
    upper are both None; else clear the trace, readers, writers and merges and set
    ``finalized`` — the state is the shard's tombstone and GC then deletes its blobs.
    Keeps: finalized implies no frontiers, trace, handles or merges.
    """
    if state.finalized:
        return noop(None)
    if state.since is not None or state.upper is not None:
        return refuse(
            UsageError(
                f"finalize needs since and upper both None (since {state.since}, upper "
                f"{state.upper}): append with new_upper=None and downgrade every since to "
                "None first"
            )
        )
    new = successor(
        state,
        now_ms,
        trace=(),
        merges={},
        leased_readers={},
        critical_readers={},
        writers={},
        idempotency={},
        finalized=True,
    )
    return Change(new, None)


@dataclass(frozen=True, slots=True)
class AddRollup:
    """Args of :func:`add_rollup`: the rollup blob ``ref`` holds the state at ``seqno``."""

    seqno: int
    ref: RollupRef


def add_rollup(
    state: State, now_ms: int, settings: PersistSettings, args: AddRollup
) -> Outcome[bool]:
    """Register a rollup blob.

    Rules: ``UsageError`` when ``seqno`` is not in ``[1, seqno]`` of this state or the key
    does not name it; NoOp(False) when a rollup at ``seqno`` is registered (the caller
    deletes its duplicate blob); else add it, answering True.
    Keeps: rollups are of earlier seqnos, under keys naming them.
    """
    if not 1 <= args.seqno <= state.seqno or rollup_seqno(args.ref.key) != args.seqno:
        return refuse(
            UsageError(f"rollup {args.ref.key!r} is not a rollup of a seqno in [1, {state.seqno}]")
        )
    if args.seqno in state.rollups:
        return noop(False)
    rollups = {**state.rollups, args.seqno: args.ref}
    return Change(successor(state, now_ms, rollups=rollups), True)
