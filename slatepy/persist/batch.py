"""Written batches (RFC 0015 §6.4): the record a batch carries, its shipping envelope and
the checks a shipped one must pass, and :class:`Batch` / :class:`BatchBuilder`.

A batch is dated by its **oldest part**: ``written_ms`` is read before the first part is
put, so its age, which decides whether it may still be applied (``batch_lease / 2``), is
never less than that of any of its blobs (GC deletes unreferenced ones older than
``batch_lease``). Shipped bytes (``batch_from_bytes``) are trusted for nothing: every
bound, part, window, forward and inline update is checked before the batch can reach a
state (issue 27, defect 7).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol

import msgspec

from slatepy.errors import CorruptionError
from slatepy.format.block import decode_block
from slatepy.format.envelope import seal, unseal
from slatepy.persist import frontier
from slatepy.persist.codec import U64_MAX, Update, decode_entries
from slatepy.persist.consolidation import consolidate
from slatepy.persist.errors import UsageError
from slatepy.persist.parts import KEY_LOWER_BYTES, PartWriter
from slatepy.persist.state.append import check_batch_age
from slatepy.persist.state.records import HollowPart, InlinePart, Part, Run, Runs, Window
from slatepy.persist.validate import check_range, check_updates

if TYPE_CHECKING:
    from slatepy.persist.config import PersistSettings

log = logging.getLogger(__name__)

BATCH_MAGIC = b"SLPB"
BATCH_FORMAT_VERSION = 1

_PART_KEY = re.compile(r"part/[A-Za-z0-9._-]+/c?[0-9a-f]{32}\.sst")
_WRITER_ID = re.compile(r"w[0-9a-f]{32}")


class BatchRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a shipped batch carries: its shard, writer, bounds, parts and birth time (the
    clock of its writer just before its first part was put)."""

    shard_id: str
    writer_id: str
    lower: int
    upper: int | None
    runs: Runs
    written_ms: int


_batch_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(BatchRecord)


def record_digest(record: BatchRecord) -> bytes:
    """16 bytes naming a batch as written (before any window a receiver adds)."""
    return hashlib.blake2b(_batch_encoder.encode(record), digest_size=16).digest()


def batches_digest(digests: Iterable[bytes]) -> bytes:
    """16 bytes naming a set of batches (order aside) by their :func:`record_digest`:
    recorded with an idempotency key, so a replay of the same batches is recognised as the
    append that recorded it (issue 27 defect 3)."""
    return hashlib.blake2b(b"".join(sorted(digests)), digest_size=16).digest()


def decode_batch(data: bytes, max_inline_bytes: int) -> BatchRecord:
    """The record of shipped batch bytes, every claim checked (see :func:`check_record`).

    Raises:
        CorruptionError: not a batch, or a claim that does not hold (named).
    """
    try:
        _, payload = unseal(data, BATCH_MAGIC, (BATCH_FORMAT_VERSION,), "persist batch")
        record = _batch_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"persist batch: cannot decode: {exc}") from exc
    check_record(record, max_inline_bytes)
    return record


def check_record(record: BatchRecord, max_inline_bytes: int) -> None:
    """Check everything a shipped batch claims, so that nothing it says can break a state.

    Bounds are u64 and in order, ``written_ms`` is a u64, the writer id is one; each run
    has parts; each part has updates, no ``forward`` (a written batch is forwarded only
    when applied), a window (if any) inside the batch; a hollow part's key is a part key of
    the shard (each once), its times ``t_min <= t_max`` inside the batch; an inline part
    (at most ``max_inline_bytes``) decodes to exactly its count of sorted, consolidated
    updates at times inside the batch's bounds (and window).

    Raises:
        CorruptionError: naming the batch (shard, writer) and the first claim that fails.
    """
    problem = _record_problem(record, max_inline_bytes)
    if problem is not None:
        raise CorruptionError(
            f"persist batch of shard {record.shard_id!r} by writer {record.writer_id!r}: {problem}"
        )


def _u64(value: int) -> bool:
    return 0 <= value <= U64_MAX


def _record_problem(record: BatchRecord, max_inline_bytes: int) -> str | None:
    lower, upper = record.lower, record.upper
    if not _u64(lower) or (upper is not None and not _u64(upper)) or not frontier.lt(lower, upper):
        return f"bounds [{lower}, {upper})"
    if not _u64(record.written_ms):
        return f"written_ms {record.written_ms}"
    if not _WRITER_ID.fullmatch(record.writer_id):
        return "a malformed writer id"
    keys: set[str] = set()
    for index, run in enumerate(record.runs):
        if not run:
            return f"run {index} is empty"
        for part in run:
            problem = _part_problem(part, lower, upper, max_inline_bytes)
            if problem is None and isinstance(part, HollowPart):
                if part.key in keys:
                    problem = "it is named twice"
                keys.add(part.key)
            if problem is not None:
                return f"a part of run {index} ({_name(part)}): {problem}"
    return None


