"""The write path's decisions: ``compare_and_append`` with its idempotency rules (RFC 0015
§6.2), ``append``'s four cases (§6.3) and the checks on applying a written batch (§6.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from slatepy.errors import WriteStalled
from slatepy.persist import frontier
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import Indeterminate, InvalidBounds, UpperMismatch, UsageError
from slatepy.persist.state.gc_rules import gc_due
from slatepy.persist.state.outcome import (
    Change,
    Maintenance,
    Outcome,
    noop,
    refuse,
    successor,
    walltime_after,
)
from slatepy.persist.state.records import (
    Applied,
    Desc,
    HollowBatch,
    HollowPart,
    Runs,
    State,
    Writer,
    runs_updates,
)
from slatepy.persist.state.spine import plan_for, runs_problem
from slatepy.persist.validate import check_bounds


@dataclass(frozen=True, slots=True)
class CompareAndAppend:
    """Args of :func:`compare_and_append`.

    Attributes:
        writer_id: The appending write handle.
        token: The idempotency token of this logical call (the same on every retry).
        expected: The upper the shard must have.
        new: The upper after the append.
        runs: The batch's runs, already windowed to ``[expected, new)`` where narrower.
        registered: The handle's writer entry was committed before (so its absence means
            its lease expired); False registers the writer with this append.
        uncertain: An earlier attempt of this call failed indefinitely (it may have landed).
        debug: Stored with a writer registered by this call.
        idempotency: ``(key, id)``, an external idempotency key recorded atomically with
            the append (Addendum E): if the shard records ``key`` at ``id`` or beyond, the
            call is a NoOp(``AlreadyApplied``) whatever its uppers — unless the recorded
            append is this one (its digest, or parts the state references: issue 27).
        digest: Names the batches the call applies (``batch.batches_digest``), recorded
            with ``idempotency``; empty for appends of updates.
        written: The runs are parts of batches written before the call (which may be in the
            trace already: rule 5a looks); False for parts the call wrote itself (fresh
            keys: the trace cannot hold them, and the scan is skipped).
    """

    writer_id: str
    token: str
    expected: int
    new: int | None
    runs: Runs
    registered: bool = True
    uncertain: bool = False
    debug: str = ""
    idempotency: tuple[str, int] | None = None
    digest: bytes = b""
    written: bool = False


@dataclass(frozen=True, slots=True)
class Appended:
    """The batch was appended; the shard's upper is now ``upper``."""

    upper: int | None


@dataclass(frozen=True, slots=True)
class AlreadyCommitted:
    """An earlier attempt of this call landed (its token is the writer's latest); the
    writer's upper after it was ``upper``. Report success, write nothing again."""

    upper: int | None


@dataclass(frozen=True, slots=True)
class AlreadyApplied:
    """The call's idempotency key is recorded at ``id`` (at or beyond the call's): that
    append, or a later one of the same key, landed and set the upper to ``upper``. Nothing
    was appended. ``ours``: the recorded append applied the call's own batches (an earlier
    attempt of it landed; its parts are referenced: the caller reports success). Else the
    caller's batches are referenced by no state."""

    id: int
    upper: int | None
    ours: bool = False


def check_idempotency(idempotency: object) -> tuple[str, int] | None:
    """``idempotency`` as ``(key, id)`` (a non-empty string of at most 256 characters, a
    u64 id), or None.

    Raises:
        UsageError: anything else.
    """
    if idempotency is None:
        return None
    if (
        isinstance(idempotency, tuple)
        and len(idempotency) == 2
        and isinstance(idempotency[0], str)
        and 0 < len(idempotency[0]) <= 256
        and type(idempotency[1]) is int
        and 0 <= idempotency[1] < 1 << 64
    ):
        return idempotency[0], idempotency[1]
    raise UsageError(
        f"idempotency must be (key, id): a non-empty str of at most 256 characters and a "
        f"u64 int, not {idempotency!r}"
    )


def recorded(
    current: dict[str, Applied], key: str, applied: Applied, now_ms: int, settings: PersistSettings
) -> dict[str, Applied]:
    """The idempotency map with ``key`` set to ``applied``: keys not applied within
    ``idempotency_ttl`` are dropped, and beyond ``max_idempotency_keys`` the least recently
    applied ones are evicted (never ``key``)."""
    horizon = now_ms - settings.idempotency_ttl_ms
    kept = {k: a for k, a in current.items() if k != key and a.applied_ms >= horizon}
    room = settings.max_idempotency_keys - 1
    if len(kept) > room:
        newest = sorted(kept.items(), key=lambda item: (item[1].applied_ms, item[0]))
        kept = dict(newest[len(kept) - room :]) if room > 0 else {}
    kept[key] = applied
    return kept


