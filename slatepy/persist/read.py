"""Leased read handles: ``snapshot``, ``listen``, ``subscribe`` and the reader's since (RFC
0015 §7.1-§7.4).

A read handle is registered in the shard's state (a lease) and holds the shard's since at
its own since: times at or after it stay exact. Reads wait for the upper with
``ShardMachine.wait_until`` (polling the head; commits of the same client wake them at once).

**A listen's since hold.** The since the handle sends is the meet of what the caller asked
for and ``frontier - 1`` of each open listen: compaction may then forward delivered times
(``< frontier``) only up to ``frontier - 1``, where the filter ``t >= frontier`` cannot
deliver them again, and leaves undelivered ones unchanged (RFC §7.3).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from slatepy.closing import Closing
from slatepy.errors import ClosedError, CorruptionError, NotFound, StoreError
from slatepy.persist import frontier, ranges
from slatepy.persist.codec import Update
from slatepy.persist.errors import SinceError, StateConflictError, UsageError
from slatepy.persist.frontier import Frontier
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.parts import merge_runs
from slatepy.persist.state.records import HollowPart, Run, State
from slatepy.persist.state.transitions import (
    DowngradeSince,
    ExpireLeasedReader,
    HeartbeatLeasedReader,
    downgrade_since,
    expire_leased_reader,
    heartbeat_leased_reader,
)
from slatepy.persist.validate import check_frontier, check_time
from slatepy.table.reader import TableReader


@dataclass(frozen=True, slots=True)
class Updates:
    """Updates a listen delivers (each update with ``t > as_of`` exactly once)."""

    updates: list[Update]


@dataclass(frozen=True, slots=True)
class Progress:
    """Every update at a time before ``upper`` was delivered (``None``: the listen ended)."""

    upper: int | None


Event = Updates | Progress


log = logging.getLogger(__name__)


def _check_as_of(as_of: object, since: Frontier) -> int:
    """``frontier.check_as_of`` for a caller's value: ``SinceError`` for None or a time
    before ``since``, ``UsageError`` for anything but a u64 int."""
    return frontier.check_as_of(None if as_of is None else check_time(as_of, "as_of"), since)


class ReadHandle(Closing):
    """Reads one shard as of times at or after its since. Open with
    ``PersistClient.open_leased_reader``.

    Attributes:
        shard_id: The shard.
        reader_id: This handle's leased reader id (``r`` + 32 hex).
    """

    def __init__(
        self, machine: ShardMachine, tables: TableReader, reader_id: str, since: Frontier
    ) -> None:
        self.shard_id = machine.shard_id
        self.reader_id = reader_id
        self._machine = machine
        self._tables = tables
        self._since = since
        self._requested = since
        # Held weakly: a listen dropped without close() stops holding the since at the
        # next push (a heartbeat, a downgrade, another listen's progress), not at the
        # handle's end (issue 27).
        self._listens: weakref.WeakSet[Listen] = weakref.WeakSet()
        self._pins: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._expired = False

    @property
    def since(self) -> Frontier:
        """This reader's since as last committed (reads before it raise ``SinceError``)."""
        return self._since

    @property
    def closed(self) -> bool:
        """Whether the handle was closed (or expired): it is unusable."""
        return self._expired

    def downgrade_since(self, new_since: Frontier) -> Frontier:
        """Allow compaction to forward times before ``new_since`` (``None``: this reader
        will read nothing more). Only moves forward: a smaller ``new_since`` is a no-op.
        An open listen holds the since at its ``frontier - 1`` until it moves on.
        Durable on return; answers the reader's since.

        Raises:
            UsageError: ``new_since`` is not an int or None, or the reader's lease expired.
        """
        check_frontier(new_since, "new since")
        with self._lock:
            self._check_live()
            self._requested = frontier.join(self._requested, new_since)
            return self._push_since()

    def _push_since(self) -> Frontier:
        """Commit the effective since (caller holds the lock) if it is beyond the current."""
        holds = [
            listen.frontier - 1
            for listen in list(self._listens)
            if listen.frontier is not None and not listen._closed
        ]
        target = frontier.meet((self._requested, *holds)) if holds else self._requested
        if frontier.le(target, self._since):
            return self._since
        self._since = self._machine.run(
            downgrade_since, DowngradeSince(self.reader_id, target), on_uncertain=rerun_as_is
        )
        return self._since

    def snapshot(self, as_of: int, *, timeout: float | None = None) -> list[Update]:
        """The shard's contents as of ``as_of``: every update at ``t <= as_of`` with its time
        advanced to ``as_of``, consolidated (summed, no zero diffs), sorted. Waits until the
        upper is beyond ``as_of``.

        Raises:
            SinceError: ``as_of`` is before this reader's since (or None).
            TimeoutError: the upper did not pass ``as_of`` within ``timeout`` seconds.
            UsageError: the reader's lease expired.
        """
        return list(self.snapshot_iter(as_of, timeout=timeout))

    def snapshot_iter(
        self,
        as_of: int,
        *,
        timeout: float | None = None,
        keys: tuple[bytes | None, bytes | None] = (None, None),
    ) -> Iterator[Update]:
        """:meth:`snapshot` as a stream in bounded memory (one part per run). The checks
        and the wait happen at the call; the parts are read as the stream is consumed.
        ``keys``: only the updates whose key lies in ``[lower, upper)`` (None: unbounded),
        reading only the blob parts that may hold them (``ranges.prune``): the snapshot
        split by :func:`slatepy.persist.ranges.split_keys` reads back whole."""
        with self._lock:
            self._check_live()
            _check_as_of(as_of, self._since)
        state = self._wait_pinned(lambda s: frontier.lt(as_of, s.upper), timeout)
        if state is None:
            raise TimeoutError(
                f"shard {self.shard_id!r}: the upper did not pass {as_of} within {timeout} s"
            )
        try:
            self._check_registered(state)
            self._check_held(state, as_of)
        except UsageError:
            self._unpin(state.seqno)
            raise
        runs = [
            ranges.prune(run, *keys)
            for batch in state.trace
            if batch.desc.lower <= as_of
            for run in batch.runs
        ]
        updates = self._guarded(runs, as_of)
        if keys != (None, None):
            updates = ranges.in_range(updates, *keys)
        return _Pinned(self, state.seqno, updates)

    def _wait_pinned(self, ready: Callable[[State], bool], timeout: float | None) -> State | None:
        """Wait for a state that is ``ready`` and pin its seqno (the caller unpins it). The
        cached seqno is pinned while waiting, so a heartbeat in between can never release a
        state this read is about to use (states only move forward)."""
        floor = self._machine.state.seqno
        self._pin(floor)
        try:
            state = self._machine.wait_until(ready, timeout)
            if state is not None:
                self._pin(state.seqno)
            return state
        finally:
            self._unpin(floor)

    def _guarded(self, runs: list[Run], as_of: int | None) -> Generator[Update, None, None]:
        try:
            yield from merge_runs(
                self._tables,
                self.shard_id,
                runs,
                as_of=as_of,
                memory_bytes=self._machine.settings.snapshot_memory_bytes,
            )
        except NotFound as exc:
            self._check_registered(self._machine.fetch())
            raise CorruptionError(
                f"shard {self.shard_id!r}: a part a live reader needs is missing: {exc}",
                path=exc.path,
            ) from exc

    def _pin(self, seqno: int) -> None:
        with self._lock:
            self._pins[seqno] += 1

    def _unpin(self, seqno: int) -> None:
        with self._lock:
            self._pins[seqno] -= 1
            if not self._pins[seqno]:
                del self._pins[seqno]

    def heartbeat(self) -> None:
        """Extend this reader's lease and move its seqno hold to the oldest state a read
        in progress still uses (else the cached state), then push the since a listen hold
        kept back. Called by the client's heartbeat thread every ``reader_lease / 4``.

        Raises:
            UsageError: the lease expired already (the handle's next read says so too).
        """
        with self._lock:
            if self._expired:
                return
            seqno = min(self._pins) if self._pins else self._machine.state.seqno
            self._machine.run(
                heartbeat_leased_reader,
                HeartbeatLeasedReader(self.reader_id, seqno),
                on_uncertain=rerun_as_is,
            )
            self._push_since()

    def listen(self, as_of: int) -> Listen:
        """Updates strictly after ``as_of``, as they are appended (see :class:`Listen`).

        Raises:
            SinceError: ``as_of`` is before this reader's since (or None).
        """
        return self._open_listen(as_of, None)

    def subscribe(self, as_of: int, *, timeout: float | None = None) -> Listen:
        """A listen whose first event is the snapshot at ``as_of`` as one :class:`Updates`.

        Raises:
            SinceError, TimeoutError, UsageError: as :meth:`snapshot`.
        """
        return self._open_listen(as_of, self.snapshot(as_of, timeout=timeout))

    def _open_listen(self, as_of: int, initial: list[Update] | None) -> Listen:
        with self._lock:
            self._check_live()
            _check_as_of(as_of, self._since)
            listen = Listen(self, as_of, initial)
            self._listens.add(listen)
            return listen

    def _listen_moved(self, listen: Listen, *, closed: bool = False) -> None:
        """A listen moved its frontier (or closed): push the since its hold kept back.
        Best effort: the events are delivered already, and a since left behind is only
        held longer (the next push or heartbeat moves it)."""
        with self._lock:
            if closed:
                self._listens.discard(listen)
            if self._expired:
                return
            try:
                self._push_since()
            except (StoreError, UsageError, StateConflictError):
                log.warning("shard %r: pushing the since failed", self.shard_id, exc_info=True)

    def expire(self) -> None:
        """Remove this reader from the shard (one state change), releasing its since hold.
        Idempotent; the handle and its listens are unusable afterwards."""
        with self._lock:
            if self._expired:
                return
            # Marked only once committed: an expire that failed can be called again.
            self._machine.run(
                expire_leased_reader, ExpireLeasedReader(self.reader_id), on_uncertain=rerun_as_is
            )
            self._expired = True
            self._listens.clear()

    def close(self) -> None:
        """Release this reader: :meth:`expire` (its lease and since hold end now, not when
        the lease would lapse). Idempotent."""
        self.expire()

    def _check_live(self) -> None:
        if self._expired:
            raise ClosedError(f"reader {self.reader_id} of shard {self.shard_id!r} was expired")

    def _check_held(self, state: State, as_of: int) -> None:
        """``SinceError`` unless the since committed for this reader in ``state`` is at most
        ``as_of``. The handle's own since can lag it: a ``downgrade_since`` that failed
        indefinitely may have landed, and compaction may have forwarded times to it since."""
        held = state.leased_readers[self.reader_id].since
        with self._lock:
            self._since = frontier.join(self._since, held)
        if not frontier.le(held, as_of):
            raise SinceError(as_of, held)

    def _check_registered(self, state: State) -> None:
        if self.reader_id not in state.leased_readers:
            raise UsageError(
                f"reader {self.reader_id} of shard {self.shard_id!r} is not registered: its "
                "lease expired (or the shard was finalized); open a new reader"
            )


