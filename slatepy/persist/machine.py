"""The applier: runs pure transitions against a shard's consensus log (RFC 0015 §6.1 layer 2).

One :class:`ShardMachine` per ``(client, shard)`` caches the shard's state and is shared by
every handle of that client, so a commit made through one handle is visible to the others at
once (and wakes their waiting listens through a :class:`threading.Condition`).

A command is ``run(transition, args)``: take the cached state, run
``transitions.step`` (expiry, then the transition), turn the new state into a
:class:`StateDiff`, ``compare_and_set`` it at ``expected = state.seqno``. A ``Mismatch``
means another process committed first: apply what we missed and run the transition again,
with a small randomized backoff, up to :data:`MAX_ATTEMPTS` times (then
``StateConflictError``). A ``Break`` (a no-op or a refusal) decided on the cached state is
confirmed on the head first (one consensus read): an answer such as ``UpperMismatch`` is
never given from a stale cache.

**Indefinite failures.** A CAS whose outcome is unknown (``StoreUnavailable(definite=False)``)
may still have landed. The machine remembers the bytes of every attempt of the command; on
catching up, an entry equal to one of them *is* our commit (every diff carries a random
nonce, so no one else writes those bytes), and the command answers that attempt's result.
An entry of someone else at that seqno means ours can never land; no entry yet means we CAS
at that seqno again (at most one of the two can land). Only a cold load (the log was
truncated past the attempt) hides the answer: then the command's ``on_uncertain`` decides —
``compare_and_append`` reruns with ``uncertain=True`` and its idempotency token decides;
commands without one raise :class:`Indeterminate`. And while the log has not reached the
seqno of an uncertain attempt, that attempt may still land: the command then answers nothing
but our own commit, so a retry that stops there (a refusal, a failed batch-age check, a
closed client) raises :class:`Indeterminate` instead of its own error.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from slatepy.errors import ClosedError, SlatepyError, StoreUnavailable
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import Indeterminate, StateConflictError
from slatepy.persist.ids import new_nonce
from slatepy.persist.location.consensus import Committed, Consensus
from slatepy.persist.state.diff import StateDiff, encode_state_diff, entry_digest
from slatepy.persist.state.outcome import NO_MAINTENANCE, Break, Change, Maintenance, Outcome
from slatepy.persist.state.records import State
from slatepy.persist.state.transitions import AddRollup, add_rollup, step
from slatepy.persist.versions import Applied, Versions, shard_path
from slatepy.store.base import ObjectStore

A = TypeVar("A")
R = TypeVar("R")

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 64
"""CAS attempts of one command before ``StateConflictError`` (lost races and retries)."""

MAX_UNCERTAIN = 5
"""Indefinite failures one command survives (each followed by a re-read) before it raises."""

BACKOFF_STEP = 0.002
"""Seconds: the backoff before attempt ``n`` is uniform in ``[0, BACKOFF_STEP * n]``."""

POLL_MIN = 0.01
"""Seconds between polls of the head right after the shard changed."""

Transition = Callable[[State, int, PersistSettings, A], Outcome[R]]


def rerun_as_is(args: A) -> A:
    """``on_uncertain`` of an idempotent command: rerun it unchanged."""
    return args


def validate_by_default() -> bool:
    """Whether machines check every state they reach (``SLATEPY_PERSIST_VALIDATE=1``)."""
    return os.environ.get("SLATEPY_PERSIST_VALIDATE", "") not in ("", "0")


class Turns:
    """First come, first served among the threads running commands on one shard.

    Python's locks are not fair: a writer appending in a loop takes the machine's lock
    again before a thread woken to wait for it gets the GIL, so a compactor's apply could
    starve while the trace grows (measured: 2,000 appends in a loop, and not one merge
    applied). Each command takes a ticket and runs when its number comes up. Reentrant
    for the thread whose turn it is; a waiter interrupted while waiting gives its ticket
    up."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = 0
        self._serving = 0
        self._given_up: set[int] = set()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            ticket = self._next
            self._next += 1
            try:
                self._cond.wait_for(lambda: self._serving == ticket)
            except BaseException:
                self._given_up.add(ticket)
                self._advance()
                raise
            self._owner, self._depth = me, 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._serving += 1
                self._advance()

    def _advance(self) -> None:
        """Skip tickets given up, and wake the waiters (the next one runs)."""
        while self._serving in self._given_up:
            self._given_up.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()