def compare_and_append(
    state: State, now_ms: int, settings: PersistSettings, args: CompareAndAppend
) -> Outcome[Appended | AlreadyCommitted | AlreadyApplied]:
    """Append a batch iff the shard's upper is ``expected``, moving it to ``new``.

    Rules, in order (the first that applies decides):

    1. ``InvalidBounds`` unless ``new`` is beyond ``expected`` — before the upper is
       looked at; ``UsageError`` for an empty token or runs with an empty run or part.
    2. The writer's ``most_recent_token`` is ``token``: NoOp(``AlreadyCommitted``) — the
       caller's own landed attempt, before any other answer (issue 27, defect 3).
    2a. With ``idempotency=(key, id)`` and ``key`` recorded at ``id`` or beyond (and not
       expired by ``idempotency_ttl``): if the recorded append is this one — its digest
       is the call's (or, recorded without a digest, the state references a part of the
       call) — NoOp(``AlreadyApplied(ours=True)``): the caller's own append, whose parts
       must stay. A recorded append of other batches sharing a part with the call:
       ``UsageError`` (neither answer is true). Otherwise NoOp(``AlreadyApplied``) —
       whatever the uppers, the writer's registration or the shard being closed; the
       call's parts are then referenced by no state.
    3. The writer is not registered: if an earlier attempt was uncertain and the upper is
       not ``expected``, ``Indeterminate`` (it may have landed and the writer expired since,
       taking the token with it: never a guess); else if the handle had registered,
       ``UsageError`` (lease expired). Otherwise the append registers it.
    4. The shard is finalized or closed: ``UpperMismatch(expected, None)``.
    5. The upper is not ``expected``: ``UpperMismatch(expected, upper)``. With an
       uncertain earlier attempt this is the idempotency table's "another token" row: the
       handle serializes its calls, so a landed attempt would have left our token.
    5a. ``UsageError`` when a part of the call is in the trace already for overlapping
       written times (a batch applied twice, issue 27 defect 8).
    6. ``WriteStalled`` when the trace holds ``max_trace_batches`` (compaction is behind)
       and the batch has data; progress-only appends go on (empty batches merge with their
       empty neighbours, so they add at most one batch).
    7. Append ``HollowBatch(next_batch_id, Desc(expected, new), runs)``, set ``upper =
       new``, record ``token``/``new``/heartbeat on the writer (registering it), record
       ``idempotency`` as ``Applied(id, new, walltime, digest)`` (dropping expired keys,
       evicting the least recently applied beyond ``max_idempotency_keys``), and run the
       spine rule (metadata merges, claims for this writer).

    Keeps: the trace stays contiguous from 0 to the upper, which only grows; a token is
    committed at most once.
    """
    try:
        check_bounds(args.expected, args.new, names=("expected upper", "new upper"))
    except InvalidBounds as exc:
        return refuse(exc)
    problem = "no idempotency token" if not args.token else runs_problem(args.runs)
    if problem:
        return refuse(UsageError(f"compare_and_append: {problem}"))
    try:
        idempotency = check_idempotency(args.idempotency)
    except UsageError as exc:
        return refuse(exc)
    writer = state.writers.get(args.writer_id)
    if writer is not None and writer.most_recent_token == args.token:
        return noop(AlreadyCommitted(writer.most_recent_upper))
    if idempotency is not None:
        applied = state.idempotency.get(idempotency[0])
        fresh = applied is not None and (
            applied.applied_ms >= state.walltime_ms - settings.idempotency_ttl_ms
        )
        if applied is not None and fresh and applied.id >= idempotency[1]:
            if args.digest and applied.digest == args.digest:
                return noop(AlreadyApplied(applied.id, applied.upper, ours=True))
            if _referenced(state, args.runs):
                if not applied.digest:  # recorded before digests: the parts say it is ours
                    return noop(AlreadyApplied(applied.id, applied.upper, ours=True))
                return refuse(
                    UsageError(
                        f"idempotency key {idempotency[0]!r} is recorded at id {applied.id} by "
                        "an append of other batches that shares parts with this call: not "
                        "the same append, and its parts are referenced; apply the same "
                        "batches as the recorded append, or new ones"
                    )
                )
            return noop(AlreadyApplied(applied.id, applied.upper))
    if writer is None:
        if args.uncertain and state.upper != args.expected:
            return refuse(
                Indeterminate(
                    f"compare_and_append to {args.new} may or may not have landed: the write "
                    f"failed indefinitely and writer {args.writer_id} expired before the "
                    "retry could check its token; read the shard to find out"
                )
            )
        if args.registered:
            return refuse(
                UsageError(
                    f"writer {args.writer_id} is not registered: its lease expired; open a "
                    "new writer"
                )
            )
    if state.finalized or state.upper is None:
        return refuse(UpperMismatch(args.expected, None))
    if state.upper != args.expected:
        return refuse(UpperMismatch(args.expected, state.upper))
    twice = _applied_twice(state, args.runs) if args.written else None
    if twice is not None:
        return refuse(
            UsageError(
                f"compare_and_append: part {twice} is in the trace already for overlapping "
                "written times; a batch applied twice would count its updates twice"
            )
        )
    if args.runs and len(state.trace) >= settings.max_trace_batches:
        return refuse(
            WriteStalled(
                f"shard {state.shard_id!r} has {len(state.trace)} batches (max_trace_batches): "
                "compaction is behind; wait for it and try again"
            )
        )
    if writer is None and len(state.writers) >= settings.max_handles:
        return refuse(UsageError(f"shard {state.shard_id!r} has {settings.max_handles} writers"))
    now = walltime_after(state, now_ms)
    if writer is None:
        writer = Writer(last_heartbeat_ms=now, lease_ms=settings.writer_lease_ms, debug=args.debug)
    writer = msgspec.structs.replace(
        writer, last_heartbeat_ms=now, most_recent_token=args.token, most_recent_upper=args.new
    )
    batch = HollowBatch(
        id=state.next_batch_id,
        desc=Desc(args.expected, args.new),
        runs=args.runs,
        updates=runs_updates(args.runs),
    )
    idempotency_map = state.idempotency
    if idempotency is not None:
        key, applied_id = idempotency
        idempotency_map = recorded(
            state.idempotency, key, Applied(applied_id, args.new, now, args.digest), now, settings
        )
    appended = msgspec.structs.replace(
        state,
        trace=(*state.trace, batch),
        next_batch_id=state.next_batch_id + 1,
        upper=args.new,
        writers={**state.writers, args.writer_id: writer},
        idempotency=idempotency_map,
    )
    planned, requests = plan_for(appended, now_ms, settings, args.writer_id)
    new = successor(planned, now_ms)
    return Change(new, Appended(args.new), Maintenance(gc=gc_due(new, settings), merges=requests))