def _name(part: Part) -> str:
    return part.key if isinstance(part, HollowPart) else f"inline, {len(part.data)} bytes"


def _part_problem(part: Part, lower: int, upper: int | None, max_inline: int) -> str | None:
    window = part.window
    if not 1 <= part.updates <= U64_MAX:
        return f"{part.updates} updates"
    if part.forward:
        return f"forward {part.forward} (a written batch is forwarded only when applied)"
    if window is not None and not (
        _u64(window.lower)
        and lower <= window.lower
        and frontier.lt(window.lower, window.upper)
        and frontier.le(window.upper, upper)
    ):
        return f"window [{window.lower}, {window.upper}) outside the batch [{lower}, {upper})"
    lo, hi = (lower, upper) if window is None else (window.lower, window.upper)
    if isinstance(part, HollowPart):
        if not _PART_KEY.fullmatch(part.key):
            return "not a part key"
        if part.size < 1 or len(part.key_lower) > KEY_LOWER_BYTES:
            return f"size {part.size} or a key bound of {len(part.key_lower)} bytes"
        if not (_u64(part.t_min) and part.t_min <= part.t_max and frontier.lt(part.t_max, upper)):
            return f"times [{part.t_min}, {part.t_max}] outside the batch [{lower}, {upper})"
        if part.t_min < lower:
            return f"times [{part.t_min}, {part.t_max}] outside the batch [{lower}, {upper})"
        return None
    return _inline_problem(part, lo, hi, max_inline)


def _inline_problem(part: InlinePart, lo: int, hi: int | None, max_inline: int) -> str | None:
    if len(part.data) > max_inline:
        return f"larger than {max_inline} bytes"
    try:
        entries = decode_block(part.data).entries()
        updates = decode_entries(entries)
    except CorruptionError as exc:
        return f"does not decode ({exc})"
    if len(updates) != part.updates:
        return f"holds {len(updates)} updates, claims {part.updates}"
    keys = [entry[0] for entry in entries]
    if any(a >= b for a, b in pairwise(keys)):
        return "its updates are not sorted and consolidated"
    for _, time, diff in updates:
        if diff == 0 or not frontier.contains(lo, hi, time):
            return f"an update at time {time} (diff {diff}) outside [{lo}, {hi})"
    return None


def clamp_hollow(record: BatchRecord) -> BatchRecord:
    """``record`` with every hollow part without a window given the batch's bounds: the
    times inside a shipped part's blob are not read here, and a window keeps any that lie
    outside what the batch claims out of every read."""
    bounds = Window(record.lower, record.upper)
    runs = tuple(
        tuple(
            msgspec.structs.replace(part, window=bounds)
            if isinstance(part, HollowPart) and part.window is None
            else part
            for part in run
        )
        for run in record.runs
    )
    return msgspec.structs.replace(record, runs=runs)


class Batch:
    """Updates for ``[lower, upper)`` written to blob (or held inline), not yet applied.
    Apply it with ``WriteHandle.compare_and_append_batch``; it stays usable after an
    ``UpperMismatch``, and may be applied again for another range it covers — never for
    written times it was applied for already (a forwarded application takes every written
    time below its new upper).

    Attributes:
        record: The batch's shard, bounds, parts and the time it was written.
    """

    def __init__(self, record: BatchRecord, parts: PartWriter, *, digest: bytes = b"") -> None:
        self.record = record
        self.digest = digest or record_digest(record)
        """Names the batch as written (a shipped copy has the same): see
        :func:`batches_digest`."""
        self._parts = parts
        self.applied: list[tuple[int, int | None]] = []
        """Written-time windows of this batch's landed applications (in this process)."""
        self.uncertain: list[tuple[int, int | None, tuple[str, int] | None]] = []
        """Windows (and idempotency keys) of applications that failed indefinitely."""

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
        return seal(BATCH_MAGIC, BATCH_FORMAT_VERSION, _batch_encoder.encode(self.record))

    def delete(self) -> None:
        """Delete the batch's blobs now: only for a batch that was never applied (best
        effort; GC deletes unreferenced parts after ``batch_lease`` anyway).

        Raises:
            UsageError: this batch was applied, or an application of it failed
                indefinitely (it may be referenced): GC alone may delete its parts.
        """
        if self.applied or self.uncertain:
            raise UsageError(
                "this batch was applied (or its application failed indefinitely and may have "
                "landed): its parts may be referenced; GC deletes them when they are not"
            )
        self._parts.delete(self.record.runs)


