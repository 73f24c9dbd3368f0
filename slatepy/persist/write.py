"""Write handles: ``compare_and_append``, ``append`` and the shard's cached upper (RFC 0015
§6.2, §6.3, §9).

Every call runs the write path of ``persist/pipeline.py`` (validate, consolidate, encode,
put parts, commit); a call that fails definitely (an ``UpperMismatch``, a usage error)
deletes the parts it wrote; an indefinite one leaves them to GC (they may be referenced).
Calls of one handle are serialized (its lock), so the writer's idempotency token in the
state always names its latest call.

A :class:`Batch` is written ahead of its append (``write.batch``, ``write.builder``), can be
shipped to another process (``to_bytes`` / ``batch_from_bytes``, an ``SLPB`` envelope) and
applied with ``compare_and_append_batch`` to any ``[expected, new)`` it covers, within half of
``batch_lease`` of being written (RFC §6.4).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from slatepy.closing import Closing
from slatepy.errors import ClosedError, StoreUnavailable
from slatepy.persist import frontier, pipeline
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
from slatepy.persist.codec import Update
from slatepy.persist.commit import SLOWDOWN_BATCHES, Committer
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.append import AlreadyApplied, check_batch_covers, check_idempotency
from slatepy.persist.state.outcome import Maintenance
from slatepy.persist.state.records import Run, Runs, forward_runs, narrow_runs
from slatepy.persist.state.transitions import (
    ExpireWriter,
    HeartbeatWriter,
    expire_writer,
    heartbeat_writer,
)
from slatepy.persist.validate import check_range, check_time

__all__ = [
    "BATCH_FORMAT_VERSION",
    "BATCH_MAGIC",
    "SLOWDOWN_BATCHES",
    "Batch",
    "BatchBuilder",
    "BatchRecord",
    "WriteHandle",
]


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
        self._committer = Committer(machine, writer_id, upper, debug=debug, maintenance=maintenance)
        self._parts = self._committer.parts
        self._lock = threading.Lock()
        self._expired = False

    @property
    def upper(self) -> int | None:
        """The shard's upper as this handle last saw it (refreshed by every append,
        ``compare_and_append`` and :meth:`fetch_recent_upper`); ``None``: closed."""
        return self._committer.upper

    @property
    def closed(self) -> bool:
        """Whether the handle was closed (or expired): it is unusable."""
        return self._expired

    def fetch_recent_upper(self) -> int | None:
        """The shard's upper now (linearized: one consensus read)."""
        with self._lock:
            self._check_live()
            self._committer.upper = self._machine.fetch().upper
            return self._committer.upper

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
            pipeline.compare_and_append(self._committer, updates, expected_upper, new_upper)

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
            pipeline.append(self._committer, updates, lower, upper)

    def write_run(self, consolidated: list[Update], inline_budget: int | None) -> Run:
        """One run of consolidated updates; inline while it fits ``inline_budget`` (None:
        what the state's inline allowance has left)."""
        return self._committer.write_run(consolidated, inline_budget)

    def delete_runs(self, runs: Runs) -> None:
        """Delete the blobs of runs this handle wrote and never applied (best effort)."""
        self._parts.delete(runs)

    @staticmethod
    def check_range(lower: object, upper: object, names: tuple[str, str]) -> None:
        """``validate.check_range``: the bounds a batch builder is finished with."""
        check_range(lower, upper, names)

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
        runs, born = pipeline.batch_runs(self._committer, updates, lower, upper)
        return self.new_batch(runs, lower, upper, born)

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
            check_range(expected_upper, new_upper, ("expected upper", "new upper"))
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
                result = self._committer.commit(
                    tuple(runs),
                    expected_upper,
                    new_upper,
                    delete_on_mismatch=False,
                    check=self._committer.age_check(births),
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

    def heartbeat(self) -> None:
        """Extend this writer's lease (once registered by its first append). Called by the
        client's heartbeat thread every ``writer_lease / 4``.

        Raises:
            UsageError: the lease expired already (the next append says so too).
        """
        with self._lock:
            if self._committer.registered and not self._expired:
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
            if not self._committer.attempted:
                self._expired = True
        self.expire()

    def _check_live(self) -> None:
        if self._expired:
            raise ClosedError(f"writer {self.writer_id} of shard {self.shard_id!r} was expired")
