"""Optimistic transactions over ``Db`` (RFC 0020).

A transaction starts at the writer's current sequence number ``S`` (its snapshot), buffers
its writes, and reads through to the database with its own writes laid over. At commit its
writes go through the same path as ``Db.write(batch)`` (one WAL generation: atomic, and
durable when ``commit()`` returns unless called with ``await_durable=False``), after a
validation that runs under the writer's lock, so no other write can land between the check
and the apply:

* both isolations: *write-write*: a key it writes was written by someone else after ``S``;
* ``"serializable"`` also *read-write*: a key it read, or a key in a range it scanned, was
  written after ``S``.

Either raises :class:`~slatepy.errors.TransactionConflict` and applies nothing.

Reads: the memtable keeps one version per key, so a transaction cannot read "the value as
of ``S``" once a later write replaced it. Its reads therefore go to the current state and
check the version's seq: a key written after ``S`` raises ``TransactionConflict`` at once
(the value it would need is gone), so every value a transaction reads is the one of its
snapshot. Expiry (TTL, RFC 0019) is judged as of the start, as a snapshot judges it as of
when it was taken: a value live at ``S`` reads as live for the whole transaction (RFC 0026).
This is stricter than textbook snapshot isolation (which would read the old value
and might commit); it never returns an inconsistent read. Write skew is allowed under
``"snapshot"`` when both transactions read before either commits, and prevented under
``"serializable"``.

Conflict tracking (:class:`ConflictTracker`): the commit seq of the newest write of every
key written since the oldest open transaction began, recorded by the writer under its lock.
Nothing is kept while no transaction is open; entries older than the oldest open
transaction are dropped as transactions end. Memory is bounded by ``MAX_TRACKED_KEYS``:
past it the oldest entries are dropped and the *horizon* rises, and a transaction that began
below the horizon fails its commit with ``TransactionConflict`` (it ran while more than that
many keys were written: retry it). Ingested SSTs (``Db.ingest``) are not tracked: a
transaction's reads still see their newer seqs and fail, but a blind write over an
ingested key is not a conflict.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import count, islice
from typing import TYPE_CHECKING, Literal, Protocol

from slatepy.engine.batch import Op, check_key, check_range, check_value
from slatepy.engine.iterator import Kinds, check_limit, live_columns
from slatepy.errors import ClosedError, InvalidArgument, TransactionConflict

if TYPE_CHECKING:
    from slatepy.engine.iterator import View
    from slatepy.engine.memtable import Version
    from slatepy.table.visibility import Clock

Isolation = Literal["snapshot", "serializable"]
MAX_TRACKED_KEYS = 1_000_000
"""Newest-write records kept for conflict checks (about 100 bytes each plus the key)."""


class TxnHost(Protocol):
    """What a transaction uses of the ``Db`` that began it, passed in: this module stays
    below ``slatepy.engine.db`` (which builds transactions) without an import circle."""

    @property
    def _closed(self) -> bool: ...

    def _version(self, key: bytes, clock: Clock | None = None) -> Version | None: ...

    def _view_for(self, start: bytes, end: bytes | None, clock: Clock | None = None) -> View: ...

    def _apply(
        self,
        ops: Sequence[tuple[bytes, bytes | None]],
        await_durable: bool,
        *ranges: tuple[bytes, bytes],
        check: Callable[[], None] | None = None,
    ) -> None: ...


class ConflictTracker:
    """The newest write seq of each key written since the oldest open transaction began.

    Every method but :meth:`begin` is called under the writer's lock (``Db._lock``), which
    orders them with the writes themselves. ``Db.begin`` registers without it while no write
    holds it (RFC 0020, "Several threads"): the token goes into :attr:`open` before the
    start seq is read, and each write reads :attr:`open` after taking its seq, so a write
    above the start always records its keys.
    """

    def __init__(self, max_keys: int = MAX_TRACKED_KEYS) -> None:
        self._max_keys = max_keys
        self._last: dict[bytes, int] = {}
        self._log: deque[tuple[int, list[bytes]]] = deque()
        self._ranges: list[tuple[bytes, bytes, int]] = []  # range deletes (RFC 0019), by seq
        self.open: dict[int, int] = {}
        """Open transactions' tokens, each to the seq its records are kept from: empty (false)
        while none is open, when writes record nothing. A plain dict the writer tests on
        every write (a property would cost a call)."""
        self._tokens = count(1)
        self.horizon = 0
        """Transactions that began below this seq may have lost records: they conflict."""

    def begin(self, floor_seq: int) -> int:
        """Register a transaction whose start is ``floor_seq`` or later (``Db.begin`` reads
        it after this call): records of writes above ``floor_seq`` are kept while it is
        open. Returns its token for :meth:`end`."""
        token = next(self._tokens)
        self.open[token] = floor_seq
        return token

    def end(self, token: int) -> None:
        self.open.pop(token, None)
        if not self.open:
            self._last.clear()
            self._log.clear()
            self._ranges.clear()
            self.horizon = 0
            return
        self._trim(min(self.open.values()))

    def record(self, ops: Sequence[Op], seq: int) -> None:
        keys = [key for key, _ in ops]
        last = self._last
        for key in keys:
            last[key] = seq
        self._log.append((seq, keys))
        if len(last) > self._max_keys:
            while len(last) > self._max_keys // 2 and self._log:
                self.horizon = self._log[0][0]
                self._drop_oldest()

    def record_ranges(self, ranges: Sequence[tuple[bytes, bytes]], seq: int) -> None:
        """Range deletes of ``[start, end)`` at ``seq``: a write to every key under them."""
        self._ranges.extend((start, end, seq) for start, end in ranges)

    def _trim(self, below: int) -> None:
        """Drop records no open transaction can conflict with (seq <= ``below``)."""
        while self._log and self._log[0][0] <= below:
            self._drop_oldest()
        if self._ranges:
            self._ranges = [r for r in self._ranges if r[2] > below]

    def _drop_oldest(self) -> None:
        seq, keys = self._log.popleft()
        last = self._last
        for key in keys:
            if last.get(key) == seq:
                del last[key]

    def written_after(self, key: bytes, seq: int) -> bool:
        if self._last.get(key, 0) > seq:
            return True
        ranges = self._ranges  # tested first: a generator per call costs more than the check
        return bool(ranges) and any(s > seq and start <= key < end for start, end, s in ranges)

    def range_written_after(self, start: bytes, end: bytes | None, seq: int) -> bytes | None:
        """A key in ``[start, end)`` written after ``seq``, or None (a scan of the records)."""
        for key, written in self._last.items():
            if written > seq and key >= start and (end is None or key < end):
                return key
        for r_start, r_end, written in self._ranges:
            if written > seq and r_end > start and (end is None or r_start < end):
                return max(r_start, start)
        return None


class Transaction:
    """An optimistic transaction; see the module docstring. Use from one thread.

    ``with db.begin() as txn:`` commits when the block ends cleanly and rolls back when it
    raises. After ``commit()`` or ``rollback()`` every call raises ``InvalidArgument``.
    """

    def __init__(
        self,
        db: TxnHost,
        tracker: ConflictTracker,
        lock: threading.Lock,
        *,
        isolation: Isolation,
        start_seq: int,
        token: int,
        clock: Clock,
    ) -> None:
        self._db = db
        self._clock = clock
        self._tracker = tracker
        self._lock = lock
        self._isolation = isolation
        self._start = start_seq
        self._token = token
        self._writes: dict[bytes, bytes | None] = {}
        self._reads: set[bytes] = set()
        self._ranges: list[tuple[bytes, bytes | None]] = []
        self._state: Literal["open", "committed", "rolled back"] = "open"
        self._ended = False  # its token handed back to the tracker

    @property
    def isolation(self) -> Isolation:
        return self._isolation

    @property
    def start_seq(self) -> int:
        """The transaction's snapshot: it sees every write up to this seq, none after."""
        return self._start

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` as this transaction sees it (its own writes first).

        Raises:
            TransactionConflict: ``key`` was written by another commit after the snapshot.
        """
        key = check_key(key)
        self._check_open()
        if key in self._writes:
            value = self._writes[key]
            return default if value is None else value
        if self._isolation == "serializable":
            self._reads.add(key)
        version = self._db._version(key, self._clock)
        # The tracker too: compaction may have dropped a newer tombstone from the versions.
        if (version is not None and version[0] > self._start) or self._tracker.written_after(
            key, self._start
        ):
            raise self._conflict(f"key {key!r} was written after the transaction began")
        if version is None or version[1] is None:
            return default
        return version[1]

    def put(self, key: bytes, value: bytes) -> None:
        """Buffer ``key = value``; applied by :meth:`commit`."""
        self._check_open()
        self._writes[check_key(key)] = check_value(value)

    def delete(self, key: bytes) -> None:
        """Buffer the deletion of ``key``; applied by :meth:`commit`."""
        self._check_open()
        self._writes[check_key(key)] = None

    def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with ``start <= key < end`` as this transaction sees them (its
        writes over its snapshot), in key order or ``reverse``, at most ``limit``.

        Raises:
            TransactionConflict: a key in the range was written after the snapshot (at the
                call, or while iterating for an ingested one).
        """
        check_range(start, end)
        limit = check_limit(limit)
        self._check_open()
        view = self._db._view_for(start, end, self._clock)
        with self._lock:
            changed = self._tracker.range_written_after(start, end, self._start)
        if changed is not None:
            raise self._conflict(f"key {changed!r} in the scanned range was written after it")
        if self._isolation == "serializable":
            self._ranges.append((start, end))
        own = sorted(
            ((k, v) for k, v in self._writes.items() if k >= start and (end is None or k < end)),
            reverse=reverse,
        )
        rows = _overlay(
            self._checked_rows(view.columns(start, end, reverse), view.kinds(start, end)),
            own,
            reverse,
        )
        return rows if limit is None else islice(rows, limit)

    def _checked_rows(
        self, chunks: Iterable[tuple[list[bytes], Sequence[int], list[bytes | None]]], kinds: Kinds
    ) -> Iterator[tuple[bytes, bytes]]:
        for columns in chunks:
            if max(columns[1]) > self._start:
                raise self._conflict("a key in the scanned range was written after the snapshot")
            keys, values = live_columns(columns, kinds)
            yield from zip(keys, values, strict=True)

    def commit(self, *, await_durable: bool = True) -> None:
        """Apply the writes atomically, unless a conflict is found.

        Args:
            await_durable: Return only once the writes are in the WAL (the default). With
                False, as ``Db.write(batch, await_durable=False)``: the writes are visible at
                once and become durable, all together, at the next WAL flush (the
                ``flush_interval`` tick, a durable write, ``db.flush()`` or ``close()``); a
                crash before that loses the whole transaction, never part of it. The
                conflict check is the same either way.

        Raises:
            TransactionConflict: see the module docstring; nothing was applied.
            InvalidArgument: the transaction already ended.
        """
        self._check_open()
        try:
            if self._writes:
                self._db._apply(list(self._writes.items()), await_durable, check=self._last_check)
            self._state = "committed"
        finally:
            if self._state == "open":
                self._state = "rolled back"
            self._end()

    def rollback(self) -> None:
        """Discard the writes (idempotent on a rolled-back transaction)."""
        if self._state == "committed":
            raise InvalidArgument("the transaction was committed; it cannot be rolled back")
        if self._state == "open":
            self._state = "rolled back"
            self._end()

    def _validate(self) -> None:
        """The commit-time check, under the writer's lock (see ``Db._apply``)."""
        tracker, start = self._tracker, self._start
        if start < tracker.horizon:
            raise self._conflict(
                "too many keys were written while it ran to check it for conflicts"
            )
        for key in self._writes:
            if tracker.written_after(key, start):
                raise self._conflict(f"key {key!r} it writes was written after it began")
        if self._isolation == "serializable":
            for key in self._reads:
                if tracker.written_after(key, start):
                    raise self._conflict(f"key {key!r} it read was written after it began")
            for lo, hi in self._ranges:
                changed = tracker.range_written_after(lo, hi, start)
                if changed is not None:
                    raise self._conflict(f"key {changed!r} in a range it scanned was written")

    def _last_check(self) -> None:
        """:meth:`_validate`, then the token handed back in the same hold of the writer's
        lock: once validated, the transaction needs no more tracking (the commit's own
        writes are still recorded for the others), and a separate hold per commit costs
        threads a lock hand-off each."""
        self._validate()
        self._tracker.end(self._token)
        self._ended = True

    def _end(self) -> None:
        if not self._ended:
            with self._lock:
                self._tracker.end(self._token)
            self._ended = True

    def _conflict(self, what: str) -> TransactionConflict:
        return TransactionConflict(
            f"transaction conflict: {what}; nothing was applied, run the transaction again"
        )

    def _check_open(self) -> None:
        if self._state != "open":
            raise InvalidArgument(
                f"the transaction was {self._state}; start a new one with db.begin()"
            )
        if self._db._closed:
            raise ClosedError("the database is closed; open it again to use it")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._state != "open":
            return
        if exc is None:
            self.commit()
        else:
            self.rollback()

    def __repr__(self) -> str:
        return f"Transaction({self._isolation}, start_seq={self._start}, {self._state})"


def _overlay(
    rows: Iterator[tuple[bytes, bytes]],
    own: list[tuple[bytes, bytes | None]],
    reverse: bool,
) -> Iterator[tuple[bytes, bytes]]:
    """``rows`` with the transaction's own writes (``own``, in scan order) laid over."""
    i, n = 0, len(own)
    for key, value in rows:
        while i < n and (own[i][0] > key if reverse else own[i][0] < key):
            mine = own[i]
            if mine[1] is not None:
                yield mine[0], mine[1]
            i += 1
        if i < n and own[i][0] == key:
            mine = own[i]
            if mine[1] is not None:
                yield mine[0], mine[1]
            i += 1
            continue
        yield key, value
    for key, rest in own[i:]:
        if rest is not None:
            yield key, rest


def check_isolation(isolation: object) -> Isolation:
    if isolation not in ("snapshot", "serializable"):
        raise InvalidArgument(f'isolation must be "snapshot" or "serializable", got {isolation!r}')
    return isolation