@dataclass(frozen=True, slots=True)
class AppendFrom:
    """``append`` goes on with ``compare_and_append(expected=expected)``; when
    ``narrowed``, its parts get the window ``[expected, upper)`` (the updates before
    ``expected`` were appended already, by a replica)."""

    expected: int
    narrowed: bool


@dataclass(frozen=True, slots=True)
class AlreadyAppended:
    """The shard's upper ``current`` is at or beyond the append's upper: everything was
    written already; ``append`` does nothing (and deletes its parts)."""

    current: int


def append_case(current: int | None, lower: int, upper: int | None) -> AppendFrom | AlreadyAppended:
    """Decide ``append(updates, lower, upper)`` against the shard's upper ``current``.

    ``current == lower``: append; ``lower < current < upper``: append ``[current,
    upper)``, dropping the updates before ``current``; ``current >= upper``: nothing to
    do.

    Raises:
        InvalidBounds: ``lower`` is not before ``upper`` (checked first).
        UsageError: the shard is closed (``current`` is None).
        UpperMismatch: ``current < lower`` (a gap would open).
    """
    check_bounds(lower, upper, names=("lower", "upper"))
    if current is None:
        raise UsageError("append: the shard is closed (its upper is None); nothing can be added")
    if current < lower:
        raise UpperMismatch(lower, current)
    if upper is not None and current >= upper:
        return AlreadyAppended(current)
    return AppendFrom(current, current > lower)


