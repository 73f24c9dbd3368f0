"""Write handles: ``compare_and_append``, ``append`` and the shard's cached upper (RFC 0015
§6.2, §6.3, §9).

Every call validates its arguments before anything is written (``InvalidBounds`` first, then
each update), writes the batch's parts, then commits through the shard's machine. A call
that fails definitely (an ``UpperMismatch``, a usage error) deletes the parts it wrote; an
indefinite one leaves them to GC (they may be referenced). Calls of one handle are
serialized, so the writer's idempotency token in the state always names its latest call.

A :class:`Batch` is written ahead of its append (``write.batch``, ``write.builder``), can be
shipped to another process (``to_bytes`` / ``batch_from_bytes``, an ``SLPB`` envelope) and
applied with ``compare_and_append_batch`` to any ``[expected, new)`` it covers, within half of
``batch_lease`` of being written (RFC §6.4).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from slatepy.closing import Closing
from slatepy.errors import ClosedError, StoreUnavailable, WriteStalled
from slatepy.persist import frontier
from slatepy.persist.batch import (
    BATCH_FORMAT_VERSION,
    BATCH_MAGIC,
    Batch,
    BatchBuilder,
    BatchRecord,
    batches_digest,
    check_reapply,
    clamp_hollow,
    decode_batch,
    record_digest,
)
from slatepy.persist.codec import (
    Update,
    check_bounds,
    check_frontier,
    check_time,
    check_updates,
    consolidate,
)
from slatepy.persist.config import PersistSettings
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
    check_batch_covers,
    check_idempotency,
    compare_and_append,
    heartbeat_upper,
)
from slatepy.persist.state.outcome import Maintenance
from slatepy.persist.state.records import (
    HollowPart,
    Run,
    Runs,
    State,
    forward_runs,
    narrow_runs,
)

__all__ = [
    "BATCH_FORMAT_VERSION",
    "BATCH_MAGIC",
    "Batch",
    "BatchBuilder",
    "BatchRecord",
    "WriteHandle",
]
from slatepy.persist.state.transitions import (
    ExpireWriter,
    HeartbeatWriter,
    expire_writer,
    heartbeat_writer,
)

APPEND_ATTEMPTS = 64
"""Rounds ``append`` retries after an ``UpperMismatch`` (each a concurrent writer's commit)."""


SLOWDOWN_BATCHES = 64
"""Batches in the trace beyond which an append waits a little for this client's merges."""

SLOWDOWN_WAIT = 0.01
"""Seconds an append waits at most for the trace to shrink back to ``SLOWDOWN_BATCHES``."""


def _check_range(lower: object, upper: object, names: tuple[str, str]) -> None:
    """``codec.check_bounds`` for values from a caller: u64 ints (a None upper), else
    ``UsageError``; then ``InvalidBounds`` unless ``lower < upper``. A None lower passes
    to ``check_bounds``, which calls it out of order (nothing is beyond None)."""
    checked = None if lower is None else check_time(lower, names[0])
    check_bounds(checked, check_frontier(upper, names[1]), names=names)


def _mark_uncertain(args: CompareAndAppend) -> CompareAndAppend:
    return dataclasses.replace(args, uncertain=True)


class WriteHandle(Closing):
    """Appends batches to one shard. Open with ``PersistClient.open_writer``.

    Attributes:
        shard_id: The shard.
        writer_id: This handle's writer id (``w`` + 32 hex); registered with its first
            append, removed by :meth:`expire`.
    """

    def __init__(
        self,
        machine: ShardMachine,
        writer_id: str,
        upper: int | None,
        *,
        debug: str = "",
        maintenance: Callable[[Maintenance], None] | None = None,
    ) -> None:
        self.shard_id = machine.shard_id
        self.writer_id = writer_id
        self._machine = machine
        self._debug = debug
        self._maintenance = maintenance
        self._parts = PartWriter(machine.blob, machine.shard_id, writer_id, machine.settings)
        self._lock = threading.Lock()
        self._registered = False
        self._attempted = False
        """Whether a state change that may register this writer was tried (close expires)."""
        self._expired = False
        self._upper = upper

    @property
    def upper(self) -> int | None:
        """The shard's upper as this handle last saw it (refreshed by every append,
        ``compare_and_append`` and :meth:`fetch_recent_upper`); ``None``: closed."""
        return self._upper

    @property
    def closed(self) -> bool:
        """Whether the handle was closed (or expired): it is unusable."""
        return self._expired

    def fetch_recent_upper(self) -> int | None:
        """The shard's upper now (linearized: one consensus read)."""
        with self._lock:
            self._check_live()
            self._upper = self._machine.fetch().upper
            return self._upper

    @property
    def settings(self) -> PersistSettings:
        return self._machine.settings

    def now_ms(self) -> int:
        """This client's clock, in ms (the one batch ages are judged by)."""
        return self._machine.now_ms()

    def compare_and_append(
        self, updates: Iterable[Update], expected_upper: int, new_upper: int | None
    ) -> None:
        """Append ``updates`` (times in ``[expected_upper, new_upper)``) iff the shard's
        upper is ``expected_upper``, moving it to ``new_upper`` (``None`` closes the shard).
        With no updates and ``new_upper == expected_upper`` the call is the seed's writer
        heartbeat: it extends the writer's lease iff the upper is ``expected_upper``.

        Raises:
            InvalidBounds: ``new_upper`` is not beyond ``expected_upper`` (before the upper
                is looked at), unless it is a heartbeat.
            UsageError: an update is malformed or outside the bounds; the writer expired;
                the parts written grew older than half of ``batch_lease`` before the commit
                (they are deleted; nothing was appended).
            UpperMismatch: the shard's upper is not ``expected_upper`` (nothing appended;
                ``.current`` is the upper, also in :attr:`upper` now).
            StoreUnavailable / Indeterminate: storage failed; ``definite=False`` when the
                append may have landed.
        """
        with self._lock:
            self._check_live()
            if type(expected_upper) is int and new_upper == expected_upper:
                items = list(updates)
                if not items:
                    self._heartbeat_upper(check_time(expected_upper, "expected upper"))
                    return
                updates = items
            _check_range(expected_upper, new_upper, ("expected upper", "new upper"))
            checked = check_updates(updates, expected_upper, new_upper)
            born = self.now_ms()  # before the first part is put: its age is at least this
            runs = self._write_runs(checked)
            self._commit(runs, expected_upper, new_upper, check=self._young(runs, [born]))

    def _heartbeat_upper(self, upper: int) -> None:
        args = CompareAndAppend(
            writer_id=self.writer_id,
            token=new_token(),
            expected=upper,
            new=upper,
            runs=(),
            registered=self._registered,
        )
        self._attempted = True
        try:
            self._machine.run(heartbeat_upper, args, on_uncertain=rerun_as_is)
        except UpperMismatch as exc:
            self._upper = exc.current
            raise
        self._upper = frontier.join(self._upper, upper)

    def append(self, updates: Iterable[Update], lower: int, upper: int | None) -> None:
        """Append ``updates`` for ``[lower, upper)``, safe to retry and to race with
        replicas writing the same data (RFC §6.3): with the shard's upper ``u``, ``u ==
        lower`` appends; ``lower < u < upper`` appends ``[u, upper)``, dropping the updates
        before ``u`` (written already); ``u >= upper`` does nothing.

        Raises:
            InvalidBounds: ``lower`` is not before ``upper``.
            UsageError: malformed updates, or the shard is closed; the parts grew older
                than half of ``batch_lease`` before the commit (deleted, nothing appended).
            UpperMismatch: the shard's upper is below ``lower`` (a gap would open).
        """
        with self._lock:
            self._check_live()
            _check_range(lower, upper, ("lower", "upper"))
            checked = check_updates(updates, lower, upper)
            born = self.now_ms()
            runs = self._write_runs(checked)
            try:
                self._append_runs(runs, lower, upper, self._young(runs, [born]))
            except (UsageError, UpperMismatch):
                self._parts.delete(runs)
                raise

    def _young(self, runs: Runs, births: list[int]) -> Callable[[int], None] | None:
        """The check, before each CAS, that blobs written at ``births`` are young enough
        to be referenced (RFC §6.4; issue 27 defect 2): None when ``runs`` has no blob."""
        if not any(isinstance(part, HollowPart) for run in runs for part in run):
            return None
        return self._age_check(births)

    def _age_check(self, births: list[int]) -> Callable[[int], None]:
        settings = self._machine.settings

        def young_enough(now_ms: int) -> None:
            for written_ms in births:
                check_batch_age(written_ms, now_ms, settings)

        return young_enough

    def _append_runs(
        self, runs: Runs, lower: int, upper: int | None, check: Callable[[int], None] | None
    ) -> None:
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
                self._commit(narrowed, case.expected, upper, delete_on_mismatch=False, check=check)
                return
            except UpperMismatch:
                refreshed = True
                continue
        raise UpperMismatch(lower, self._upper)

    def _write_runs(self, updates: list[Update]) -> Runs:
        consolidated = consolidate(updates)
        return (self.write_run(consolidated, None),) if consolidated else ()

    def write_run(self, consolidated: list[Update], inline_budget: int | None) -> Run:
        """One run of consolidated updates; inline while it fits ``inline_budget`` (None:
        what the state's inline allowance has left)."""
        if inline_budget is None:
            used = self._machine.state.inline_bytes()
            inline_budget = max(0, self._machine.settings.inline_state_max_bytes - used)
        return self._parts.write_run(consolidated, inline_budget=inline_budget)

    def delete_runs(self, runs: Runs) -> None:
        """Delete the blobs of runs this handle wrote and never applied (best effort)."""
        self._parts.delete(runs)

    @staticmethod
    def check_range(lower: object, upper: object, names: tuple[str, str]) -> None:
        _check_range(lower, upper, names)

    def new_batch(self, runs: Runs, lower: int, upper: int | None, born: int | None) -> Batch:
        """A batch of ``runs`` dated ``born`` (read before its first part was put; None:
        no part was put before now)."""
        record = BatchRecord(
            shard_id=self.shard_id,
            writer_id=self.writer_id,
            lower=lower,
            upper=upper,
            runs=runs,
            written_ms=self.now_ms() if born is None else born,
        )
        return Batch(record, self._parts)

    def batch(self, updates: Iterable[Update], lower: int, upper: int | None) -> Batch:
        """Write ``updates`` (times in ``[lower, upper)``) as a batch, without applying it.

        Raises:
            InvalidBounds: ``lower`` is not before ``upper``.
            UsageError: an update is malformed or outside the bounds.
        """
        self._check_live()
        _check_range(lower, upper, ("lower", "upper"))
        checked = check_updates(updates, lower, upper)
        born = self.now_ms()
        return self.new_batch(self._write_runs(checked), lower, upper, born)

    def builder(self, lower: int) -> BatchBuilder:
        """A builder of a batch starting at ``lower``, fed one update at a time.

        Raises:
            UsageError: ``lower`` is not a u64 time.
        """
        self._check_live()
        return BatchBuilder(self, check_time(lower, "lower"))

    def batch_from_bytes(self, data: bytes) -> Batch:
        """A batch shipped by :meth:`Batch.to_bytes` (from any process). Everything it
        claims is checked first (``batch.check_record``); its blob parts are read only
        within its bounds.

        Raises:
            CorruptionError: the bytes are not a batch, or a claim does not hold (named).
            UsageError: the batch belongs to another shard.
        """
        if not isinstance(data, bytes | bytearray | memoryview):  # bytes(7) is 7 zero bytes
            raise UsageError(f"batch_from_bytes needs bytes, not {type(data).__name__}")
        record = decode_batch(bytes(data), self._machine.settings.inline_state_max_bytes)
        if record.shard_id != self.shard_id:
            raise UsageError(
                f"a batch of shard {record.shard_id!r} cannot be applied to {self.shard_id!r}"
            )
        return Batch(clamp_hollow(record), self._parts, digest=record_digest(record))

    def compare_and_append_batch(
        self,
        batches: Sequence[Batch],
        expected_upper: int,
        new_upper: int | None,
        *,
        idempotency: tuple[str, int] | None = None,
        forward: bool = False,
    ) -> bool:
        """Apply written batches iff the shard's upper is ``expected_upper``, moving it to
        ``new_upper``. Each batch must cover ``[expected_upper, new_upper)``; its updates
        outside that range are dropped (a window, no rewrite). The batches stay usable after
        an ``UpperMismatch``; a batch is never applied twice for the same written times.

        Args:
            idempotency: ``(key, id)`` recorded in the same state change as the append
                (RFC 0015 Addendum E), with a digest of the batches. If the shard already
                records ``key`` at ``id`` or beyond, nothing is appended, whatever the
                uppers: the call returns True if that append was of these very batches (an
                earlier attempt of this append landed), else False (another append of the
                key landed; no state references these batches, which the caller may
                delete). Ids of one key must grow with each logical append.
            forward: Apply the batches above the times they were written at: each batch
                needs only ``new_upper <= batch.upper``, and its updates before
                ``expected_upper`` read as ``expected_upper`` (a part's ``forward``, no
                rewrite). For a sink that mints its range at commit time. A forwarded
                application takes every written time below ``new_upper``: the batch cannot
                be applied again for any of them.

        Returns:
            True when appended (or an earlier attempt of this append landed), False when
            the idempotency key said another append of it was applied already.

        Raises:
            InvalidBounds: ``new_upper`` is not beyond ``expected_upper`` (checked first).
            UsageError: a batch of another shard, one that does not cover the range, the
                same batch twice, one applied for these written times already, or one
                older than half of ``batch_lease``; a malformed ``idempotency``.
            UpperMismatch: the shard's upper is not ``expected_upper``.
        """
        with self._lock:
            self._check_live()
            _check_range(expected_upper, new_upper, ("expected upper", "new upper"))
            key = check_idempotency(idempotency)
            if len({id(batch) for batch in batches}) != len(batches):
                raise UsageError("compare_and_append_batch: the same batch was passed twice")
            runs: list[Run] = []
            windows: dict[int, tuple[int, int | None]] = {}
            for batch in batches:
                record = batch.record
                if record.shard_id != self.shard_id:
                    raise UsageError(
                        f"a batch of shard {record.shard_id!r} cannot be applied to "
                        f"{self.shard_id!r}"
                    )
                if forward:
                    if not frontier.le(new_upper, record.upper):
                        raise UsageError(
                            f"a batch of [{record.lower}, {record.upper}) cannot be applied "
                            f"forwarded up to {new_upper}: its upper must be at least that"
                        )
                    windows[id(batch)] = (record.lower, new_upper)
                    runs.extend(forward_runs(record.runs, expected_upper, new_upper))
                    continue
                narrow = check_batch_covers(record.lower, record.upper, expected_upper, new_upper)
                windows[id(batch)] = (expected_upper, new_upper)
                runs.extend(
                    narrow_runs(record.runs, expected_upper, new_upper) if narrow else record.runs
                )
            check_reapply(batches, windows, key)
            births = [batch.record.written_ms for batch in batches]
            try:
                result = self._commit(
                    tuple(runs),
                    expected_upper,
                    new_upper,
                    delete_on_mismatch=False,
                    check=self._age_check(births),
                    idempotency=key,
                    digest=b"" if key is None else batches_digest(b.digest for b in batches),
                    written=True,
                )
            except StoreUnavailable as exc:
                if not exc.definite:  # it may have landed: these windows may be applied
                    for batch in batches:
                        batch.uncertain.append((*windows[id(batch)], key))
                raise
            if isinstance(result, AlreadyApplied) and not result.ours:
                return False
            for batch in batches:
                batch.applied.append(windows[id(batch)])
            return True

    def _commit(
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
        args = CompareAndAppend(
            writer_id=self.writer_id,
            token=new_token(),
            expected=expected,
            new=new,
            runs=runs,
            registered=self._registered,
            debug=self._debug,
            idempotency=idempotency,
            digest=digest,
            written=written,
        )
        self._attempted = True
        try:
            result = self._run_unstalled(args, check)
        except UpperMismatch as exc:
            self._upper = exc.current
            if delete_on_mismatch:
                self._parts.delete(runs)
            raise
        except UsageError:
            if delete_on_mismatch:
                self._parts.delete(runs)
            raise
        if not isinstance(result, AlreadyApplied):
            self._registered = True
        # Appended answers the new upper; AlreadyCommitted the one its landed attempt set;
        # AlreadyApplied the one the recorded key's append set (the shard's may be beyond
        # it by now). Uppers only grow.
        self._upper = frontier.join(self._upper, result.upper)
        return result

    def _slow_down(self) -> None:
        """While this client's compaction is behind (more than :data:`SLOWDOWN_BATCHES` in
        the trace), give it up to :data:`SLOWDOWN_WAIT` after each append to catch up.
        Python runs one thread at a time: a writer appending in a loop would otherwise
        starve the merges it claimed, and every append costs more as the trace grows
        (measured: 2,000 appends in a loop, 37 merges applied). RocksDB slows writes
        down the same way before it stops them (here: ``max_trace_batches``)."""
        if self._maintenance is None or len(self._machine.state.trace) <= SLOWDOWN_BATCHES:
            return
        self._machine.wait_cached(lambda state: len(state.trace) <= SLOWDOWN_BATCHES, SLOWDOWN_WAIT)

    def _run_unstalled(
        self, args: CompareAndAppend, check: Callable[[int], None] | None
    ) -> Appended | AlreadyCommitted | AlreadyApplied:
        """Run the append; while the trace is full (``WriteStalled``: compaction is behind)
        wait for the state to change and rerun, up to ``write_stall_timeout``
        (``settings.stall_timeout``)."""
        deadline = time.monotonic() + self._machine.settings.stall_timeout
        while True:
            try:
                result = self._machine.run(
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
                seen = self._machine.state.seqno

                def changed(state: State, seen: int = seen) -> bool:
                    return state.seqno > seen

                self._machine.wait_until(changed, remaining)

    def heartbeat(self) -> None:
        """Extend this writer's lease (once registered by its first append). Called by the
        client's heartbeat thread every ``writer_lease / 4``.

        Raises:
            UsageError: the lease expired already (the next append says so too).
        """
        with self._lock:
            if self._registered and not self._expired:
                self._machine.run(
                    heartbeat_writer, HeartbeatWriter(self.writer_id), on_uncertain=rerun_as_is
                )

    def expire(self) -> None:
        """Remove this writer from the shard (one state change); the handle is unusable
        afterwards. Idempotent."""
        with self._lock:
            if self._expired:
                return
            # Marked only once committed: an expire that failed can be called again.
            self._machine.run(expire_writer, ExpireWriter(self.writer_id), on_uncertain=rerun_as_is)
            self._expired = True

    def close(self) -> None:
        """Release this writer: :meth:`expire` when an append may have registered it (no
        state change otherwise), so no registration is left to lapse with its lease.
        Idempotent; the handle is unusable afterwards."""
        with self._lock:
            if not self._attempted:
                self._expired = True
        self.expire()

    def _check_live(self) -> None:
        if self._expired:
            raise ClosedError(f"writer {self.writer_id} of shard {self.shard_id!r} was expired")
