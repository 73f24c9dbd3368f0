"""The torture workload's model of what may be read, its constants and its report (see
:mod:`slatepy.testing.torture`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from slatepy.compactor import CompactionPolicy
from slatepy.engine.wal_reader import WalRecord
from slatepy.testing.faults import FaultyStore

KEYS = [b"key%02d" % i for i in range(16)]
BATCH_KEYS = [b"batch:%d" % i for i in range(4)]
MERGE_KEYS = [b"merge%d" % i for i in range(3)]
"""Keys only merged into (and range-deleted); they sort after ``KEYS``."""
POLICY = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=8, target_sst_bytes=4096)
PAD = b"." * 48
"""In every value: enough bytes per block that compacted blocks are worth compressing."""
CODECS = ("none", "lz4", "zstd")
RETAINS: tuple[int | None, ...] = (0, 16 * 1024, None)
"""``memtable_retain_bytes`` of a writer open: nothing kept, a little (so prunes cut what is
kept), the default (everything a run writes)."""
CHECKPOINT_LIFETIMES = (None, 3600.0)
"""None expire during a run: expiry runs on the real clock (not the workload's), and a run
must replay the same way from its seed (tests/engine/test_checkpoint.py covers expiry)."""
MAX_CHECKPOINTS = 4
MAX_CLONES = 3
OPEN_ATTEMPTS = 50
READS_DURING_BATCH = 200
"""At most this many reads (of the writer and of the reader) race one batch."""
PROGRESS_INTERVAL = 5.0
"""Seconds between two progress lines of a timed run."""


class Violation(AssertionError):
    """The database returned something the model says it must not."""


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    """The workload's merge operator: operands joined by commas after the existing value."""
    return b",".join(([] if existing is None else [existing]) + operands)


def counter_of(value: bytes | None) -> int | None:
    return None if value is None else int(value.rsplit(b"=", 1)[1])


def feed_values(record: WalRecord) -> list[bytes | None]:
    """What a change feed record (not a range delete) says was written: merge operands one
    by one, a put's value, a delete's None."""
    return list(record.operands) if record.kind == "merge" else [record.value]


def counter_or_operand(value: bytes | None) -> int | None:
    """The workload's counter in a value (``key...=N``) or a merge operand (``N``)."""
    if value is None:
        return None
    return int(value.rsplit(b"=", 1)[-1])


@dataclass
class WriteLog:
    """Every write issued to the database, for checking its change feed (``WalReader``).

    Positions count issued writes. A put is *required* in the feed from a start on if it was
    acknowledged and no later write to its key was issued before its acknowledgement: such a
    write may have landed in the same WAL SST, which keeps only the last write to a key.
    """

    position: int = 0
    values: dict[bytes, set[bytes | None]] = field(default_factory=dict)
    """Per key, every value issued (None: a point delete; merge operands for merge keys)."""
    issued: dict[bytes, list[int]] = field(default_factory=dict)
    """Per key, the positions of the writes issued to it."""
    puts: dict[bytes, tuple[bytes, int, int | None]] = field(default_factory=dict)
    """Per put value (values are unique): key, issue position, acknowledgement position."""
    ranges: set[tuple[bytes, bytes]] = field(default_factory=set)
    """The bounds of every range delete issued."""
    awaited_ranges: list[tuple[bytes, bytes, int]] = field(default_factory=list)
    """The range deletes acknowledged as durable: bounds, and the counter of the last write
    issued before them (the feed must hold those issued after its start: a range delete
    is never superseded in a WAL SST)."""

    def issue(self, key: bytes, value: bytes | None) -> None:
        self.position += 1
        self.values.setdefault(key, set()).add(value)
        self.issued.setdefault(key, []).append(self.position)
        if value is not None and key not in MERGE_KEYS:
            self.puts[value] = (key, self.position, None)

    def ack(self, key: bytes, value: bytes | None) -> None:
        if value is not None and value in self.puts and self.puts[value][2] is None:
            self.puts[value] = (key, self.puts[value][1], self.position)

    def required(self, after_counter: int) -> dict[bytes, bytes]:
        """The puts (value -> key) the feed must hold among writes issued after the write
        with counter ``after_counter``."""
        found = {}
        for value, (key, issued, acked) in self.puts.items():
            counter = counter_of(value)
            if acked is None or counter is None or counter <= after_counter:
                continue
            if not any(issued < p <= acked for p in self.issued[key]):
                found[value] = key
        return found


@dataclass
class Model:
    """Per key: the last acknowledged value (None = absent) and the unacknowledged ones."""

    acked: dict[bytes, bytes | None] = field(default_factory=dict)
    unknown: dict[bytes, list[bytes | None]] = field(default_factory=dict)
    expires: dict[bytes, float] = field(default_factory=dict)
    """TTL'd values (each value is unique) and when they expire."""
    now: float = 0.0
    """The workload's clock, seconds."""
    log: WriteLog | None = None
    """The writes issued, for the change feed (the database's own model only)."""

    def written(self, key: bytes, value: bytes | None, *, logged: bool = True) -> None:
        """A write was issued; until acknowledged its fate is unknown (``logged``: False if
        the log has it already)."""
        self.unknown.setdefault(key, []).append(value)
        if self.log is not None and logged:
            self.log.issue(key, value)

    def acknowledged(self, key: bytes, value: bytes | None) -> None:
        self.acked[key] = value
        self.unknown.pop(key, None)
        if self.log is not None:
            self.log.ack(key, value)

    def frozen(self) -> Model:
        """A copy of what may be read now, for a view fixed now (a checkpoint, a clone);
        set its ``now`` before checking, as TTLs run on."""
        return Model(
            acked=dict(self.acked),
            unknown={k: list(v) for k, v in self.unknown.items()},
            expires=self.expires,  # values are unique: later entries are for later values
            now=self.now,
        )

    def allowed(self, key: bytes) -> list[bytes | None]:
        return [self._live(v) for v in (self.acked.get(key), *self.unknown.get(key, []))]

    def _live(self, value: bytes | None) -> bytes | None:
        """``value`` as read now: None once its TTL ran out."""
        if value is not None and self.now >= self.expires.get(value, float("inf")):
            return None
        return value

    def check(self, key: bytes, observed: bytes | None, who: str) -> None:
        if observed not in self.allowed(key):
            raise Violation(
                f"{who} read {key!r} = {observed!r}; acknowledged {self.acked.get(key)!r}, "
                f"unknown {self.unknown.get(key, [])!r}"
            )


@dataclass
class HeldCheckpoint:
    """A checkpoint the workload made, and the model frozen when it was made."""

    id: str
    model: Model
    merged: dict[bytes, set[bytes | None]]
    expires: float | None
    """The earliest it may expire (``time.time()``); None: never."""
    maybe_gone: bool = False
    """A delete of it failed: it may or may not be there."""

    def may_be_gone(self) -> bool:
        return self.maybe_gone or (self.expires is not None and time.time() >= self.expires)


@dataclass
class HeldClone:
    """A clone the workload made: its location and its own model (the source's, frozen when
    cloned, plus the clone's writes)."""

    store: FaultyStore
    model: Model
    merged: dict[bytes, set[bytes | None]]


@dataclass
class Report:
    operations: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    crashes: int = 0
    acknowledged_writes: int = 0
    lost_acknowledged_writes: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    codecs: Counter[str] = field(default_factory=Counter)
    """Writer opens per compression codec."""
    checks: Counter[str] = field(default_factory=Counter)
    """Successful checks of checkpoints, clones and the change feed, by kind."""

    def lines(self) -> list[str]:
        return [
            f"operations: {sum(self.operations.values())} "
            + " ".join(f"{k}={v}" for k, v in sorted(self.operations.items())),
            "failed (store faults surfaced to the caller): "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.failed.items())) or "none"),
            "faults injected: "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"),
            f"writer crashes: {self.crashes}",
            "writer opens by codec: "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.codecs.items())) or "none"),
            "checks passed: "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.checks.items())) or "none"),
            f"acknowledged writes: {self.acknowledged_writes}, "
            f"lost acknowledged writes: {self.lost_acknowledged_writes}",
        ]