def check_batch_covers(
    batch_lower: int, batch_upper: int | None, expected: int, new: int | None
) -> bool:
    """Check that a batch written for ``[batch_lower, batch_upper)`` can be applied for
    ``[expected, new)``; answer whether its parts need the window ``[expected, new)``.

    Raises:
        InvalidBounds: ``new`` is not beyond ``expected`` (checked first).
        UsageError: the batch does not cover ``[expected, new)``.
    """
    check_bounds(expected, new, names=("expected upper", "new upper"))
    if expected < batch_lower or not frontier.le(new, batch_upper):
        raise UsageError(
            f"a batch of [{batch_lower}, {batch_upper}) cannot be applied for "
            f"[{expected}, {new}): it must cover that range"
        )
    return expected > batch_lower or new != batch_upper


def check_batch_age(written_ms: int, now_ms: int, settings: PersistSettings) -> None:
    """Check that a batch written at ``written_ms`` (just before its oldest part) may still
    be applied at ``now_ms``: within half of ``batch_lease``, so GC (which deletes
    unreferenced parts older than the lease) cannot have taken its parts. A birth more
    than a quarter of the lease ahead of ``now_ms`` is refused too: its age could not be
    judged (a clock that far ahead, or a forged batch).

    Raises:
        UsageError: the batch is too old (write it again), or from the future.
    """
    age = now_ms - written_ms
    if age > settings.batch_lease_ms // 2:
        raise UsageError(
            f"batch too old: written {age} ms ago, more than half of "
            f"batch_lease ({settings.batch_lease} s); GC may delete its parts: write it again"
        )
    if -age > settings.batch_lease_ms // 4:
        raise UsageError(
            f"batch from the future: written {-age} ms after this clock's now, more than a "
            f"quarter of batch_lease ({settings.batch_lease} s); its age cannot be judged"
        )


def _hollow_windows(runs: Runs) -> dict[str, tuple[int, int | None]]:
    """The hollow parts of ``runs`` by key, with the written times each stands for."""
    return {
        part.key: (0, None) if part.window is None else (part.window.lower, part.window.upper)
        for run in runs
        for part in run
        if isinstance(part, HollowPart)
    }


def _referenced(state: State, runs: Runs) -> bool:
    """Whether the trace references a hollow part of ``runs``."""
    keys = _hollow_windows(runs)
    return bool(keys) and any(key in keys for batch in state.trace for key in batch.part_keys())


def _applied_twice(state: State, runs: Runs) -> str | None:
    """The key of a hollow part of ``runs`` that the trace references for written times
    overlapping the ones ``runs`` would add, or None."""
    mine = _hollow_windows(runs)
    if not mine:
        return None
    for batch in state.trace:
        for part in batch.parts():
            if isinstance(part, HollowPart) and part.key in mine:
                theirs = (
                    (0, None) if part.window is None else (part.window.lower, part.window.upper)
                )
                lo, hi = mine[part.key]
                if frontier.lt(max(lo, theirs[0]), frontier.meet((hi, theirs[1]))):
                    return part.key
    return None


def heartbeat_upper(
    state: State, now_ms: int, settings: PersistSettings, args: CompareAndAppend
) -> Outcome[Appended]:
    """``compare_and_append([], u, u)``: the seed's writer heartbeat (issue 27 departure).

    Rules: ``UsageError`` unless ``expected == new`` and no runs; ``UpperMismatch`` unless
    the shard's upper is ``expected``; a writer registered before and now gone:
    ``UsageError`` (lease expired); a writer never registered: NoOp (a heartbeat registers
    nothing); else its lease is extended.
    """
    if args.expected != args.new or args.runs:
        return refuse(UsageError("a heartbeat has no updates and new upper == expected upper"))
    if state.finalized or state.upper is None:
        return refuse(UpperMismatch(args.expected, None))
    if state.upper != args.expected:
        return refuse(UpperMismatch(args.expected, state.upper))
    writer = state.writers.get(args.writer_id)
    if writer is None:
        if args.registered:
            return refuse(
                UsageError(
                    f"writer {args.writer_id} is not registered: its lease expired; open a "
                    "new writer"
                )
            )
        return noop(Appended(args.expected))
    beat = msgspec.structs.replace(writer, last_heartbeat_ms=walltime_after(state, now_ms))
    new = successor(state, now_ms, writers={**state.writers, args.writer_id: beat})
    return Change(new, Appended(args.expected))