class BuilderHost(Protocol):
    """What a :class:`BatchBuilder` uses of the ``WriteHandle`` that made it, passed in: this
    module stays below ``slatepy.persist.write`` (which imports it) without an import circle."""

    @property
    def settings(self) -> PersistSettings: ...

    def now_ms(self) -> int: ...

    def delete_runs(self, runs: Runs) -> None: ...

    def new_batch(self, runs: Runs, lower: int, upper: int | None, born: int | None) -> Batch: ...

    def write_run(self, consolidated: list[Update], inline_budget: int | None) -> Run: ...


class BatchBuilder:
    """Builds a batch from updates added one at a time, in bounded memory: a full buffer
    (``builder_buffer_bytes``) is sorted, consolidated and written as one run of parts.
    The batch is dated when its first part is written. Open with
    ``WriteHandle.builder(lower)``."""

    def __init__(self, handle: BuilderHost, lower: int) -> None:
        self.lower = lower
        self._handle = handle
        self._buffer: list[Update] = []
        self._bytes = 0
        self._runs: list[Run] = []
        self._max_time: int | None = None
        self._born: int | None = None
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
        if self._bytes >= self._handle.settings.builder_buffer_bytes:
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
        if self._bytes >= self._handle.settings.builder_buffer_bytes:
            self._flush(inline_budget=0)

    @property
    def max_time(self) -> int | None:
        """The largest time added so far (None: nothing added)."""
        return self._max_time

    def finish(self, upper: int | None) -> Batch:
        """The batch of every added update for ``[lower, upper)``, dated by its first part.

        Raises:
            InvalidBounds: ``upper`` is not beyond ``lower``.
            UsageError: an added time is not before ``upper``, or the first part was
                written more than half of ``batch_lease`` ago (GC may take it before the
                batch is applied); the parts written so far are deleted. Or the builder is
                finished.
        """
        self._check_open()
        self._finished = True
        try:
            check_range(self.lower, upper, ("lower", "upper"))
            if self._max_time is not None and not frontier.lt(self._max_time, upper):
                raise UsageError(f"an added update has time {self._max_time}, not before {upper}")
            if self._born is not None:
                check_batch_age(self._born, self._handle.now_ms(), self._handle.settings)
        except UsageError:
            self._handle.delete_runs(tuple(self._runs))
            raise
        self._flush(inline_budget=None if not self._runs else 0)
        return self._handle.new_batch(tuple(self._runs), self.lower, upper, self._born)

    def _flush(self, *, inline_budget: int | None) -> None:
        consolidated = consolidate(self._buffer)
        self._buffer, self._bytes = [], 0
        if consolidated:
            if self._born is None:
                self._born = self._handle.now_ms()
            self._runs.append(self._handle.write_run(consolidated, inline_budget))

    def _check_open(self) -> None:
        if self._finished:
            raise UsageError("this batch builder is finished; open a new one")


def overlaps(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    """Whether two windows of times ``[lower, upper)`` share a time."""
    return frontier.lt(max(a[0], b[0]), frontier.meet((a[1], b[1])))


def check_reapply(
    batches: Sequence[Batch], window: dict[int, tuple[int, int | None]], key: tuple[str, int] | None
) -> None:
    """Refuse to apply a batch for written times it was applied for already (in this
    process; the state refuses parts it still references for overlapping times). A window
    of an application that failed indefinitely may be applied again only with the same
    idempotency key, which then decides.

    Raises:
        UsageError: naming the batch and the times applied twice.
    """
    for batch in batches:
        mine = window[id(batch)]
        for earlier in batch.applied:
            if overlaps(mine, earlier):
                raise _twice(batch, mine, earlier)
        for lo, hi, earlier_key in batch.uncertain:
            if overlaps(mine, (lo, hi)) and (key is None or key != earlier_key):
                raise _twice(batch, mine, (lo, hi))


def _twice(
    batch: Batch, mine: tuple[int, int | None], earlier: tuple[int, int | None]
) -> UsageError:
    return UsageError(
        f"a batch of [{batch.lower}, {batch.upper}) cannot be applied for its written times "
        f"[{mine[0]}, {mine[1]}): it was applied (or may have been) for [{earlier[0]}, "
        f"{earlier[1]}) already, and its updates would count twice"
    )
