"""Settings of persist shards: leases, part sizes, and the thresholds of rollups, GC and the
spine (RFC 0015 §9). Validated once, when built, so a bad value fails before anything is
written. Durations are seconds; the state stores milliseconds (see the ``*_ms`` properties).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Self

import msgspec

from slatepy.errors import InvalidArgument

MIN_SAFE_LEASE = 3600.0
"""Seconds ``batch_lease`` and ``consensus_min_age`` must at least be, unless
``allow_short_leases``: they bound how long a stalled request may stay in flight and still
be safe (RFC 0015 §3.2, §6.4; the same assumption as RFC 0003)."""


_KINDS: dict[str, tuple[type, ...]] = {
    "float": (int, float),
    "float | None": (int, float, type(None)),
    "int": (int,),
    "bool": (bool,),
}

DEFAULT_STALL_TIMEOUT = 60.0
"""Seconds an append waits for compaction by default (capped at ``batch_lease / 4``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PersistSettings:
    """Tunables of persist clients, handles and maintenance.

    Attributes:
        writer_lease: Seconds a writer stays registered without a heartbeat or a write.
        reader_lease: Seconds a leased reader stays registered without a heartbeat.
        batch_lease: Seconds an unreferenced part (or rollup) must be old before GC deletes
            it; a batch may be applied only within half of it of being written.
        merge_lease: Seconds a merge claim lasts without renewal before another writer may
            take it over.
        consensus_min_age: Seconds a consensus entry's successor must be old before the
            object-store consensus truncates the entry (create-after-truncate).
        inline_part_max_bytes: Largest encoded part kept inline in the state (no blob
            write); 0 never inlines.
        inline_state_max_bytes: Inline part bytes one state may hold before new parts go
            to blobs.
        part_target_bytes: Size at which batch and compaction parts are cut.
        builder_buffer_bytes: Updates a ``BatchBuilder`` buffers before writing a part.
        compaction_memory_bytes: Read-ahead budget of one merge.
        snapshot_memory_bytes: Read-ahead budget of one snapshot.
        rollup_min_bytes: Diff bytes since the latest rollup below which no rollup is due
            (the threshold is the larger of this and the latest rollup's size).
        rollup_min_diffs: Diffs since the latest rollup below which no rollup is due.
        rollup_replay_limit: A load that replayed more diffs than this writes a rollup.
        gc_min_versions: Versions ``seqno_since`` must move past the last GC to start one
            (a pass costs about 25 requests: a LIST of parts and rollups, the replay of the
            states since a rollup, deletions, two state changes).
        listen_poll_max: Longest pause in seconds between polls of an idle listen.
        max_trace_batches: Batches in the trace at which appends wait for compaction.
        small_merge_batches: Non-empty batches below 1,024 updates a merge of them takes
            at least (the spine's small fanout, RFC 0015 §8.1): each merge is a blob write
            and a state change, so 2 (pairs) would cost about one of each per small append.
        write_stall_timeout: Seconds an append waits for compaction at
            ``max_trace_batches`` before it fails with ``WriteStalled``; at most
            ``batch_lease / 4`` (its parts are written before it waits, and a batch may be
            applied only within ``batch_lease / 2`` of being written). None (the default):
            the smaller of 60 s and ``batch_lease / 4`` (see :attr:`stall_timeout`).
        max_handles: Most leased readers, and most writers, one shard registers.
        idempotency_ttl: Seconds an idempotency key (``compare_and_append_batch(...,
            idempotency=(key, id))``) stays recorded after its last append; a replay older
            than this appends again (RFC 0015 Addendum E).
        max_idempotency_keys: Most idempotency keys one shard records; a new key beyond it
            evicts the least recently used one.
        compaction: ``"on"`` runs merges in clients with a writer; ``"off"`` never merges.
        allow_short_leases: Allow ``batch_lease`` and ``consensus_min_age`` below one hour
            (tests only: shorter leases are unsafe against stalled requests).
        max_clock_skew: Seconds one commit may move the state's walltime beyond the time
            its committer has seen pass since it first saw the state (RFC 0015, issue 27
            addendum on clocks): the assumed bound on clock skew between processes. A
            host whose clock is further ahead moves leases, claims and key TTLs at most
            this much early.
    """

    writer_lease: float = 3600.0
    reader_lease: float = 900.0
    batch_lease: float = 3600.0
    merge_lease: float = 60.0
    consensus_min_age: float = 3600.0
    inline_part_max_bytes: int = 4096
    inline_state_max_bytes: int = 256 * 1024
    part_target_bytes: int = 16 * 1024 * 1024
    builder_buffer_bytes: int = 32 * 1024 * 1024
    compaction_memory_bytes: int = 64 * 1024 * 1024
    snapshot_memory_bytes: int = 64 * 1024 * 1024
    rollup_min_bytes: int = 4096
    rollup_min_diffs: int = 16
    rollup_replay_limit: int = 256
    gc_min_versions: int = 128
    listen_poll_max: float = 1.0
    max_trace_batches: int = 2000
    small_merge_batches: int = 8
    write_stall_timeout: float | None = None
    max_handles: int = 1000
    idempotency_ttl: float = 7 * 24 * 3600.0
    max_idempotency_keys: int = 1000
    compaction: Literal["on", "off"] = "on"
    allow_short_leases: bool = False
    max_clock_skew: float = 60.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kinds = _KINDS.get(str(field.type), (str,))
            # bool is an int subclass: neither may stand for the other here.
            if not isinstance(value, kinds) or isinstance(value, bool) != (kinds == (bool,)):
                raise InvalidArgument(f"{field.name} must be of type {field.type}, not {value!r}")
        short = self.allow_short_leases
        checks: list[tuple[bool, str]] = [
            (self.writer_lease > 0, "writer_lease must be > 0 seconds"),
            (self.reader_lease > 0, "reader_lease must be > 0 seconds"),
            (self.merge_lease > 0, "merge_lease must be > 0 seconds"),
            (
                self.batch_lease > 0 and (short or self.batch_lease >= MIN_SAFE_LEASE),
                "batch_lease must be >= 3600 seconds (allow_short_leases=True for tests)",
            ),
            (
                self.consensus_min_age > 0 and (short or self.consensus_min_age >= MIN_SAFE_LEASE),
                "consensus_min_age must be >= 3600 seconds (allow_short_leases=True for tests)",
            ),
            (
                0 <= self.inline_part_max_bytes <= self.inline_state_max_bytes,
                "inline_part_max_bytes must be in [0, inline_state_max_bytes]",
            ),
            (self.part_target_bytes >= 1024, "part_target_bytes must be >= 1024"),
            (self.builder_buffer_bytes >= 1024, "builder_buffer_bytes must be >= 1024"),
            (self.compaction_memory_bytes >= 1 << 20, "compaction_memory_bytes must be >= 1 MiB"),
            (self.snapshot_memory_bytes >= 1 << 20, "snapshot_memory_bytes must be >= 1 MiB"),
            (self.rollup_min_bytes >= 0, "rollup_min_bytes must be >= 0"),
            (self.rollup_min_diffs >= 1, "rollup_min_diffs must be >= 1"),
            (self.rollup_replay_limit >= 1, "rollup_replay_limit must be >= 1"),
            (self.gc_min_versions >= 1, "gc_min_versions must be >= 1"),
            (self.listen_poll_max > 0, "listen_poll_max must be > 0"),
            (self.max_trace_batches >= 8, "max_trace_batches must be >= 8"),
            (2 <= self.small_merge_batches <= 64, "small_merge_batches must be in [2, 64]"),
            (
                self.write_stall_timeout is None or self.write_stall_timeout > 0,
                "write_stall_timeout must be > 0",
            ),
            (
                self.write_stall_timeout is None
                or self.write_stall_timeout <= self.batch_lease / 4,
                f"write_stall_timeout ({self.write_stall_timeout} s) must be at most "
                f"batch_lease / 4 ({self.batch_lease / 4} s): an append's parts are written "
                "before it waits, a batch may be applied only within batch_lease / 2 of being "
                "written, and GC deletes unreferenced parts older than batch_lease",
            ),
            (self.max_handles >= 1, "max_handles must be >= 1"),
            (self.idempotency_ttl > 0, "idempotency_ttl must be > 0 seconds"),
            (self.max_idempotency_keys >= 1, "max_idempotency_keys must be >= 1"),
            (self.compaction in ("on", "off"), 'compaction must be "on" or "off"'),
            (self.max_clock_skew > 0, "max_clock_skew must be > 0 seconds"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build settings from a mapping, converting strings such as ``"0.5"``.

        Raises:
            InvalidArgument: an unknown option, a value of the wrong type or out of range.
        """
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgument(f"unknown persist setting(s) {unknown}; known: {sorted(known)}")
        try:
            return msgspec.convert(data, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"invalid persist settings: {exc}") from exc

    @property
    def stall_timeout(self) -> float:
        """Seconds an append waits for compaction: ``write_stall_timeout``, or by default
        the smaller of 60 s and ``batch_lease / 4``."""
        if self.write_stall_timeout is not None:
            return self.write_stall_timeout
        return min(DEFAULT_STALL_TIMEOUT, self.batch_lease / 4)

    @property
    def writer_lease_ms(self) -> int:
        return round(self.writer_lease * 1000)

    @property
    def reader_lease_ms(self) -> int:
        return round(self.reader_lease * 1000)

    @property
    def batch_lease_ms(self) -> int:
        return round(self.batch_lease * 1000)

    @property
    def merge_lease_ms(self) -> int:
        return round(self.merge_lease * 1000)

    @property
    def consensus_min_age_ms(self) -> int:
        return round(self.consensus_min_age * 1000)

    @property
    def idempotency_ttl_ms(self) -> int:
        return round(self.idempotency_ttl * 1000)

    @property
    def max_clock_skew_ms(self) -> int:
        return round(self.max_clock_skew * 1000)