class Listen(Closing):
    """The updates of a shard after ``as_of``, in order of time, as they are appended.

    Each :meth:`fetch_next` answers ``[Updates(...), Progress(upper)]`` (no ``Updates``
    when nothing new has data): every update with ``t > as_of`` is delivered exactly once,
    every update before ``Progress(p)`` has ``t < p``, uppers strictly increase, and
    ``Progress(None)`` ends the listen. Iterating blocks for the next events.

    Attributes:
        frontier: Every update before it was delivered (``as_of + 1`` at the start;
            ``None`` once the shard closed).
    """

    def __init__(self, handle: ReadHandle, as_of: int, initial: list[Update] | None) -> None:
        self.frontier: Frontier = as_of + 1
        self._handle = handle
        self._initial = initial
        self._closed = False
        self._progressed = False
        """Whether a ``Progress`` was delivered: the first one comes as soon as the upper is
        past ``as_of``, even with no update in ``(as_of, upper)`` (as Materialize's listen)."""

    def fetch_next(self, timeout: float | None = None) -> list[Event]:
        """The next events; ``[]`` when the upper did not move within ``timeout`` seconds
        (or the listen ended). ``None`` waits as long as it takes.

        Raises:
            UsageError: the reader's lease expired.
        """
        if self._initial is not None:
            initial, self._initial = self._initial, None
            return [Updates(initial)]
        if self._closed or self.frontier is None:
            return []
        if self._handle._expired:
            raise ClosedError(f"reader {self._handle.reader_id} was expired")
        start = self.frontier
        if self._progressed:
            ready: Callable[[State], bool] = lambda s: frontier.lt(start, s.upper)  # noqa: E731
        else:
            ready = lambda s: frontier.le(start, s.upper)  # noqa: E731
        state = self._handle._wait_pinned(ready, timeout)
        if state is None:
            return []
        try:
            self._handle._check_registered(state)
            self._handle._check_held(state, start - 1)
            runs = [
                live
                for batch in state.trace
                if frontier.lt(start, batch.desc.upper)
                for live in (_from_time(run, start) for run in batch.runs)
                if live
            ]
            updates = [u for u in self._handle._guarded(runs, None) if u[1] >= start]
        finally:
            self._handle._unpin(state.seqno)
        events: list[Event] = [Updates(updates)] if updates else []
        events.append(Progress(state.upper))
        self.frontier = state.upper
        self._progressed = True
        self._handle._listen_moved(self)
        return events

    @property
    def ended(self) -> bool:
        """Whether the listen is closed, or delivered ``Progress(None)`` and nothing is left."""
        return self._closed or (self.frontier is None and self._initial is None)

    def __iter__(self) -> Iterator[Event]:
        """Block for events until the listen ends (``Progress(None)``) or is closed."""
        while not self.ended:
            yield from self.fetch_next()

    def close(self) -> None:
        """Stop listening and release this listen's since hold."""
        if not self._closed:
            self._closed = True
            self._handle._listen_moved(self, closed=True)


