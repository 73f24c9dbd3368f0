"""A randomized workload against a faulty store, checked against a model of what may be read.

Used by ``slatepy torture URL`` (a soak against any store) and by the CI reliability tests
(bounded, several seeds). One thread drives a writer (``Db``), a snapshot reader
(``DbReader``), a compactor and the garbage collector through puts, deletes, atomic batches,
flushes, reads, iterators, snapshots, transactions, compactions, GC passes, crashes (the
writer dropped without a flush) and clean reopens, with the store injecting the four
outcomes of :mod:`slatepy.testing.faults`.

The model (:class:`Model`) knows, per key, the last acknowledged value and the values whose
fate is unknown (written but not acknowledged), and when each TTL'd value expires on the
workload's own clock (moved by ``tick``; the writer, readers and compactors all read it). A
``delete_range`` is a delete of every model key in its range. Merge keys (``merge``: operands
joined by a comma, :func:`concat`) are modelled apart, as the set of values they may hold: a
write whose fate is unknown adds its outcome to the set rather than replacing it. Invariants
checked:

* every read returns the last acknowledged value or one of the unknown ones (nothing lost,
  nothing invented);
* the batch keys always read the same batch (batches are atomic), in one scan;
* a reader never goes back in time (values carry an increasing counter);
* at the end, with faults off, a freshly opened writer and a fresh reader agree with the model.

Beyond the one database (RFCs 0017 and 0018):

* a checkpoint reads, whatever was written, compacted and collected since, the model as it
  was when the checkpoint was made (a frozen copy: the acknowledged values then, or one of the
  values whose fate was unknown then); deleting one, then collecting, loses nothing live; a
  deleted one is ``NotFound``, never wrong data;
* a clone (of the live database or of a checkpoint, under ``clone_root``; not of
  ``memory://``, which cannot be reopened by URL) reads that frozen model plus its own writes,
  before and after the source is compacted and collected, and its writes never reach the
  source;
* the WAL's change feed (``WalReader``) yields records in seq order (a seq's range deletes
  first, then its point writes by key) and in the order the writes were issued, every record
  is a write that was issued, of the kind issued (a put with the expiry it was written with, a
  merge with its operands, a range delete with its bounds), and every acknowledged put and
  awaited range delete after the feed's start is in it, unless (a put) a later write to its
  key may have shared its WAL SST (the feed holds net changes per SST) or the garbage
  collector took that part of the WAL (``WalHistoryGone``);
* every (re)open of the writer picks a compression codec at random, so SSTs of every codec
  coexist and are compacted together, and how much it keeps in memory once compacted
  (``memtable_retain_bytes``: nothing, a little, so that prunes cut it, or the default).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.config import Settings
from slatepy.engine import checkpoint as checkpoints
from slatepy.engine.batch import WriteBatch
from slatepy.engine.clone import clone, with_external
from slatepy.engine.db import Db
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.engine.reader import DbReader
from slatepy.engine.snapshot import Snapshot
from slatepy.engine.wal_reader import WalHistoryGone, WalReader, WalRecord
from slatepy.errors import (
    CorruptionError,
    FencedError,
    NotFound,
    SlatepyError,
    TransactionConflict,
)
from slatepy.gc import GarbageCollector
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.url import open_store
from slatepy.testing.faults import FaultyStore, uniform

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


class Torture:
    """The workload over ``store`` (faults are added here) with ``seed``.

    Args:
        settings: Also opens the clones' locations, and the database by URL from them.
        clone_root: A URL under which clones are made (``clone_root/clone-<uuid>``), on a
            backend that can reopen ``store`` by its URL; None: no clones.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        seed: int,
        fault_rate: float = 0.03,
        settings: Settings | None = None,
        clone_root: str | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.fault_rate = fault_rate
        self.faulty = FaultyStore(store, uniform(fault_rate), seed=seed)
        base = settings or Settings()
        self.store_settings = base
        """Opens the clones' locations (and, from them, this database by URL)."""
        self.clone_root = clone_root
        # Few attempts, so injected faults reach every error path (a writer whose WAL write
        # fails, a compaction or GC cut short), not only the retry loops.
        self.settings = msgspec.structs.replace(
            base,
            compactor="off",
            flush_interval=60.0,
            reader_poll_interval=3600.0,
            wal_write_attempts=2,
            request_attempts=2,
        )
        self.model = Model(now=float(int(time.time())), log=WriteLog())
        self.report = Report()
        self.counter = 0
        self.pending: list[tuple[bytes, bytes | None]] = []  # unawaited, not yet flushed
        self.reader_seen: dict[bytes, int] = {}
        self.merged: dict[bytes, set[bytes | None]] = {k: {None} for k in MERGE_KEYS}
        """What each merge key may hold."""
        self.db: Db | None = None
        self.reader: DbReader | None = None
        self.snapshots: list[tuple[Snapshot, list[tuple[bytes, bytes]]]] = []
        self.checkpoints: list[HeldCheckpoint] = []
        self.deleted_checkpoints: list[str] = []
        self.clones: list[HeldClone] = []
        self.cdc_marks: list[tuple[int, int]] = []
        """(seq, counter): the WAL's last seq when the write with that counter was the last
        one issued; a feed from seq + 1 on must hold every required later put."""

    # -- lifecycle ---------------------------------------------------------------------
    def _retry(self, what: str, fn: Callable[[], object]) -> object:
        """``fn`` until it succeeds; after ``OPEN_ATTEMPTS`` failures the network "heals" for
        one more attempt (an open over a long WAL can fail for a long time at high fault
        rates: that is the store being unusable, not the database being wrong)."""
        for _ in range(OPEN_ATTEMPTS):
            try:
                return fn()
            except SlatepyError:
                self.report.failed[what] += 1
        self.report.failed[f"{what} (healed)"] += 1
        self.faulty.enabled = False
        try:
            return fn()
        finally:
            self.faulty.enabled = True

    def writer(self) -> Db:
        if self.db is None:
            codec, retain = self.rng.choice(CODECS), self.rng.choice(RETAINS)
            self.settings = msgspec.structs.replace(
                self.settings, compression=codec, memtable_retain_bytes=retain
            )
            self.report.codecs[codec] += 1
            db = self._retry(
                "open",
                lambda: Db.open(
                    self.faulty, settings=self.settings, clock=self.clock, merge_operator=concat
                ),
            )
            assert isinstance(db, Db)
            self.db = db
        return self.db

    def crash(self) -> None:
        """Drop the writer like a killed process: unflushed writes stay unknown."""
        if self.db is not None:
            self.db._crash()
            self.db = None
            self.pending.clear()
            self.report.crashes += 1

    def close_writer(self) -> None:
        if self.db is None:
            return
        db, self.db = self.db, None
        try:
            db.close()
            self._acknowledge_pending()
        except SlatepyError:
            self.report.failed["close"] += 1
        self.pending.clear()

    def clock(self) -> float:
        """The workload's wall clock (seconds): expiry is judged by it everywhere."""
        return self.model.now

    # -- operations --------------------------------------------------------------------
    def _value(self, key: bytes) -> bytes:
        self.counter += 1
        return b"%s%s=%d" % (key, PAD, self.counter)

    def _acknowledge_pending(self) -> None:
        for key, value in self.pending:
            self.model.acknowledged(key, value)
            self.report.acknowledged_writes += 1
        self.pending.clear()

    def _write(
        self,
        ops: list[tuple[bytes, bytes | None]],
        durable: bool,
        *,
        ttl: int | None = None,
        deleted_range: tuple[bytes, bytes] | None = None,
        range_batch: tuple[bytes, bytes] | None = None,
    ) -> bool:
        """Write ``ops`` (as the model sees them): a put (with ``ttl``), a delete, a batch of
        puts, or a ``delete_range`` (``ops`` then deletes every model key in the range), or
        with ``range_batch`` one batch of that range delete and the puts among ``ops``.
        False if the write failed (the writer is then dropped)."""
        db = self.writer()
        for key, value in ops:
            self.model.written(key, value)
            if ttl is not None and value is not None:
                self.model.expires[value] = self.model.now + ttl
        try:
            if range_batch is not None:
                batch = WriteBatch()
                batch.delete_range(*range_batch)
                for key, value in ops:
                    if value is not None:
                        batch.put(key, value)
                db.write(batch, await_durable=durable)
            elif deleted_range is not None:
                db.delete_range(*deleted_range, await_durable=durable)
            elif len(ops) > 1:
                batch = WriteBatch()
                for key, value in ops:
                    assert value is not None  # batches here only put
                    batch.put(key, value)
                db.write(batch, await_durable=durable)
            elif ops[0][1] is None:
                db.delete(ops[0][0], await_durable=durable)
            else:
                db.put(ops[0][0], ops[0][1], await_durable=durable, ttl=ttl)
        except SlatepyError:
            self.report.failed["write"] += 1
            self.crash()  # a writer that could not make a write durable refuses all others
            return False
        if durable:
            # Earlier unawaited writes are in this SST or an earlier one (one PUT in flight).
            self._acknowledge_pending()
            for key, value in ops:
                self.model.acknowledged(key, value)
            self.report.acknowledged_writes += len(ops)
        else:
            self.pending += ops
        return True

    def op_put(self) -> None:
        key = self.rng.choice(KEYS)
        self._write([(key, self._value(key))], durable=self.rng.random() < 0.7)

    def op_delete(self) -> None:
        self._write([(self.rng.choice(KEYS), None)], durable=self.rng.random() < 0.7)

    def op_put_ttl(self) -> None:
        key = self.rng.choice(KEYS)
        ttl = self.rng.choice([1, 2, 5])
        self._write([(key, self._value(key))], durable=self.rng.random() < 0.7, ttl=ttl)

    def op_delete_range(self) -> None:
        start, end = sorted(self.rng.sample(KEYS + MERGE_KEYS, 2))
        ops: list[tuple[bytes, bytes | None]] = [(k, None) for k in KEYS if start <= k < end]
        # Merge keys in the range may be deleted (the write's fate is unknown until awaited;
        # their model only widens).
        for key in MERGE_KEYS:
            if start <= key < end:
                self.merged[key].add(None)
        durable = self.rng.random() < 0.7
        log, issued = self.model.log, self.counter
        assert log is not None
        log.ranges.add((start, end))
        if ops:
            written = self._write(ops, durable=durable, deleted_range=(start, end))
        else:
            try:
                self.writer().delete_range(start, end, await_durable=durable)
                written = True
            except SlatepyError:
                self.report.failed["write"] += 1
                self.crash()
                written = False
        if written and durable:
            log.awaited_ranges.append((start, end, issued))

    def op_merge(self) -> None:
        """A durable merge into a merge key: on success the key holds every value it may
        have held with the operand added; on failure that or what it was."""
        key = self.rng.choice(MERGE_KEYS)
        self.counter += 1
        operand = b"%d" % self.counter
        before = self.merged[key]
        after: set[bytes | None] = {concat(key, value, [operand]) for value in before}
        assert self.model.log is not None
        self.model.log.issue(key, operand)
        try:
            self.writer().merge(key, operand)
        except SlatepyError:
            self.report.failed["write"] += 1
            self.merged[key] = before | after
            self.crash()
            return
        self.merged[key] = after

    def op_ingest(self) -> None:
        """A bulk ingestion (RFC 0016) of some merge keys, between merges: the writer flushes
        first (so the ingestion is newer than every write made), then adopts it. Merges after
        it fold over the ingested value, live, replayed, in readers and compacted (issue 29);
        a failed publish may or may not have landed."""
        db = self.writer()
        try:
            db.flush()
        except SlatepyError:
            self.report.failed["flush"] += 1
            self.crash()
            return
        self._acknowledge_pending()
        keys = sorted(self.rng.sample(MERGE_KEYS, self.rng.randint(1, len(MERGE_KEYS))))
        self.counter += 1
        value = b"ingested%d" % self.counter
        try:
            ssts = write_ingest_ssts(
                self.faulty, [(k, value) for k in keys], self.settings, target_sst_bytes=4096
            )
            publish_ingest(self.faulty, self.settings, ssts)
        except SlatepyError:
            self.report.failed["ingest"] += 1
            for key in keys:
                self.merged[key] = self.merged[key] | {value}
        else:
            for key in keys:
                self.merged[key] = {value}
        try:
            db.refresh()
        except SlatepyError:
            self.report.failed["refresh"] += 1
            self.crash()

    def op_range_batch(self) -> None:
        """A batch ``[delete_range(lo, hi), put(k, new)]`` over a key that holds a value,
        while another thread reads ``k`` from the writer and from the reader: every read
        is the value before or the value after, never the key deleted (half a batch; issue
        29). The reads hit memory only (``k`` was just written), so the store's seeded
        faults are drawn by this thread alone."""
        i = self.rng.randrange(len(KEYS))
        lo, hi = (
            KEYS[self.rng.randint(0, i)],
            [*KEYS, b"key~"][self.rng.randint(i + 1, len(KEYS))],
        )
        key = KEYS[i]
        before, after = self._value(key), self._value(key)
        if not self._write([(key, before)], durable=True):
            return
        db, reader = self.writer(), self.reader
        if reader is not None:
            try:
                reader.refresh()
            except SlatepyError:
                self.report.failed["reader"] += 1
                reader = None
        seen: list[tuple[str, bytes | None]] = []
        done = threading.Event()

        def read() -> None:
            for _ in range(READS_DURING_BATCH):
                if done.is_set():
                    return
                time.sleep(0)  # let the batch go on between reads
                try:
                    seen.append(("writer", db.get(key)))
                    if reader is not None:
                        seen.append(("reader", reader.get(key)))
                except SlatepyError:
                    return  # the writer failed (the batch's WAL write) and was dropped

        thread = threading.Thread(target=read, name="torture-reads")
        thread.start()
        deleted = [(k, None) for k in KEYS if lo <= k < hi and k != key]
        assert self.model.log is not None
        self.model.log.ranges.add((lo, hi))
        issued = self.counter
        written = self._write([*deleted, (key, after)], durable=True, range_batch=(lo, hi))
        if written:
            self.model.log.awaited_ranges.append((lo, hi, issued))
        if reader is not None:
            try:
                reader.refresh()  # applies the batch while the thread reads
            except SlatepyError:
                self.report.failed["reader"] += 1
        done.set()
        thread.join()
        for who, value in seen:
            if value not in (before, after):
                raise Violation(f"{who} read {key!r} = {value!r} during a batch: half a batch")
        self.report.checks["reads during batches"] += len(seen)

    def op_tick(self) -> None:
        """One second passes on the workload's clock (TTL'd values expire)."""
        self.model.now += 1

    def op_batch(self) -> None:
        self.counter += 1
        self._write(
            [(k, b"%s%s=%d" % (k, PAD, self.counter)) for k in BATCH_KEYS],
            durable=self.rng.random() < 0.7,
        )

    def op_flush(self) -> None:
        try:
            self.writer().flush()
        except SlatepyError:
            self.report.failed["flush"] += 1
            self.crash()
            return
        self._acknowledge_pending()

    def op_get(self) -> None:
        key = self.rng.choice(KEYS + BATCH_KEYS + MERGE_KEYS)
        try:
            value = self.writer().get(key)
        except SlatepyError:
            self.report.failed["get"] += 1
            return
        if key in self.merged:
            self._check_merged(key, value, "writer")
        else:
            self.model.check(key, value, "writer")

    def _check_merged(
        self,
        key: bytes,
        value: bytes | None,
        who: str,
        merged: dict[bytes, set[bytes | None]] | None = None,
    ) -> None:
        may = (self.merged if merged is None else merged)[key]
        if value not in may:
            raise Violation(f"{who} read {key!r} = {value!r}; it may hold {may!r}")

    def op_scan(self) -> None:
        try:
            rows = dict(self.writer().scan())
        except SlatepyError:
            self.report.failed["scan"] += 1
            return
        self._check_view(rows, "writer scan")

    def _check_view(
        self,
        rows: dict[bytes, bytes],
        who: str,
        model: Model | None = None,
        merged: dict[bytes, set[bytes | None]] | None = None,
    ) -> None:
        """``rows`` (a whole scan) against ``model`` and ``merged`` (default: the live ones;
        a frozen model is first brought to the workload's clock)."""
        if model is None:
            model = self.model
        else:
            model.now = self.model.now
        extra = set(rows) - set(KEYS + BATCH_KEYS + MERGE_KEYS)
        if extra:
            raise Violation(f"{who} read keys never written: {sorted(extra)!r}")
        for key in KEYS + BATCH_KEYS:
            model.check(key, rows.get(key), who)
        for key in MERGE_KEYS:
            self._check_merged(key, rows.get(key), who, merged)
        batch = {counter_of(rows.get(k)) for k in BATCH_KEYS}
        if len(batch) != 1:
            raise Violation(f"{who} saw a torn batch: {[rows.get(k) for k in BATCH_KEYS]}")

    def op_reader(self) -> None:
        try:
            if self.reader is None:
                self.reader = DbReader.open(
                    self.faulty, settings=self.settings, clock=self.clock, merge_operator=concat
                )
            else:
                self.reader.refresh()
            rows = dict(self.reader.scan())
        except SlatepyError:
            self.report.failed["reader"] += 1
            return
        self._check_view(rows, "reader")
        for key, value in rows.items():
            if key in self.merged:
                continue
            seen, now = self.reader_seen.get(key), counter_of(value)
            if seen is not None and now is not None and now < seen:
                raise Violation(f"reader went back in time on {key!r}: {seen} -> {now}")
            if now is not None:
                self.reader_seen[key] = now

    def op_iterate(self) -> None:
        """Forward, reverse, seek and batched reads of one moment must agree with each other
        (one thread: nothing is written between them) and with the model."""
        db = self.writer()
        try:
            rows = list(db.scan())
            backwards = list(db.scan(reverse=True))
            batched = [r for b in db.scan_batches(batch_size=self.rng.randint(1, 9)) for r in b]
            it = db.iter(reverse=self.rng.random() < 0.5)
            probe = self.rng.choice(KEYS + BATCH_KEYS)
            it.seek(probe)
            sought = list(it)
        except SlatepyError:
            self.report.failed["iterate"] += 1
            return
        if backwards != rows[::-1] or batched != rows:
            raise Violation(f"reverse or batched scan disagrees with the forward scan: {rows}")
        want = (
            [r for r in rows if r[0] >= probe]
            if not it.reverse
            else [r for r in backwards if r[0] <= probe]
        )
        if sought != want:
            raise Violation(f"seek({probe!r}) gave {sought}, expected {want}")
        self._check_view(dict(rows), "writer iterate")

    def op_transaction(self) -> None:
        """A read-modify-write transaction; sometimes a plain write to its key lands between
        its read and its commit, which must then fail with ``TransactionConflict`` and apply
        nothing (one thread: no other conflict is possible)."""
        db = self.writer()
        key = self.rng.choice(KEYS)
        try:
            txn = db.begin(self.rng.choice(["snapshot", "serializable"]))
            current = txn.get(key)
        except TransactionConflict as exc:
            raise Violation(f"a transaction's read conflicted with nothing: {exc}") from exc
        except SlatepyError:
            self.report.failed["transaction"] += 1
            return
        self.model.check(key, current, "transaction")
        value = self._value(key)
        txn.put(key, value)
        raced = self.rng.random() < 0.3
        if raced:
            self._write([(key, self._value(key))], durable=True)
            if self.db is not db:  # the racing write failed and the writer was dropped
                return
        assert self.model.log is not None
        self.model.log.issue(key, value)
        try:
            txn.commit()
        except TransactionConflict:
            if not raced:
                raise Violation(f"a transaction on {key!r} conflicted with nothing") from None
            return
        except SlatepyError:
            self.report.failed["transaction"] += 1
            self.model.written(key, value, logged=False)  # a failed durable write: unknown
            self.crash()
            return
        if raced:
            raise Violation(f"a transaction on {key!r} committed over a newer write")
        self._acknowledge_pending()
        self.model.acknowledged(key, value)
        self.report.acknowledged_writes += 1

    def op_snapshot(self) -> None:
        """Take a snapshot and remember what it showed; release an old one now and then."""
        if self.snapshots and (len(self.snapshots) > 3 or self.rng.random() < 0.3):
            snap, _ = self.snapshots.pop(self.rng.randrange(len(self.snapshots)))
            try:
                snap.close()
            except SlatepyError:
                self.report.failed["snapshot release"] += 1
        try:
            snap = self.writer().snapshot()
        except SlatepyError:
            self.report.failed["snapshot"] += 1
            return
        try:
            rows = list(snap.scan())
        except SlatepyError:
            self.report.failed["snapshot read"] += 1
            snap._pin = None  # the pin expires on its own (faults would fail its release)
            snap.close()
            return
        self._check_view(dict(rows), "snapshot")
        self.snapshots.append((snap, rows))

    def op_snapshot_read(self) -> None:
        """A held snapshot reads what it read when taken, whatever was written, compacted
        and collected since (GC runs with ``min_age=0`` here)."""
        if not self.snapshots:
            return
        snap, rows = self.rng.choice(self.snapshots)
        try:
            now = list(snap.scan(reverse=True))
            key = self.rng.choice(KEYS + BATCH_KEYS)
            value = snap.get(key)
        except CorruptionError as exc:
            raise Violation(f"a snapshot lost data it pinned: {exc}") from exc
        except SlatepyError:
            self.report.failed["snapshot read"] += 1
            return
        if now != rows[::-1] or value != dict(rows).get(key):
            raise Violation(f"a snapshot changed: {rows} then {now[::-1]}")

    def release_snapshots(self) -> None:
        for snap, _ in self.snapshots:
            try:
                snap.close()
            except SlatepyError:
                self.report.failed["snapshot release"] += 1
        self.snapshots.clear()

    # -- checkpoints -------------------------------------------------------------------
    def _frozen_merged(self) -> dict[bytes, set[bytes | None]]:
        return {k: set(v) for k, v in self.merged.items()}

    def op_checkpoint(self) -> None:
        """Make a checkpoint and remember the model as it is now: by the writer (it flushes
        first, so every write so far is in it) or by the module function (what is durable
        now: unflushed writes may or may not be, as the model's unknown values say)."""
        if len(self.checkpoints) >= MAX_CHECKPOINTS:
            return
        lifetime = self.rng.choice(CHECKPOINT_LIFETIMES)
        by_writer = self.rng.random() < 0.6
        try:
            if by_writer:
                made = self.writer().create_checkpoint(lifetime=lifetime, name="torture")
            else:
                made = checkpoints.create_checkpoint(
                    self.faulty, self.settings, lifetime=lifetime, name="torture"
                )
        except SlatepyError:
            self.report.failed["checkpoint"] += 1
            if by_writer:
                self.crash()  # its flush may have failed: a writer then refuses all writes
            return
        if by_writer:
            self._acknowledge_pending()
        expires = None if made.expire_time is None else made.expire_time.timestamp()
        self.checkpoints.append(
            HeldCheckpoint(made.id, self.model.frozen(), self._frozen_merged(), expires)
        )

    def op_checkpoint_read(self) -> None:
        """A checkpoint reads the model frozen when it was made, whatever was written,
        compacted and collected since; a deleted one is ``NotFound``."""
        if self.deleted_checkpoints and self.rng.random() < 0.2:
            self._read_deleted_checkpoint(self.rng.choice(self.deleted_checkpoints))
        elif self.checkpoints:
            self._read_checkpoint(self.rng.choice(self.checkpoints))

    def _read_checkpoint(self, held: HeldCheckpoint) -> None:
        who = f"checkpoint {held.id}"
        try:
            with DbReader.open(
                self.faulty,
                settings=self.settings,
                checkpoint=held.id,
                clock=self.clock,
                merge_operator=concat,
            ) as reader:
                rows = dict(reader.scan())
                key = self.rng.choice(KEYS + BATCH_KEYS + MERGE_KEYS)
                value = reader.get(key)
        except NotFound as exc:
            if held.may_be_gone():
                self.report.checks["checkpoint gone"] += 1
                return
            raise Violation(f"{who} is live but reads as gone: {exc}") from exc
        except CorruptionError as exc:
            raise Violation(f"{who} lost data it holds: {exc}") from exc
        except SlatepyError:
            self.report.failed["checkpoint read"] += 1
            return
        if value != rows.get(key):
            raise Violation(f"{who}: get({key!r}) = {value!r}, its scan {rows.get(key)!r}")
        self._check_view(rows, who, held.model, held.merged)
        self.report.checks["checkpoint read"] += 1

    def _read_deleted_checkpoint(self, checkpoint_id: str) -> None:
        try:
            with DbReader.open(
                self.faulty, settings=self.settings, checkpoint=checkpoint_id, clock=self.clock
            ) as reader:
                rows = list(reader.scan())
        except NotFound:
            self.report.checks["deleted checkpoint"] += 1
            return
        except SlatepyError:
            self.report.failed["checkpoint read"] += 1
            return
        raise Violation(f"deleted checkpoint {checkpoint_id} still reads: {rows!r}")

    def op_checkpoint_drop(self) -> None:
        """Delete a checkpoint (the next collections may take what only it held: nothing
        live may go with it), or now and then refresh one."""
        if not self.checkpoints:
            return
        held = self.rng.choice(self.checkpoints)
        if self.rng.random() < 0.3:
            lifetime = self.rng.choice([None, 3600.0])
            try:
                made = checkpoints.refresh_checkpoint(self.faulty, self.settings, held.id, lifetime)
            except NotFound as exc:
                if not held.may_be_gone():
                    raise Violation(f"refreshing live checkpoint {held.id}: {exc}") from exc
                self.checkpoints.remove(held)
                return
            except SlatepyError:
                self.report.failed["checkpoint refresh"] += 1  # the earliest expiry stands
                return
            held.maybe_gone = False  # it was there to refresh
            held.expires = None if made.expire_time is None else made.expire_time.timestamp()
            return
        try:
            checkpoints.delete_checkpoint(self.faulty, self.settings, held.id)
        except NotFound as exc:
            if not held.may_be_gone():
                raise Violation(f"deleting live checkpoint {held.id}: {exc}") from exc
        except SlatepyError:
            self.report.failed["checkpoint delete"] += 1
            held.maybe_gone = True  # a lost reply: deleted, or not
            return
        self.checkpoints.remove(held)
        self.deleted_checkpoints.append(held.id)

    # -- clones ------------------------------------------------------------------------
    def op_clone(self) -> None:
        """Clone the database (now, or one of its checkpoints) into a new location, write
        to the clone, and check it reads the source's frozen model plus its own writes while
        the source still reads its own model."""
        if self.clone_root is None or len(self.clones) >= MAX_CLONES:
            return
        self.writer()  # a database to clone
        source = self.rng.choice([None, *self.checkpoints])
        location = open_store(
            f"{self.clone_root.rstrip('/')}/clone-{uuid.uuid4().hex[:12]}",
            self.store_settings,
            create=True,
        )
        dst = FaultyStore(location, uniform(self.fault_rate), seed=self.rng.randrange(2**32))
        if source is None:
            model, merged = self.model.frozen(), self._frozen_merged()
        else:
            model = source.model.frozen()
            merged = {k: set(v) for k, v in source.merged.items()}
        try:
            clone(
                self.faulty,
                dst,
                checkpoint=None if source is None else source.id,
                settings=self.settings,
            )
        except NotFound as exc:
            if source is not None and source.may_be_gone():
                return
            raise Violation(f"clone of a live database or checkpoint: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone"] += 1
            self._check_failed_clone(dst)
            return
        held = HeldClone(dst, model, merged)
        self.clones.append(held)
        self._use_clone(held, writes=self.rng.randint(1, 4))
        self.op_scan()  # the source reads its own model still

    def _check_failed_clone(self, dst: FaultyStore) -> None:
        """A clone that raised left no database, or one whose checkpoint still holds what
        it shares (never a database that breaks when the source collects)."""
        self.faulty.enabled = dst.enabled = False
        try:
            stored = ManifestStore(dst).load()
            if stored is None:
                return
            live = {c.id for c in checkpoints.list_checkpoints(self.faulty, self.settings)}
            for external in stored.manifest.external_dbs:
                if external.checkpoint_id not in live:
                    raise Violation(
                        f"a clone that raised left a database at {dst.url} whose checkpoint "
                        f"{external.checkpoint_id} in the source is gone"
                    )
            self.report.checks["failed clone left a usable database"] += 1
        finally:
            self.faulty.enabled = dst.enabled = True

    def _use_clone(self, held: HeldClone, *, writes: int) -> None:
        """Open the clone's writer, make ``writes`` durable puts and deletes, read it whole."""
        try:
            db = Db.open(
                held.store, settings=self.settings, clock=self.clock, merge_operator=concat
            )
        except SlatepyError:
            self.report.failed["clone open"] += 1
            return
        try:
            for _ in range(writes):
                key = self.rng.choice(KEYS)
                value = self._value(key) if self.rng.random() < 0.8 else None
                held.model.written(key, value)
                if value is None:
                    db.delete(key)
                else:
                    db.put(key, value)
                held.model.acknowledged(key, value)
            rows = dict(db.scan())
        except CorruptionError as exc:
            db._crash()
            raise Violation(f"clone {held.store.url}: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone write"] += 1
            db._crash()
            return
        try:
            db.close()
        except SlatepyError:
            self.report.failed["clone close"] += 1
        self._check_view(rows, f"clone {held.store.url}", held.model, held.merged)
        self.report.checks["clone read"] += 1

    def op_clone_read(self) -> None:
        """Compact and collect a clone, or write to it, then read it with a fresh reader:
        its model still holds after the source's compactions and collections."""
        if not self.clones:
            return
        held = self.rng.choice(self.clones)
        roll = self.rng.random()
        if roll < 0.3:
            self._compact_and_collect(held.store)
        elif roll < 0.6:
            self._use_clone(held, writes=self.rng.randint(1, 3))
        self._read_clone(held)

    def _read_clone(self, held: HeldClone) -> None:
        who = f"clone reader {held.store.url}"
        try:
            with DbReader.open(
                held.store, settings=self.settings, clock=self.clock, merge_operator=concat
            ) as reader:
                rows = dict(reader.scan())
        except (CorruptionError, NotFound) as exc:
            raise Violation(f"{who}: {exc}") from exc
        except SlatepyError:
            self.report.failed["clone read"] += 1
            return
        self._check_view(rows, who, held.model, held.merged)
        self.report.checks["clone read"] += 1

    def _compact_and_collect(self, store: FaultyStore) -> None:
        self._compact(with_external(store, self.settings))
        self._collect(store)

    # -- change feed -------------------------------------------------------------------
    def op_cdc(self) -> None:
        """Read the WAL's change feed from the oldest write it holds, or from a seq noted
        earlier, and check it against the log of writes issued."""
        self.writer()  # a database to read
        mark = (
            self.rng.choice(self.cdc_marks) if self.cdc_marks and self.rng.random() < 0.6 else None
        )
        issued = self.counter
        try:
            feed = WalReader(self.faulty, settings=self.settings)
            records = list(feed.iter("oldest" if mark is None else mark[0] + 1))
            last = feed.last_seq()
        except WalHistoryGone as exc:
            if mark is None:
                raise Violation(f"the feed from its oldest write: {exc}") from exc
            self.report.checks["cdc history gone"] += 1
            return
        except (CorruptionError, NotFound) as exc:
            raise Violation(f"the change feed: {exc}") from exc
        except SlatepyError:
            self.report.failed["cdc"] += 1
            return
        self._check_feed(records, None if mark is None else mark)
        if len(self.cdc_marks) >= 8:
            self.cdc_marks.pop(self.rng.randrange(len(self.cdc_marks)))
        self.cdc_marks.append((last, issued))
        self.report.checks["cdc"] += 1

    def _check_feed(self, records: list[WalRecord], mark: tuple[int, int] | None) -> None:
        log = self.model.log
        assert log is not None
        seen: set[bytes] = set()
        ranges: set[tuple[bytes, bytes]] = set()
        last: tuple[int, int, bytes, bytes] | None = None
        last_counter: tuple[int, int] | None = None
        first_counter: int | None = None
        for record in records:
            where = f"change feed record {record}"
            if mark is not None and record.seq <= mark[0]:
                raise Violation(f"{where}: before the start, seq {mark[0] + 1}")
            # A seq's range deletes apply before its point writes (Memtable.apply).
            order = (record.seq, record.kind != "delete_range", record.key, record.end or b"")
            if last is not None and order <= last:
                raise Violation(f"{where}: out of (seq, range deletes first, key) order")
            last = order
            if record.kind == "delete_range":
                assert record.end is not None
                if (record.key, record.end) not in log.ranges or record.value is not None:
                    raise Violation(f"{where}: no such range delete was issued")
                ranges.add((record.key, record.end))
                continue
            if (record.kind == "delete") != (record.value is None) or (
                (record.kind == "merge") != (record.key in MERGE_KEYS)
            ):
                raise Violation(f"{where}: not the kind of write issued to {record.key!r}")
            values = feed_values(record)
            for value in values:
                if value not in log.values.get(record.key, set()):
                    raise Violation(f"{where}: {record.key!r} = {value!r} was never written")
            expires = self.model.expires.get(record.value) if record.value is not None else None
            if record.expire_at_ms != (None if expires is None else round(expires * 1000)):
                raise Violation(f"{where}: written to expire at {expires} s")
            counters = [c for c in map(counter_or_operand, values) if c is not None]
            if not counters:
                continue
            counter = max(counters)
            if first_counter is None:
                first_counter = counter
            if last_counter is not None:
                seq, previous = last_counter
                if (counter != previous) if record.seq == seq else (counter <= previous):
                    raise Violation(
                        f"{where}: written as write {counter}, after write {previous} at "
                        f"seq {seq}: the feed is not in the order the writes were made"
                    )
            last_counter = (record.seq, counter)
            seen.update(v for v in values if v is not None)
        after = mark[1] if mark is not None else first_counter
        if after is None:
            return  # nothing with a counter left in the WAL: it was all collected
        start = "the oldest write" if mark is None else mark[0] + 1
        missing = {v: k for v, k in log.required(after).items() if v not in seen}
        if missing:
            raise Violation(
                f"the change feed from {start} lacks acknowledged writes {sorted(missing)!r}"
            )
        lost = {(a, b) for a, b, issued in log.awaited_ranges if issued > after} - ranges
        if lost:
            raise Violation(f"the change feed from {start} lacks awaited range deletes {lost!r}")
        self.report.checks["cdc range deletes"] += len(ranges)

    def op_compact(self) -> None:
        self._compact(self.faulty)

    def op_gc(self) -> None:
        self._collect(self.faulty)

    def _compact(self, store: ObjectStore) -> None:
        try:
            Compactor(
                store,
                settings=self.settings,
                policy=POLICY,
                expiry_clock=self.clock,
                merge_operator=concat,
            ).run_until_idle(max_rounds=8)
        except FencedError:
            pass  # the previous compactor object lost its epoch to this one: expected
        except SlatepyError:
            self.report.failed["compact"] += 1

    def _collect(self, store: ObjectStore) -> None:
        try:
            GarbageCollector(store, settings=self.settings, min_age=0).collect()
        except SlatepyError:
            self.report.failed["gc"] += 1

    def op_crash(self) -> None:
        self.crash()

    def op_reopen(self) -> None:
        self.close_writer()

    WEIGHTS: tuple[tuple[str, int], ...] = (
        ("put", 30),
        ("delete", 8),
        ("put_ttl", 6),
        ("delete_range", 3),
        ("merge", 8),
        ("tick", 4),
        ("batch", 10),
        ("flush", 6),
        ("get", 15),
        ("scan", 5),
        ("reader", 8),
        ("compact", 5),
        ("gc", 3),
        ("crash", 2),
        ("reopen", 2),
        ("iterate", 3),
        ("transaction", 4),
        ("snapshot", 2),
        ("snapshot_read", 3),
        ("checkpoint", 2),
        ("checkpoint_read", 2),
        ("checkpoint_drop", 1),
        ("clone", 1),
        ("clone_read", 1),
        ("cdc", 2),
        ("ingest", 2),
        ("range_batch", 2),
    )

    def step(self) -> None:
        names, weights = zip(*self.WEIGHTS, strict=True)
        name = self.rng.choices(names, weights)[0]
        self.report.operations[name] += 1
        getattr(self, f"op_{name}")()

    def progress_line(self, elapsed: float, seconds: float | None) -> str:
        """How far the run is: time, operations, acknowledged writes, crashes, faults."""
        of = f" of {seconds:g}" if seconds is not None else ""
        return (
            f"{elapsed:.0f}{of} s: {sum(self.report.operations.values())} operations, "
            f"{self.report.acknowledged_writes} acknowledged writes, "
            f"{self.report.crashes} crashes, {sum(self.faulty.counts.values())} faults "
            f"injected, {sum(self.report.failed.values())} failures surfaced"
        )

    # -- verification ------------------------------------------------------------------
    def verify(self) -> None:
        """With faults off: every checkpoint and clone reads its model and the change feed
        holds what it must; then, with every checkpoint deleted and the database compacted
        and collected, a crash, then a fresh writer and a fresh reader must agree with the
        model and the clones still read theirs. Counts acknowledged writes that are gone."""
        self.faulty.enabled = False
        for held_clone in self.clones:
            held_clone.store.enabled = False
        try:
            self.release_snapshots()
            for held in list(self.checkpoints):
                self._read_checkpoint(held)
            for held_clone in self.clones:
                self._read_clone(held_clone)
            self.op_cdc()
            for held in self.checkpoints:
                try:
                    checkpoints.delete_checkpoint(self.faulty, self.settings, held.id)
                except NotFound:
                    if not held.may_be_gone():
                        raise
            self.checkpoints.clear()
            self.op_compact()
            self.op_gc()
            self.op_gc()  # the second pass collects what the first one's manifest let go
            self.crash()
            if self.reader is not None:
                self.reader.close()
                self.reader = None
            db = self.writer()
            rows = dict(db.scan())
            for key in self.model.acked:
                if rows.get(key) not in self.model.allowed(key):
                    self.report.lost_acknowledged_writes += 1
            self._check_view(rows, "fresh writer")
            with DbReader.open(
                self.faulty, settings=self.settings, clock=self.clock, merge_operator=concat
            ) as reader:
                self._check_view(dict(reader.scan()), "fresh reader")
            for held_clone in self.clones:
                self._read_clone(held_clone)
        finally:
            self.faulty.enabled = True
            for held_clone in self.clones:
                held_clone.store.enabled = True

    def run(
        self,
        *,
        steps: int | None = None,
        seconds: float | None = None,
        progress: Callable[[str], None] | None = None,
        progress_interval: float = PROGRESS_INTERVAL,
    ) -> Report:
        """Run ``steps`` operations or for ``seconds``, then verify with faults off.

        Args:
            progress: Called with a line about the run so far every ``progress_interval``
                seconds, and once before the final verification (a soak of minutes should
                show it is alive and how it is going).

        Raises:
            Violation: the database returned something the model says it must not.
        """
        started = time.monotonic()
        deadline = started + seconds if seconds is not None else None
        next_progress = started + progress_interval
        done = 0
        while (steps is None or done < steps) and (deadline is None or time.monotonic() < deadline):
            self.step()
            done += 1
            if progress is not None and time.monotonic() >= next_progress:
                next_progress = time.monotonic() + progress_interval
                progress(self.progress_line(time.monotonic() - started, seconds))
        if progress is not None:
            progress(self.progress_line(time.monotonic() - started, seconds) + "; verifying")
        self.verify()
        self.close_writer()
        self.report.faults = Counter(self.faulty.counts)
        for held_clone in self.clones:
            self.report.faults.update(held_clone.store.counts)
        return self.report
