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
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import msgspec

from slatepy.errors import ClosedError, CorruptionError, WriteStalled
from slatepy.format.envelope import seal, unseal
from slatepy.persist import frontier
from slatepy.persist.codec import (
    Update,
    check_bounds,
    check_frontier,
    check_time,
    check_updates,
    consolidate,
)
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
from slatepy.persist.state.transitions import (
    ExpireWriter,
    HeartbeatWriter,
    expire_writer,
    heartbeat_writer,
)

BATCH_MAGIC = b"SLPB"
BATCH_FORMAT_VERSION = 1

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


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a shipped batch carries: its shard, writer, bounds, parts and birth time."""

    shard_id: str
    writer_id: str
    lower: int
    upper: int | None
    runs: Runs
    written_ms: int


def _check_record(record: BatchRecord) -> None:
    """Check what the state would otherwise take on trust from shipped bytes.

    Raises:
        CorruptionError: bounds out of order, an empty run or part, a part window outside
            the batch, or a part key outside the shard's part directory.
    """
    problem = None
    if not frontier.lt(record.lower, record.upper):
        problem = f"bounds [{record.lower}, {record.upper})"
    for run in record.runs:
        if not run:
            problem = "an empty run"
        for part in run:
            window = part.window
            if part.updates < 1:
                problem = "a part without updates"
            elif window is not None and (
                window.lower < record.lower or not frontier.le(window.upper, record.upper)
            ):
                problem = f"a part window [{window.lower}, {window.upper}) outside the batch"
            elif isinstance(part, HollowPart) and not _PART_KEY.fullmatch(part.key):
                problem = f"a part key {part.key!r}"
    if problem is not None:
        raise CorruptionError(f"persist batch: {problem}")


_PART_KEY = re.compile(r"part/[A-Za-z0-9._-]+/c?[0-9a-f]{32}\.sst")
_batch_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(BatchRecord)


class Batch:
    """Updates for ``[lower, upper)`` written to blob (or held inline), not yet applied.
    Apply it with ``WriteHandle.compare_and_append_batch``; it stays usable after an
    ``UpperMismatch``, and may be applied again for another range it covers.

    Attributes:
        record: The batch's shard, bounds, parts and the time it was written.
    """

    def __init__(self, record: BatchRecord, parts: PartWriter) -> None:
        self.record = record
        self._parts = parts

    @property
    def shard_id(self) -> str:
        return self.record.shard_id

    @property
    def lower(self) -> int:
        return self.record.lower

    @property
    def upper(self) -> int | None:
        return self.record.upper

    def to_bytes(self) -> bytes:
        """The batch as bytes for another process (``WriteHandle.batch_from_bytes``)."""
        payload = _batch_encoder.encode(self.record)
        return seal(BATCH_MAGIC, BATCH_FORMAT_VERSION, payload)

    def delete(self) -> None:
        """Delete the batch's blobs now: only for a batch that was never applied (best
        effort; GC deletes unreferenced parts after ``batch_lease`` anyway)."""
        self._parts.delete(self.record.runs)


class BatchBuilder:
    """Builds a batch from updates added one at a time, in bounded memory: a full buffer
    (``builder_buffer_bytes``) is sorted, consolidated and written as one run of parts.
    Open with ``WriteHandle.builder(lower)``."""

    def __init__(self, handle: WriteHandle, lower: int) -> None:
        self.lower = lower
        self._handle = handle
        self._buffer: list[Update] = []
        self._bytes = 0
        self._runs: list[Run] = []
        self._max_time: int | None = None
        self._finished = False

    def add(self, key: bytes, value: bytes, time: int, diff: int) -> None:
        """Add one update (``time >= lower``; ``< upper`` is checked by :meth:`finish`).

        Raises:
            UsageError: a malformed update, or the builder is finished.
        """
        self._check_open()
        (update,) = check_updates([((key, value), time, diff)], self.lower, None)
        self._buffer.append(update)
        self._bytes += len(key) + len(value) + 32
        self._max_time = time if self._max_time is None else max(self._max_time, time)
        if self._bytes >= self._handle._machine.settings.builder_buffer_bytes:
            self._flush(inline_budget=0)

    def extend(self, updates: Iterable[Update]) -> None:
        """Add many updates at once (checked as a column, as ``compare_and_append`` does:
        much cheaper per update than :meth:`add`); after the call, a buffer at
        ``builder_buffer_bytes`` or more is written as a run (so memory is bounded by that
        plus one call's updates: feed it in chunks).

        Raises:
            UsageError: a malformed update (nothing of the call is added), or the builder is
                finished.
        """
        self._check_open()
        checked = check_updates(updates, self.lower, None)
        if not checked:
            return
        self._buffer.extend(checked)
        self._bytes += sum(len(k) + len(v) + 32 for (k, v), _, _ in checked)
        top = max(update[1] for update in checked)
        self._max_time = top if self._max_time is None else max(self._max_time, top)
        if self._bytes >= self._handle._machine.settings.builder_buffer_bytes:
            self._flush(inline_budget=0)

    @property
    def max_time(self) -> int | None:
        """The largest time added so far (None: nothing added)."""
        return self._max_time

    def finish(self, upper: int | None) -> Batch:
        """The batch of every added update for ``[lower, upper)``.

        Raises:
            InvalidBounds: ``upper`` is not beyond ``lower``.
            UsageError: an added time is not before ``upper`` (the parts written so far
                are deleted), or the builder is finished.
        """
        self._check_open()
        self._finished = True
        try:
            _check_range(self.lower, upper, ("lower", "upper"))
            if self._max_time is not None and not frontier.lt(self._max_time, upper):
                raise UsageError(f"an added update has time {self._max_time}, not before {upper}")
        except UsageError:
            self._handle._parts.delete(tuple(self._runs))
            raise
        self._flush(inline_budget=None if not self._runs else 0)
        return self._handle._new_batch(tuple(self._runs), self.lower, upper)

    def _flush(self, *, inline_budget: int | None) -> None:
        consolidated = consolidate(self._buffer)
        self._buffer, self._bytes = [], 0
        if consolidated:
            self._runs.append(self._handle._write_run(consolidated, inline_budget))

    def _check_open(self) -> None:
        if self._finished:
            raise UsageError("this batch builder is finished; open a new one")


class WriteHandle:
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
            _check_range(expected_upper, new_upper, ("expected upper", "new upper"))
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
            _check_range(lower, upper, ("lower", "upper"))
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
        return (self._write_run(consolidated, None),) if consolidated else ()

    def _write_run(self, consolidated: list[Update], inline_budget: int | None) -> Run:
        """One run of consolidated updates; inline while it fits ``inline_budget`` (None:
        what the state's inline allowance has left)."""
        if inline_budget is None:
            used = self._machine.state.inline_bytes()
            inline_budget = max(0, self._machine.settings.inline_state_max_bytes - used)
        return self._parts.write_run(consolidated, inline_budget=inline_budget)

    def _new_batch(self, runs: Runs, lower: int, upper: int | None) -> Batch:
        record = BatchRecord(
            shard_id=self.shard_id,
            writer_id=self.writer_id,
            lower=lower,
            upper=upper,
            runs=runs,
            written_ms=self._machine.now_ms(),
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
        runs = self._write_runs(check_updates(updates, lower, upper))
        return self._new_batch(runs, lower, upper)

    def builder(self, lower: int) -> BatchBuilder:
        """A builder of a batch starting at ``lower``, fed one update at a time.

        Raises:
            UsageError: ``lower`` is not a u64 time.
        """
        self._check_live()
        return BatchBuilder(self, check_time(lower, "lower"))

    def batch_from_bytes(self, data: bytes) -> Batch:
        """A batch shipped by :meth:`Batch.to_bytes` (from any process).

        Raises:
            CorruptionError: the bytes are not a batch.
            UsageError: the batch belongs to another shard.
        """
        if not isinstance(data, bytes | bytearray | memoryview):  # bytes(7) is 7 zero bytes
            raise UsageError(f"batch_from_bytes needs bytes, not {type(data).__name__}")
        try:
            _, payload = unseal(bytes(data), BATCH_MAGIC, (BATCH_FORMAT_VERSION,), "persist batch")
            record = _batch_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise CorruptionError(f"persist batch: cannot decode: {exc}") from exc
        if record.shard_id != self.shard_id:
            raise UsageError(
                f"a batch of shard {record.shard_id!r} cannot be applied to {self.shard_id!r}"
            )
        _check_record(record)
        return Batch(record, self._parts)

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
        an ``UpperMismatch``.

        Args:
            idempotency: ``(key, id)`` recorded in the same state change as the append
                (RFC 0015 Addendum E). If the shard already records ``key`` at ``id`` or
                beyond, nothing is appended, whatever the uppers, and the call returns
                False (the caller deletes its batches). Ids of one key must grow with
                each logical append (a Spark micro-batch id, a sequence number).
            forward: Apply the batches above the times they were written at: each batch
                needs only ``new_upper <= batch.upper``, and its updates before
                ``expected_upper`` read as ``expected_upper`` (a part's ``forward``, no
                rewrite). For a sink that mints its range at commit time.

        Returns:
            True when appended (or an earlier attempt of this call landed), False when the
            idempotency key said the append was applied already.

        Raises:
            InvalidBounds: ``new_upper`` is not beyond ``expected_upper`` (checked first).
            UsageError: a batch of another shard, one that does not cover the range, the
                same batch twice, or one older than half of ``batch_lease``; a malformed
                ``idempotency``.
            UpperMismatch: the shard's upper is not ``expected_upper``.
        """
        with self._lock:
            self._check_live()
            _check_range(expected_upper, new_upper, ("expected upper", "new upper"))
            key = check_idempotency(idempotency)
            if len({id(batch) for batch in batches}) != len(batches):
                raise UsageError("compare_and_append_batch: the same batch was passed twice")
            runs: list[Run] = []
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
                    runs.extend(forward_runs(record.runs, expected_upper, new_upper))
                    continue
                narrow = check_batch_covers(record.lower, record.upper, expected_upper, new_upper)
                runs.extend(
                    narrow_runs(record.runs, expected_upper, new_upper) if narrow else record.runs
                )
            settings = self._machine.settings
            births = [batch.record.written_ms for batch in batches]

            def young_enough(now_ms: int) -> None:
                for written_ms in births:
                    check_batch_age(written_ms, now_ms, settings)

            result = self._commit(
                tuple(runs),
                expected_upper,
                new_upper,
                delete_on_mismatch=False,
                check=young_enough,
                idempotency=key,
            )
            return not isinstance(result, AlreadyApplied)

    def _commit(
        self,
        runs: Runs,
        expected: int,
        new: int | None,
        *,
        delete_on_mismatch: bool = True,
        check: Callable[[int], None] | None = None,
        idempotency: tuple[str, int] | None = None,
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
        )
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
        wait for the state to change and rerun, up to ``write_stall_timeout``."""
        deadline = time.monotonic() + self._machine.settings.write_stall_timeout
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

    def _check_live(self) -> None:
        if self._expired:
            raise ClosedError(f"writer {self.writer_id} of shard {self.shard_id!r} was expired")