def _from_time(run: Run, start: int) -> Run:
    """``run`` without the blob parts whose times all lie before ``start`` (a batch a
    metadata merge extended is seen again by a listen; its old parts need no GET)."""
    return tuple(
        p for p in run if not (isinstance(p, HollowPart) and max(p.t_max, p.forward) < start)
    )


class _Pinned(Iterator[Update]):
    """A snapshot stream that holds its state's seqno in the reader (it takes over a pin the
    caller took) until it is exhausted, closed or dropped, so the heartbeat never releases
    parts it may still fetch."""

    def __init__(
        self, handle: ReadHandle, seqno: int, updates: Generator[Update, None, None]
    ) -> None:
        self._updates = updates
        self._release = weakref.finalize(self, handle._unpin, seqno)

    def __next__(self) -> Update:
        try:
            return next(self._updates)
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        """Stop reading and release the seqno hold."""
        self._updates.close()
        self._release()


UNLEASED_ATTEMPTS = 5
"""Reads of :func:`latest_snapshot` before it gives up on parts vanishing under it."""


def latest_snapshot(
    machine: ShardMachine, tables: TableReader, *, attempts: int = UNLEASED_ATTEMPTS
) -> tuple[int | None, list[Update]]:
    """The shard's upper at the consensus head and its contents as of ``upper - 1``
    (nothing at upper 0 or once closed), read with no reader: no registration, no rollup,
    no state change at all, so read-only tools neither pay for writes nor move the seqno a
    writer's next compare-and-set expects. Without a reader's seqno hold, GC may delete a
    part of the state read once later states replaced it: the read then starts over from
    the new head.

    Raises:
        SinceError: the shard's since is beyond ``upper - 1`` (those times may be forwarded).
        CorruptionError: a part of the head state is missing.
        StateConflictError: parts vanished under each of ``attempts`` reads (nothing
            changed; the shard moves faster than it can be read).
    """
    for _ in range(attempts):
        state = machine.fetch(maintain=False)
        if not state.upper:
            return state.upper, []
        as_of = state.upper - 1
        if not frontier.le(state.since, as_of):
            raise SinceError(as_of, state.since)
        runs = [run for batch in state.trace for run in batch.runs]
        memory = machine.settings.snapshot_memory_bytes
        try:
            updates = list(
                merge_runs(tables, machine.shard_id, runs, as_of=as_of, memory_bytes=memory)
            )
        except NotFound as exc:
            if machine.fetch(maintain=False).seqno == state.seqno:
                raise CorruptionError(
                    f"shard {machine.shard_id!r}: a part of its current state is missing: {exc}",
                    path=exc.path,
                ) from exc
            continue
        return state.upper, updates
    raise StateConflictError(
        f"shard {machine.shard_id!r}: parts were deleted under each of {attempts} unleased "
        "reads; nothing was changed"
    )
