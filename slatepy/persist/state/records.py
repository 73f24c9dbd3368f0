"""The records of a shard's state (RFC 0015 §4.1) and the rollup encoding (§4.3).

Every record is a frozen ``msgspec.Struct``. The many small ones are ``array_like`` (new
fields are only ever appended, with defaults, so old bytes still decode); :class:`State`
is map-keyed because it grows fields. A ``State`` is never mutated: transitions build a new
one with ``msgspec.structs.replace`` and fresh dicts, so states can be shared freely
between threads and kept as history.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.envelope import seal, unseal
from slatepy.persist import frontier
from slatepy.persist.errors import UsageError
from slatepy.persist.ids import rollup_seqno, validate_shard_id

STATE_FORMAT_VERSION = 1
"""Format of encoded states and diffs. It lives in the envelope only (``seal``), not in the
structs: ``omit_defaults`` would drop a defaulted version field, and a later default would
then misread old bytes."""
ROLLUP_MAGIC = b"SLPR"


class Desc(msgspec.Struct, frozen=True, array_like=True):
    """What a batch describes: every update at a time in ``[lower, upper)``, with times
    before ``since`` forwarded to ``since`` (0: nothing forwarded)."""

    lower: int
    upper: int | None
    since: int = 0


class Window(msgspec.Struct, frozen=True, array_like=True):
    """A part's updates outside ``[lower, upper)`` are not part of its batch (a batch applied
    for a narrower range than it was written for, RFC §6.3/§6.4)."""

    lower: int
    upper: int | None

    def contains(self, time: int) -> bool:
        return frontier.contains(self.lower, self.upper, time)


class HollowPart(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    """A part stored as an SST blob, at ``shards/{shard}/{key}``."""

    key: str
    size: int
    """Object bytes."""
    updates: int
    """Entries in the SST (before any window)."""
    key_lower: bytes
    """The first encoded key, truncated to 64 bytes (for range pruning)."""
    t_min: int
    t_max: int
    window: Window | None = None
    forward: int = 0
    """Times before it (inside the window) read as it: a batch applied above its written
    times without a rewrite (``compare_and_append_batch(..., forward=True)``, Addendum E)."""


class InlinePart(msgspec.Struct, frozen=True, array_like=True, tag="i"):
    """A small part kept in the state: one data block of update entries (``codec``)."""

    data: bytes
    updates: int
    window: Window | None = None
    forward: int = 0


Part = HollowPart | InlinePart
Run = tuple[Part, ...]
"""Parts in key order whose updates form one sorted, consolidated stream."""
Runs = tuple[Run, ...]


def runs_updates(runs: Runs) -> int:
    """Entries over every part of ``runs`` (before windows)."""
    return sum(part.updates for run in runs for part in run)


def narrow_runs(runs: Runs, lower: int, upper: int | None) -> Runs:
    """``runs`` with every part's window narrowed to ``[lower, upper)`` (intersected with
    the window it has): how a batch is applied for part of its range without rewriting.
    Parts (and runs) left with an empty window are dropped."""
    narrowed: list[Run] = []
    for run in runs:
        parts: list[Part] = []
        for part in run:
            lo, hi = lower, upper
            if part.window is not None:
                lo = max(lo, part.window.lower)
                hi = frontier.meet((hi, part.window.upper))
            if frontier.lt(lo, hi):
                parts.append(msgspec.structs.replace(part, window=Window(lo, hi)))
        if parts:
            narrowed.append(tuple(parts))
    return tuple(narrowed)


def forward_runs(runs: Runs, lower: int, upper: int | None) -> Runs:
    """``runs`` applied for ``[lower, upper)`` with every time before ``lower`` forwarded to
    ``lower``: each part's window is capped at ``upper`` (updates at or beyond it dropped),
    and its ``forward`` raised to ``lower``. A window filters the written times first, then
    ``forward`` moves what is left. Parts left with no time before ``upper`` are dropped."""
    out: list[Run] = []
    for run in runs:
        parts: list[Part] = []
        for part in run:
            window = part.window
            w_lower = 0 if window is None else window.lower
            w_upper = upper if window is None else frontier.meet((upper, window.upper))
            if not frontier.lt(w_lower, w_upper) or not frontier.lt(lower, upper):
                continue
            unbounded = window is None and upper is None
            new_window = None if unbounded else Window(w_lower, w_upper)
            parts.append(
                msgspec.structs.replace(part, window=new_window, forward=max(part.forward, lower))
            )
        if parts:
            out.append(tuple(parts))
    return tuple(out)


def part_times(part: Part) -> tuple[int, int | None]:
    """``[lowest, beyond)``: the times a part's updates read at, after its window and
    forward (``beyond`` None: unbounded)."""
    lower = 0 if part.window is None else part.window.lower
    upper = None if part.window is None else part.window.upper
    return max(lower, part.forward), upper


class Applied(msgspec.Struct, frozen=True, array_like=True):
    """An idempotency key's latest applied id (Addendum E): the append of ``(key, id)`` set
    the upper to ``upper`` at ``applied_ms``; any id up to ``id`` is applied. ``digest``
    names the batches that append applied (``batch.batches_digest``; empty in older
    states): a replay carrying them is that append, not another (issue 27)."""

    id: int
    upper: int | None
    applied_ms: int
    digest: bytes = b""


class HollowBatch(msgspec.Struct, frozen=True, array_like=True):
    """A batch of the trace: its description and its runs (no runs: an empty batch).

    Batch ids are unique in a shard and a batch never changes under its id, so "the same
    id" means "the same batch" everywhere (diffs, merge claims, merge application).
    """

    id: int
    desc: Desc
    runs: Runs
    updates: int
    """Entries over all parts (before windows); the spine level derives from it."""

    @property
    def is_empty(self) -> bool:
        return not self.runs

    def parts(self) -> Iterator[Part]:
        for run in self.runs:
            yield from run

    def part_keys(self) -> Iterator[str]:
        """Blob keys of the hollow parts."""
        for part in self.parts():
            if isinstance(part, HollowPart):
                yield part.key


class LeasedReader(msgspec.Struct, frozen=True, array_like=True):
    """A read handle: holds ``since`` and the oldest state ``seqno`` it may still read."""

    seqno: int
    since: int | None
    last_heartbeat_ms: int
    lease_ms: int
    debug: str = ""

    def expired(self, walltime_ms: int) -> bool:
        return self.last_heartbeat_ms + self.lease_ms < walltime_ms


class CriticalReader(msgspec.Struct, frozen=True, array_like=True):
    """A since hold without a lease, guarded by a caller-chosen ``opaque`` token."""

    since: int | None
    opaque: bytes = b""
    debug: str = ""


class Writer(msgspec.Struct, frozen=True, array_like=True):
    """A write handle: its lease and the idempotency token of its last committed call."""

    last_heartbeat_ms: int
    lease_ms: int
    most_recent_token: str = ""
    most_recent_upper: int | None = 0
    debug: str = ""

    def expired(self, walltime_ms: int) -> bool:
        return self.last_heartbeat_ms + self.lease_ms < walltime_ms


class RollupRef(msgspec.Struct, frozen=True, array_like=True):
    """A rollup blob (the whole state at some seqno), at ``shards/{shard}/{key}``."""

    key: str
    size: int


class MergeClaim(msgspec.Struct, frozen=True, array_like=True):
    """A merge of contiguous batches (oldest first) that ``claimant`` is working on."""

    inputs: tuple[int, ...]
    claimant: str
    claimed_ms: int
    lease_ms: int

    def expired(self, walltime_ms: int) -> bool:
        return self.claimed_ms + self.lease_ms < walltime_ms


class GcClaim(msgspec.Struct, frozen=True, array_like=True):
    """A GC pass in progress; ``seqno`` is the state it computes from (its fence)."""

    claimant: str
    seqno: int
    started_ms: int


class State(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The state of a shard at ``seqno``.

    Invariants (:meth:`validate`; every transition keeps them):

    * ``upper`` and ``since`` never regress (checked across steps by
      ``transitions.check_step``); ``walltime_ms`` strictly increases with ``seqno``.
    * ``since`` is the meet of all readers' sinces (leased and critical) whenever a reader
      exists; with none, it stays where the last one left it.
    * The trace's descs are contiguous from 0 to ``upper``; an empty trace means
      ``upper == 0`` (or a finalized shard). Every batch's ``desc.since <= since``, its
      ``updates`` is the sum of its parts', every part holds at least one update and its
      window lies inside the batch's desc. Batch ids are unique and below ``next_batch_id``.
    * Each merge claim names at least two contiguous batches of the trace, no batch is in
      two claims, and claim ids are below ``next_merge_id``.
    * Rollups are registered for seqnos in ``[1, seqno)``, under keys naming that seqno.
    * ``finalized`` implies ``upper is None``, ``since is None`` and no trace, readers,
      writers or merges.
    """

    shard_id: str
    seqno: int
    walltime_ms: int
    upper: int | None = 0
    since: int | None = 0
    trace: tuple[HollowBatch, ...] = ()
    next_batch_id: int = 1
    next_merge_id: int = 1
    merges: dict[int, MergeClaim] = {}
    leased_readers: dict[str, LeasedReader] = {}
    critical_readers: dict[str, CriticalReader] = {}
    writers: dict[str, Writer] = {}
    rollups: dict[int, RollupRef] = {}
    idempotency: dict[str, Applied] = {}
    last_gc_seqno: int = 0
    active_gc: GcClaim | None = None
    finalized: bool = False

    @classmethod
    def initial(cls, shard_id: str) -> State:
        """The state of a shard nobody has written: seqno 0, before the first consensus
        entry. It is implied by the shard id, so it needs no rollup.

        Raises:
            UsageError: ``shard_id`` is not a valid shard id.
        """
        return cls(shard_id=validate_shard_id(shard_id), seqno=0, walltime_ms=0)

    def batch_index(self) -> dict[int, int]:
        """Batch id -> position in the trace."""
        return {batch.id: i for i, batch in enumerate(self.trace)}

    def reader_sinces(self) -> Iterator[int | None]:
        for leased in self.leased_readers.values():
            yield leased.since
        for critical in self.critical_readers.values():
            yield critical.since

    def has_readers(self) -> bool:
        return bool(self.leased_readers or self.critical_readers)

    def inline_bytes(self) -> int:
        """Bytes of inline part data in the trace (bounded by ``inline_state_max_bytes``
        by the writers, who put larger parts in blobs)."""
        return sum(
            len(part.data)
            for batch in self.trace
            for part in batch.parts()
            if isinstance(part, InlinePart)
        )

    def latest_rollup(self) -> tuple[int, RollupRef] | None:
        """The newest registered rollup, where a cold load starts (None: replay from the
        implied initial state)."""
        if not self.rollups:
            return None
        seqno = max(self.rollups)
        return seqno, self.rollups[seqno]

    def validate(self) -> None:
        """Check the invariants of the class docstring.

        Raises:
            CorruptionError: the first invariant that does not hold.
        """
        for problem in self._problems():
            raise CorruptionError(f"shard {self.shard_id!r} state {self.seqno}: {problem}")

    def _problems(self) -> Iterator[str]:
        try:
            validate_shard_id(self.shard_id)
        except UsageError:
            yield "invalid shard id"
        if self.seqno < 0 or self.walltime_ms < 0:
            yield "negative seqno or walltime"
        yield from self._trace_problems()
        yield from self._merge_problems()
        sinces = list(self.reader_sinces())
        if sinces and self.since != frontier.meet(sinces):
            yield f"since {self.since} is not the meet of the readers' sinces"
        for reader_id, leased in self.leased_readers.items():
            if leased.seqno > self.seqno:
                yield f"leased reader {reader_id} holds seqno {leased.seqno} from the future"
        for seqno, ref in self.rollups.items():
            if not 1 <= seqno < self.seqno or rollup_seqno(ref.key) != seqno:
                yield f"rollup {seqno} ({ref.key}) is not a rollup of an earlier seqno"
        for key, applied in self.idempotency.items():
            if not key or applied.id < 0 or applied.applied_ms > self.walltime_ms:
                yield f"idempotency key {key!r} records id {applied.id} at {applied.applied_ms}"
        if self.last_gc_seqno > self.seqno or (
            self.active_gc is not None and self.active_gc.seqno > self.seqno
        ):
            yield "GC refers to a seqno from the future"
        if self.finalized and (
            self.upper is not None
            or self.since is not None
            or self.trace
            or sinces
            or self.writers
            or self.merges
            or self.idempotency
        ):
            yield "finalized, but frontiers, trace, handles or merges remain"

    def _trace_problems(self) -> Iterator[str]:
        lower: int | None = 0
        ids: set[int] = set()
        for batch in self.trace:
            desc = batch.desc
            if desc.lower != lower or not frontier.lt(desc.lower, desc.upper):
                yield f"batch {batch.id} [{desc.lower}, {desc.upper}) breaks the trace at {lower}"
            lower = desc.upper
            if batch.id in ids or not 1 <= batch.id < self.next_batch_id:
                yield f"batch id {batch.id} is repeated or not below next_batch_id"
            ids.add(batch.id)
            if not frontier.le(desc.since, self.since):
                yield f"batch {batch.id} is forwarded to {desc.since}, beyond since {self.since}"
            if batch.updates != runs_updates(batch.runs):
                yield f"batch {batch.id} counts {batch.updates} updates, its parts another"
            for part in batch.parts():
                window = part.window
                if part.updates < 1:
                    yield f"batch {batch.id} has a part without updates"
                lowest = part_times(part)[0]
                if window is not None and not (
                    desc.lower <= lowest
                    and frontier.lt(window.lower, window.upper)
                    and frontier.le(window.upper, desc.upper)
                ):
                    yield f"batch {batch.id} has a part window outside its desc"
                if part.forward and not (
                    desc.lower <= part.forward and frontier.lt(part.forward, desc.upper)
                ):
                    yield f"batch {batch.id} has a part forwarded outside its desc"
            if any(not run for run in batch.runs):
                yield f"batch {batch.id} has a run without parts"
        if self.trace and lower != self.upper:
            yield f"the trace ends at {lower}, the upper is {self.upper}"
        if not self.trace and self.upper != (None if self.finalized else 0):
            yield f"no trace, but the upper is {self.upper}"

    def _merge_problems(self) -> Iterator[str]:
        index = self.batch_index()
        claimed: set[int] = set()
        for merge_id, claim in self.merges.items():
            positions = [index.get(batch_id, -1) for batch_id in claim.inputs]
            if not 1 <= merge_id < self.next_merge_id:
                yield f"merge id {merge_id} is not below next_merge_id"
            if (
                len(positions) < 2
                or positions != list(range(positions[0], positions[0] + len(positions)))
                or -1 in positions
            ):
                yield f"merge {merge_id} does not name contiguous batches of the trace"
            if claimed & set(claim.inputs):
                yield f"merge {merge_id} claims a batch another merge claims"
            claimed.update(claim.inputs)


_rollup_encoder = msgspec.msgpack.Encoder()
_rollup_decoder = msgspec.msgpack.Decoder(State)


def encode_rollup(state: State) -> bytes:
    """A rollup blob of ``state``: msgpack inside the ``SLPR`` envelope."""
    return seal(ROLLUP_MAGIC, STATE_FORMAT_VERSION, _rollup_encoder.encode(state))


def decode_rollup(data: bytes, *, path: str | None = None) -> State:
    """Decode and check a rollup blob.

    Raises:
        CorruptionError: bad envelope, undecodable payload or a broken invariant (with
            ``path``).
    """
    try:
        _, payload = unseal(data, ROLLUP_MAGIC, (STATE_FORMAT_VERSION,), "persist rollup")
        state = _rollup_decoder.decode(payload)
        state.validate()
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"persist rollup: cannot decode: {exc}", path=path) from exc
    except UnsupportedFormatVersion as exc:
        raise (exc if path is None else exc.at(path)) from None
    except CorruptionError as exc:
        raise CorruptionError(str(exc), path=path) from exc
    return state
