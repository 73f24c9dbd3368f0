"""Write handles: ``compare_and_append``, ``append`` and the shard's cached upper (RFC 0015
§6.2, §6.3, §9).

Every call validates its arguments before anything is written (``InvalidBounds`` first, then
each update), writes the batch's parts, then commits through the shard's machine. A call
that fails definitely (an ``UpperMismatch``, a usage error) deletes the parts it wrote; an
indefinite one leaves them to GC (they may be referenced). Calls of one handle are
serialized, so the writer's idempotency token in the state always names its latest call.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

from slatepy.errors import ClosedError
from slatepy.persist import frontier
from slatepy.persist.codec import Update, check_bounds, check_updates, consolidate
from slatepy.persist.errors import UpperMismatch, UsageError
from slatepy.persist.ids import new_token
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.parts import PartWriter
from slatepy.persist.state.append import (
    AlreadyAppended,
    CompareAndAppend,
    append_case,
    compare_and_append,
)
from slatepy.persist.state.records import Runs, narrow_runs
from slatepy.persist.state.transitions import ExpireWriter, expire_writer

APPEND_ATTEMPTS = 64
"""Rounds ``append`` retries after an ``UpperMismatch`` (each a concurrent writer's commit)."""


def _mark_uncertain(args: CompareAndAppend) -> CompareAndAppend:
    return dataclasses.replace(args, uncertain=True)


class WriteHandle:
    """Appends batches to one shard. Open with ``PersistClient.open_writer``.

    Attributes:
        shard_id: The shard.
        writer_id: This handle's writer id (``w`` + 32 hex); registered with its first
            append, removed by :meth:`expire`.
    """

    def __init__(
        self, machine: ShardMachine, writer_id: str, upper: int | None, *, debug: str = ""
    ) -> None:
        self.shard_id = machine.shard_id
        self.writer_id = writer_id
        self._machine = machine
        self._debug = debug
        self._parts = PartWriter(machine.blob, machine.shard_id, writer_id, machine.settings)
        self._lock = threading.Lock()
        self._registered = False
        self._expired = False
        self._upper = upper

    @property
    def upper(self) -> int | None:
        """The shard's upper as this handle last saw it (refreshed by every append,
        ``compare_and_append`` and :meth:`fetch_recent_upper`); ``None``: closed."""
        return self._upper

    def fetch_recent_upper(self) -> int | None:
        """The shard's upper now (linearized: one consensus read)."""
        with self._lock:
            self._check_live()
            self._upper = self._machine.fetch().upper
            return self._upper

    def compare_and_append(
        self, updates: Iterable[Update], expected_upper: int, new_upper: int | None
    ) -> None:
        """Append ``updates`` (times in ``[expected_upper, new_upper)``) iff the shard's
        upper is ``expected_upper``, moving it to ``new_upper`` (``None`` closes the shard).

        Raises:
            InvalidBounds: ``new_upper`` is not beyond ``expected_upper`` (before the upper
                is looked at).
            UsageError: an update is malformed or outside the bounds; the writer expired.
            UpperMismatch: the shard's upper is not ``expected_upper`` (nothing appended;
                ``.current`` is the upper, also in :attr:`upper` now).
            StoreUnavailable / Indeterminate: storage failed; ``definite=False`` when the
                append may have landed.
        """
        with self._lock:
            self._check_live()
            check_bounds(expected_upper, new_upper, names=("expected upper", "new upper"))
            checked = check_updates(updates, expected_upper, new_upper)
            runs = self._write_runs(checked)
            self._commit(runs, expected_upper, new_upper)

    def append(self, updates: Iterable[Update], lower: int, upper: int | None) -> None:
        """Append ``updates`` for ``[lower, upper)``, safe to retry and to race with
        replicas writing the same data (RFC §6.3): with the shard's upper ``u``, ``u ==
        lower`` appends; ``lower < u < upper`` appends ``[u, upper)``, dropping the updates
        before ``u`` (written already); ``u >= upper`` does nothing.

        Raises:
            InvalidBounds: ``lower`` is not before ``upper``.
            UsageError: malformed updates, or the shard is closed.
            UpperMismatch: the shard's upper is below ``lower`` (a gap would open).
        """
        with self._lock:
            self._check_live()
            check_bounds(lower, upper, names=("lower", "upper"))
            checked = check_updates(updates, lower, upper)
            runs = self._write_runs(checked)
            try:
                self._append_runs(runs, lower, upper)
            except (UsageError, UpperMismatch):
                self._parts.delete(runs)
                raise

    def _append_runs(self, runs: Runs, lower: int, upper: int | None) -> None:
        refreshed = False
        for _ in range(APPEND_ATTEMPTS):
            try:
                case = append_case(self._upper, lower, upper)
            except UpperMismatch:
                if refreshed:
                    raise
                # Our cached upper may be stale: decide on the shard's upper, once.
                self._upper, refreshed = self._machine.fetch().upper, True
                continue
            if isinstance(case, AlreadyAppended):
                self._parts.delete(runs)
                return
            narrowed = narrow_runs(runs, case.expected, upper) if case.narrowed else runs
            try:
                self._commit(narrowed, case.expected, upper, delete_on_mismatch=False)
                return
            except UpperMismatch:
                refreshed = True
                continue
        raise UpperMismatch(lower, self._upper)

    def _write_runs(self, updates: list[Update]) -> Runs:
        consolidated = consolidate(updates)
        if not consolidated:
            return ()
        state = self._machine.state
        budget = max(0, self._machine.settings.inline_state_max_bytes - state.inline_bytes())
        return (self._parts.write_run(consolidated, inline_budget=budget),)

    def _commit(
        self,
        runs: Runs,
        expected: int,
        new: int | None,
        *,
        delete_on_mismatch: bool = True,
    ) -> None:
        args = CompareAndAppend(
            writer_id=self.writer_id,
            token=new_token(),
            expected=expected,
            new=new,
            runs=runs,
            registered=self._registered,
            debug=self._debug,
        )
        try:
            result = self._machine.run(compare_and_append, args, on_uncertain=_mark_uncertain)
        except UpperMismatch as exc:
            self._upper = exc.current
            if delete_on_mismatch:
                self._parts.delete(runs)
            raise
        except UsageError:
            if delete_on_mismatch:
                self._parts.delete(runs)
            raise
        self._registered = True
        # Appended answers the new upper; AlreadyCommitted the one its landed attempt set
        # (the shard's may be beyond it by now). Uppers only grow.
        self._upper = frontier.join(self._upper, result.upper)

    def expire(self) -> None:
        """Remove this writer from the shard (one state change); the handle is unusable
        afterwards. Idempotent."""
        with self._lock:
            if self._expired:
                return
            self._expired = True
            self._machine.run(expire_writer, ExpireWriter(self.writer_id), on_uncertain=rerun_as_is)

    def _check_live(self) -> None:
        if self._expired:
            raise ClosedError(f"writer {self.writer_id} of shard {self.shard_id!r} was expired")
