"""The write path's commit step (``persist/pipeline.py``): one writer's compare-and-append
of written runs through the shard's machine (RFC 0015 §6.2, §6.3, §6.4, §9).

A :class:`Committer` holds what a writer knows between its calls: the shard's upper as it
last saw it, whether it registered (its first append) and whether a state change that may
register it was tried (``close`` then expires it). A commit that fails definitely (an
``UpperMismatch``, a usage error) deletes the parts it was given unless told otherwise; an
indefinite one leaves them to GC (they may be referenced).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from slatepy.errors import WriteStalled
from slatepy.persist import frontier
from slatepy.persist.codec import Update
from slatepy.persist.errors import UpperMismatch, UsageError
from slatepy.persist.ids import new_token
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.parts import PartWriter
from slatepy.persist.state.append import (
    AlreadyAppended,
    AlreadyApplied,
    AlreadyCommitted,
    Appended,
    CompareAndAppend,
    append_case,
    check_batch_age,
    compare_and_append,
    heartbeat_upper,
)
from slatepy.persist.state.outcome import Maintenance
from slatepy.persist.state.records import HollowPart, Run, Runs, State, narrow_runs

APPEND_ATTEMPTS = 64
"""Rounds ``append`` retries after an ``UpperMismatch`` (each a concurrent writer's commit)."""

SLOWDOWN_BATCHES = 64
"""Batches in the trace beyond which an append waits a little for this client's merges."""

SLOWDOWN_WAIT = 0.01
"""Seconds an append waits at most for the trace to shrink back to ``SLOWDOWN_BATCHES``."""


def _mark_uncertain(args: CompareAndAppend) -> CompareAndAppend:
    return dataclasses.replace(args, uncertain=True)


class Committer:
    """Commits one writer's runs to its shard; the caller serializes the calls (the
    handle's lock), so the writer's idempotency token in the state names its latest one."""

    def __init__(
        self,
        machine: ShardMachine,
        writer_id: str,
        upper: int | None,
        *,
        debug: str = "",
        maintenance: Callable[[Maintenance], None] | None = None,
    ) -> None:
        self.machine = machine
        self.writer_id = writer_id
        self.parts = PartWriter(machine.blob, machine.shard_id, writer_id, machine.settings)
        self.upper = upper
        """The shard's upper as this writer last saw it (``None``: closed)."""
        self.registered = False
        self.attempted = False
        """Whether a state change that may register this writer was tried (close expires)."""
        self._debug = debug
        self._maintenance = maintenance

    def write_run(self, consolidated: list[Update], inline_budget: int | None) -> Run:
        """One run of consolidated updates (the encode and put-parts steps,
        ``PartWriter.write_run``); inline while it fits ``inline_budget`` (None: what the
        state's inline allowance has left)."""
        if inline_budget is None:
            used = self.machine.state.inline_bytes()
            inline_budget = max(0, self.machine.settings.inline_state_max_bytes - used)
        return self.parts.write_run(consolidated, inline_budget=inline_budget)

    def heartbeat_upper(self, upper: int) -> None:
        """The seed's writer heartbeat: extend the lease iff the shard's upper is ``upper``."""
        args = CompareAndAppend(
            writer_id=self.writer_id,
            token=new_token(),
            expected=upper,
            new=upper,
            runs=(),
            registered=self.registered,
        )
        self.attempted = True
        try:
            self.machine.run(heartbeat_upper, args, on_uncertain=rerun_as_is)
        except UpperMismatch as exc:
            self.upper = exc.current
            raise
        self.upper = frontier.join(self.upper, upper)

    def young(self, runs: Runs, births: list[int]) -> Callable[[int], None] | None:
        """The check, before each CAS, that blobs written at ``births`` are young enough
        to be referenced (RFC §6.4; issue 27 defect 2): None when ``runs`` has no blob."""
        if not any(isinstance(part, HollowPart) for run in runs for part in run):
            return None
        return self.age_check(births)

    def age_check(self, births: list[int]) -> Callable[[int], None]:
        """The check, before each CAS, that batches born at ``births`` are young enough."""
        settings = self.machine.settings

        def young_enough(now_ms: int) -> None:
            for written_ms in births:
                check_batch_age(written_ms, now_ms, settings)

        return young_enough

    def append_runs(
        self, runs: Runs, lower: int, upper: int | None, check: Callable[[int], None] | None
    ) -> None:
        """``append``'s commit: decide on the shard's upper (refreshed once when the
        cached one says a gap), narrow the runs to what is not written yet, retry after
        each concurrent commit (up to :data:`APPEND_ATTEMPTS`)."""
        refreshed = False
        for _ in range(APPEND_ATTEMPTS):
            try:
                case = append_case(self.upper, lower, upper)
            except UpperMismatch:
                if refreshed:
                    raise
                # Our cached upper may be stale: decide on the shard's upper, once.
                self.upper, refreshed = self.machine.fetch().upper, True
                continue
            if isinstance(case, AlreadyAppended):
                self.parts.delete(runs)
                return
            narrowed = narrow_runs(runs, case.expected, upper) if case.narrowed else runs
            try:
                self.commit(narrowed, case.expected, upper, delete_on_mismatch=False, check=check)
                return
            except UpperMismatch:
                refreshed = True
                continue
        raise UpperMismatch(lower, self.upper)

    def commit(
        self,
        runs: Runs,
        expected: int,
        new: int | None,
        *,
        delete_on_mismatch: bool = True,
        check: Callable[[int], None] | None = None,
        idempotency: tuple[str, int] | None = None,
        digest: bytes = b"",
        written: bool = False,
    ) -> Appended | AlreadyCommitted | AlreadyApplied:
        """Compare-and-append ``runs`` for ``[expected, new)``; the writer's upper follows."""
        args = CompareAndAppend(
            writer_id=self.writer_id,
            token=new_token(),
            expected=expected,
            new=new,
            runs=runs,
            registered=self.registered,
            debug=self._debug,
            idempotency=idempotency,
            digest=digest,
            written=written,
        )
        self.attempted = True
        try:
            result = self._run_unstalled(args, check)
        except UpperMismatch as exc:
            self.upper = exc.current
            if delete_on_mismatch:
                self.parts.delete(runs)
            raise
        except UsageError:
            if delete_on_mismatch:
                self.parts.delete(runs)
            raise
        if not isinstance(result, AlreadyApplied):
            self.registered = True
        # Appended answers the new upper; AlreadyCommitted the one its landed attempt set;
        # AlreadyApplied the one the recorded key's append set (the shard's may be beyond
        # it by now). Uppers only grow.
        self.upper = frontier.join(self.upper, result.upper)
        return result

    def _slow_down(self) -> None:
        """While this client's compaction is behind (more than :data:`SLOWDOWN_BATCHES` in
        the trace), give it up to :data:`SLOWDOWN_WAIT` after each append to catch up.
        Python runs one thread at a time: a writer appending in a loop would otherwise
        starve the merges it claimed, and every append costs more as the trace grows
        (measured: 2,000 appends in a loop, 37 merges applied). RocksDB slows writes
        down the same way before it stops them (here: ``max_trace_batches``)."""
        if self._maintenance is None or len(self.machine.state.trace) <= SLOWDOWN_BATCHES:
            return
        self.machine.wait_cached(lambda state: len(state.trace) <= SLOWDOWN_BATCHES, SLOWDOWN_WAIT)

    def _run_unstalled(
        self, args: CompareAndAppend, check: Callable[[int], None] | None
    ) -> Appended | AlreadyCommitted | AlreadyApplied:
        """Run the append; while the trace is full (``WriteStalled``: compaction is behind)
        wait for the state to change and rerun, up to ``write_stall_timeout``
        (``settings.stall_timeout``)."""
        deadline = time.monotonic() + self.machine.settings.stall_timeout
        while True:
            try:
                result = self.machine.run(
                    compare_and_append,
                    args,
                    on_uncertain=_mark_uncertain,
                    check=check,
                    maintenance=self._maintenance,
                )
                self._slow_down()
                return result
            except WriteStalled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                seen = self.machine.state.seqno

                def changed(state: State, seen: int = seen) -> bool:
                    return state.seqno > seen

                self.machine.wait_until(changed, remaining)