class ShardMachine:
    """The cached state of one shard in one client, and the loop that changes it.

    Thread-safe: one lock serializes commands and catch-ups of this shard in this client.
    """

    def __init__(
        self,
        shard_id: str,
        consensus: Consensus,
        blob: ObjectStore,
        settings: PersistSettings,
        *,
        clock: Callable[[], float] = time.time,
        elapsed: Callable[[], float] | None = None,
        validate: bool | None = None,
    ) -> None:
        self.shard_id = shard_id
        self.consensus = consensus
        self.blob = blob
        self.settings = settings
        self.clock = clock
        # Measures time passing (``time.monotonic`` beside the real wall clock; a test's
        # clock measures its own time).
        self.elapsed = elapsed or (time.monotonic if clock is time.time else clock)
        self._anchor: tuple[int, float, bool] | None = None
        self._versions = Versions(
            shard_id,
            consensus,
            blob,
            settings,
            validate=validate_by_default() if validate is None else validate,
        )
        self._turns = Turns()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closed = False
        self._rolling_up = False

    # -- reading the state ----------------------------------------------------------------

    @property
    def state(self) -> State:
        """The cached state (no I/O; loads it on first use)."""
        with self._lock:
            if not self._versions.loaded:
                self._refresh()
            return self._versions.state

    def fetch(self, *, maintain: bool = True) -> State:
        """The state at the consensus head (linearized: reflects every commit that finished
        before this call). ``maintain=False``: never write a rollup that is due (a caller
        that must only read)."""
        with self._lock:
            self._refresh(rollup=maintain)
            return self._versions.state

    def wait_cached(self, ready: Callable[[State], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the cached state (moved by this client's
        commits and catch-ups) to satisfy ``ready``; no I/O. False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._closed or ready(self._versions.state), timeout
            )

    def wait_for_change(self, seqno: int, timeout: float) -> State:
        """Wait up to ``timeout`` seconds for the cached state to pass ``seqno`` through a
        commit or catch-up of this client (no I/O); returns the cached state."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._closed or self._versions.state.seqno > seqno, timeout
            )
            return self._versions.state

    def wait_until(self, ready: Callable[[State], bool], timeout: float | None) -> State | None:
        """Poll the head until ``ready(state)``; None when ``timeout`` seconds passed first
        (``None``: no limit). Adaptive: 10 ms after a change, doubling to
        ``listen_poll_max`` while idle; a commit of this client wakes it at once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = POLL_MIN
        while True:
            state = self.fetch()
            if ready(state):
                return state
            wait = delay
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                wait = min(wait, remaining)
            if self.wait_for_change(state.seqno, wait).seqno != state.seqno:
                delay = POLL_MIN
            else:
                delay = min(delay * 2, self.settings.listen_poll_max)

    def close(self) -> None:
        """Wake every waiter; later commands raise ``ClosedError``."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the persist client of shard {self.shard_id!r} is closed")

    def _refresh(self, *, rollup: bool = True) -> list[Applied]:
        self._check_open()
        before = self._versions.state.seqno
        applied = self._versions.refresh()
        self._observe()
        if self._versions.state.seqno != before:
            self._changed.notify_all()
        if rollup:
            self._maybe_rollup()
        return applied

    # -- running commands -----------------------------------------------------------------

    def now_ms(self) -> int:
        """This process's wall clock in ms (batch and rollup ages, GC's age cutoff)."""
        return int(self.clock() * 1000)

    def _observe(self) -> None:
        """Anchor :meth:`state_now_ms` at the first state with history this process holds
        (read, caught up or committed by it)."""
        if self._anchor is None and self._versions.state.seqno:
            self._anchor = self._anchor_at(self._versions.state.walltime_ms)

    def _anchor_at(self, walltime_ms: int) -> tuple[int, float, bool]:
        """The anchor at a state of walltime ``walltime_ms`` read now: that walltime, the
        elapsed clock, and whether this process's clock may lead the walltime (by up to
        ``max_clock_skew``): only when it was within the skew of that walltime then."""
        trusted = self.now_ms() <= walltime_ms + self.settings.max_clock_skew_ms
        return walltime_ms, self.elapsed(), trusted

    def state_now_ms(self, state: State) -> int:
        """The clock a transition on ``state`` runs with: the state's next walltime is
        ``max(walltime + 1, this)`` (``outcome.walltime_after``), and every lease, claim
        and key TTL is judged by walltimes.

        Bounded by what this process has seen pass (RFC 0015, issue 27 addendum on clocks):
        with ``(w0, e0)`` the walltime of the first state it read (or ran a command on) and
        the elapsed clock then, and ``lo = w0 + elapsed since``, the answer is
        ``max(lo, min(clock, lo + skew))``. A host whose clock runs a day ahead moves the
        walltime at most ``max_clock_skew`` beyond what others extrapolate, however often
        it commits (the bound does not follow its own commits); a walltime ahead of every
        clock still advances at the rate time passes (``lo``), so expiry is never frozen.
        The shard's first commit takes the clock as it is (nothing to compare with)."""
        now = self.now_ms()
        if not state.seqno:
            return now
        if self._anchor is None:
            self._anchor = self._anchor_at(state.walltime_ms)
        walltime, since, trusted = self._anchor
        lo = walltime + int((self.elapsed() - since) * 1000)
        if not trusted:
            # Our clock was more than the skew ahead of the first walltime we read: we
            # are a fast host, or the shard sat idle. Either way only time we saw pass
            # counts. Granting the skew here let a fast host push the walltime one more
            # skew ahead with every fresh client (each anchored at the walltime its last
            # one pushed), taking live leases over (a CLI run or Spark task per client).
            return lo
        return max(lo, min(now, lo + self.settings.max_clock_skew_ms))

    def run(
        self,
        transition: Transition[A, R],
        args: A,
        *,
        on_uncertain: Callable[[A], A] | None = None,
        check: Callable[[int], None] | None = None,
        maintenance: Callable[[Maintenance], None] | None = None,
    ) -> R:
        """Commit ``transition(args)`` and answer its result (or raise its refusal).

        Args:
            transition: A pure transition (``state/``).
            args: Its arguments.
            on_uncertain: How to rerun after an attempt failed indefinitely and the log can
                no longer show whether it landed (``compare_and_append``: mark the args
                ``uncertain``, so its token decides; an idempotent command: unchanged args).
                None: such a command raises ``Indeterminate``.
            check: Called with the clock (ms) before every CAS attempt; raises to abandon
                the command (a batch grown too old, RFC §6.4).
            maintenance: Given the background work the committed change made due (merge
                requests, a due GC), to queue it; must not block or raise.

        Raises:
            The transition's refusal; ``StateConflictError`` after :data:`MAX_ATTEMPTS` lost
            races; ``StoreUnavailable`` when consensus fails (``definite=False`` when an
            attempt may have landed); ``Indeterminate`` when that cannot be decided.
        """
        with self._turns, self._lock:
            result = self._run(transition, args, on_uncertain, check, maintenance)
            self._maybe_rollup()
            return result

    def _run(
        self,
        transition: Transition[A, R],
        args: A,
        on_uncertain: Callable[[A], A] | None,
        check: Callable[[int], None] | None,
        maintenance: Callable[[Maintenance], None] | None = None,
    ) -> R:
        attempt = _Attempts()
        attempts: dict[bytes, Change[R]] = {}
        # Every entry applied while this command runs is kept: an attempt of ours may land
        # and be applied by a catch-up whose later page then fails; forgetting it would
        # rerun the command on a state that already holds it (a landed merge answered
        # NotApplied, a landed opaque downgrade answered OpaqueMismatch).
        outer, self._versions.seen = self._versions.seen, []
        try:
            return self._attempts(
                transition,
                args,
                on_uncertain,
                check,
                tried=attempt,
                attempts=attempts,
                maintenance=maintenance,
            )
        except SlatepyError as exc:
            ours = self._ours(attempts)
            if ours is not None:
                return _committed(ours, maintenance)
            if self._versions.state.seqno < attempt.pending and not _is_indefinite(exc):
                raise Indeterminate(
                    f"shard {self.shard_id!r}: a state change failed indefinitely, then its "
                    f"retry stopped ({exc}); the first attempt may still land at seqno "
                    f"{attempt.pending}: read the shard to find out"
                ) from exc
            raise
        finally:
            self._versions.seen = outer

    def _ours(self, attempts: dict[bytes, Change[R]]) -> Change[R] | None:
        """Our attempt among the entries applied during this command, if one landed."""
        seen = self._versions.seen
        return self._match(seen, attempts) if seen and attempts else None

    def _attempts(
        self,
        transition: Transition[A, R],
        args: A,
        on_uncertain: Callable[[A], A] | None,
        check: Callable[[int], None] | None,
        *,
        tried: _Attempts,
        attempts: dict[bytes, Change[R]],
        maintenance: Callable[[Maintenance], None] | None,
    ) -> R:
        # Whether the cached state was read from consensus during this command: a Break
        # decided on a stale cache (say, an upper mismatch) is confirmed on a fresh one.
        fresh = False
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._check_open()
            stale = (
                time.monotonic() - self._versions.confirmed > self.settings.consensus_min_age / 2
            )
            if not self._versions.loaded or stale:
                self._refresh(rollup=False)
                fresh = True
            ours = self._ours(attempts)
            if ours is not None:  # applied by a catch-up that failed on a later page
                return _committed(ours, maintenance)
            state = self._versions.state
            if check is not None:
                check(self.now_ms())
            outcome = step(state, self.state_now_ms(state), self.settings, transition, args)
            if isinstance(outcome, Break):
                if not fresh:
                    self._refresh(rollup=False)
                    fresh = True
                    continue
                if state.seqno < tried.pending:
                    raise Indeterminate(
                        f"shard {self.shard_id!r}: a retry of a state change that failed "
                        "indefinitely no longer applies, and the first attempt may still land"
                    )
                return outcome.answer()
            data = self._encode(state, outcome.state)
            attempts[data] = outcome
            try:
                cas = self.consensus.compare_and_set(
                    self.shard_id, state.seqno if state.seqno else None, data
                )
            except StoreUnavailable as exc:
                if exc.definite and not tried.uncertain:
                    raise
                tried.uncertain += 1
                tried.pending = state.seqno + 1
                if tried.uncertain > MAX_UNCERTAIN:
                    raise _indefinite(exc) from exc
                resolved = self._resolve(attempts, on_uncertain is not None, exc)
                if resolved is not None:
                    return _committed(resolved, maintenance)
                fresh = False
                if on_uncertain is not None:
                    args = on_uncertain(args)
                continue
            if isinstance(cas, Committed):
                self._versions.advance(outcome.state, data)
                self._observe()
                self._changed.notify_all()
                return _committed(outcome, maintenance)
            ours = self._match(self._versions.catch_up(state.seqno + 1, cas.current), attempts)
            if ours is not None:
                return _committed(ours, maintenance)
            fresh = True
            self._changed.notify_all()
            time.sleep(random.uniform(0, BACKOFF_STEP * attempt))
        raise StateConflictError(
            f"shard {self.shard_id!r}: gave up after {MAX_ATTEMPTS} lost compare-and-set races "
            "on its consensus log; nothing was committed"
        )

    def _encode(self, old: State, new: State) -> bytes:
        prev = entry_digest(self._versions.entry) if self._versions.entry is not None else 0
        diff = StateDiff.between(old, new, nonce=new_nonce(), prev_digest=prev)
        return encode_state_diff(diff)

    def _resolve(
        self, attempts: dict[bytes, Change[R]], can_rerun: bool, cause: StoreUnavailable
    ) -> Change[R] | None:
        """After an indefinite CAS: re-read the log. Our attempt's bytes there → committed
        (returned). Otherwise None: rerun (someone else's entry took the slot, nothing is there
        yet, or the re-read failed: a rerun CASes at the same seqno, so at most one lands).

        Raises:
            Indeterminate: a cold load hid the answer and the command cannot rerun safely.
        """
        loaded_before = self._versions.state.seqno
        try:
            applied = self._versions.refresh()
        except StoreUnavailable:
            # The next attempt CASes from the cached state: a landed attempt then comes
            # back as the mismatch's entry (or in the catch-up after it) and is recognized.
            return None
        if applied:
            self._changed.notify_all()
        ours = self._match(applied, attempts)
        if ours is not None:
            return ours
        if not applied and self._versions.state.seqno != loaded_before and not can_rerun:
            raise Indeterminate(
                f"shard {self.shard_id!r}: a state change failed indefinitely ({cause}) and the "
                "consensus log was truncated past it before it could be checked; read the "
                "shard to find out whether it landed"
            )
        return None

    @staticmethod
    def _match(applied: list[Applied], attempts: dict[bytes, Change[R]]) -> Change[R] | None:
        for entry in applied:
            change = attempts.get(entry.data)
            if change is not None:
                return change
        return None

    # -- rollups --------------------------------------------------------------------------

    def _maybe_rollup(self) -> None:
        """Write and register a rollup when one is due (RFC §4.3). Best effort: the
        command that made it due has committed already; a failure is logged and the next
        commit tries again."""
        if self._rolling_up or self._closed or not self._versions.rollup_due():
            return
        self._rolling_up = True
        written_ms = self.now_ms()  # before the PUT: the blob is at least this old

        def young_enough(now_ms: int) -> None:
            # GC deletes unreferenced rollups older than batch_lease: registering one only
            # within half of it (as batches, RFC §6.4) keeps the head from naming a deleted
            # rollup, which would fail every cold load.
            if now_ms - written_ms > self.settings.batch_lease_ms // 2:
                raise _RollupTooOld

        try:
            seqno, ref = self._versions.write_rollup()
            try:
                added = self._run(add_rollup, AddRollup(seqno, ref), rerun_as_is, young_enough)
            except _RollupTooOld:
                added = False  # the next commit that finds one due writes a fresh one
            if not added:
                self.blob.delete(shard_path(self.shard_id, ref.key))
        except Exception:  # maintenance must not fail a command that has committed
            log.warning("shard %r: writing a rollup failed", self.shard_id, exc_info=True)
        finally:
            self._rolling_up = False


class _RollupTooOld(Exception):
    """A rollup blob grew too old to register before its CAS (see ``_maybe_rollup``)."""


@dataclass(slots=True)
class _Attempts:
    """What a command's indefinite failures left open."""

    uncertain: int = 0
    """Attempts that failed indefinitely."""
    pending: int = 0
    """The seqno the latest of them wrote at (0: none): until the log reaches it, that
    attempt may still land, so the command may answer nothing but our commit."""


def _committed(change: Change[R], maintenance: Callable[[Maintenance], None] | None) -> R:
    """The result of a committed change, its due maintenance handed on."""
    if maintenance is not None and change.maintenance != NO_MAINTENANCE:
        maintenance(change.maintenance)
    return change.result


def _is_indefinite(exc: BaseException) -> bool:
    return isinstance(exc, StoreUnavailable) and not exc.definite


def _indefinite(exc: StoreUnavailable) -> StoreUnavailable:
    """``exc`` as an indefinite failure (an earlier attempt may have landed)."""
    if not exc.definite:
        return exc
    return StoreUnavailable(
        f"{exc}; an earlier attempt of this state change may have landed", definite=False
    )
