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
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader
from slatepy.engine.snapshot import Snapshot
from slatepy.errors import CorruptionError, FencedError, SlatepyError, TransactionConflict
from slatepy.gc import GarbageCollector
from slatepy.store.base import ObjectStore
from slatepy.testing.faults import FaultyStore, uniform

KEYS = [b"key%02d" % i for i in range(16)]
BATCH_KEYS = [b"batch:%d" % i for i in range(4)]
MERGE_KEYS = [b"merge%d" % i for i in range(3)]
"""Keys only merged into (and range-deleted); they sort after ``KEYS``."""
POLICY = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=8, target_sst_bytes=4096)
OPEN_ATTEMPTS = 50
PROGRESS_INTERVAL = 5.0
"""Seconds between two progress lines of a timed run."""


class Violation(AssertionError):
    """The database returned something the model says it must not."""


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    """The workload's merge operator: operands joined by commas after the existing value."""
    return b",".join(([] if existing is None else [existing]) + operands)


def counter_of(value: bytes | None) -> int | None:
    return None if value is None else int(value.rsplit(b"=", 1)[1])


@dataclass
class Model:
    """Per key: the last acknowledged value (None = absent) and the unacknowledged ones."""

    acked: dict[bytes, bytes | None] = field(default_factory=dict)
    unknown: dict[bytes, list[bytes | None]] = field(default_factory=dict)
    expires: dict[bytes, float] = field(default_factory=dict)
    """TTL'd values (each value is unique) and when they expire."""
    now: float = 0.0
    """The workload's clock, seconds."""

    def written(self, key: bytes, value: bytes | None) -> None:
        """A write was issued; until acknowledged its fate is unknown."""
        self.unknown.setdefault(key, []).append(value)

    def acknowledged(self, key: bytes, value: bytes | None) -> None:
        self.acked[key] = value
        self.unknown.pop(key, None)

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
class Report:
    operations: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    crashes: int = 0
    acknowledged_writes: int = 0
    lost_acknowledged_writes: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        return [
            f"operations: {sum(self.operations.values())} "
            + " ".join(f"{k}={v}" for k, v in sorted(self.operations.items())),
            "failed (store faults surfaced to the caller): "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.failed.items())) or "none"),
            "faults injected: "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"),
            f"writer crashes: {self.crashes}",
            f"acknowledged writes: {self.acknowledged_writes}, "
            f"lost acknowledged writes: {self.lost_acknowledged_writes}",
        ]


class Torture:
    """The workload over ``store`` (faults are added here) with ``seed``."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        seed: int,
        fault_rate: float = 0.03,
        settings: Settings | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.faulty = FaultyStore(store, uniform(fault_rate), seed=seed)
        base = settings or Settings()
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
        self.model = Model(now=float(int(time.time())))
        self.report = Report()
        self.counter = 0
        self.pending: list[tuple[bytes, bytes | None]] = []  # unawaited, not yet flushed
        self.reader_seen: dict[bytes, int] = {}
        self.merged: dict[bytes, set[bytes | None]] = {k: {None} for k in MERGE_KEYS}
        """What each merge key may hold."""
        self.db: Db | None = None
        self.reader: DbReader | None = None
        self.snapshots: list[tuple[Snapshot, list[tuple[bytes, bytes]]]] = []

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
        return b"%s=%d" % (key, self.counter)

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
    ) -> None:
        """Write ``ops`` (as the model sees them): a put (with ``ttl``), a delete, a batch of
        puts, or a ``delete_range`` (``ops`` then deletes every model key in the range)."""
        db = self.writer()
        for key, value in ops:
            self.model.written(key, value)
            if ttl is not None and value is not None:
                self.model.expires[value] = self.model.now + ttl
        try:
            if deleted_range is not None:
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
            return
        if durable:
            # Earlier unawaited writes are in this SST or an earlier one (one PUT in flight).
            self._acknowledge_pending()
            for key, value in ops:
                self.model.acknowledged(key, value)
            self.report.acknowledged_writes += len(ops)
        else:
            self.pending += ops

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
        if ops:
            self._write(ops, durable=durable, deleted_range=(start, end))
            return
        try:
            self.writer().delete_range(start, end, await_durable=durable)
        except SlatepyError:
            self.report.failed["write"] += 1
            self.crash()

    def op_merge(self) -> None:
        """A durable merge into a merge key: on success the key holds every value it may
        have held with the operand added; on failure that or what it was."""
        key = self.rng.choice(MERGE_KEYS)
        self.counter += 1
        operand = b"%d" % self.counter
        before = self.merged[key]
        after: set[bytes | None] = {concat(key, value, [operand]) for value in before}
        try:
            self.writer().merge(key, operand)
        except SlatepyError:
            self.report.failed["write"] += 1
            self.merged[key] = before | after
            self.crash()
            return
        self.merged[key] = after

    def op_tick(self) -> None:
        """One second passes on the workload's clock (TTL'd values expire)."""
        self.model.now += 1

    def op_batch(self) -> None:
        self.counter += 1
        self._write(
            [(k, b"%s=%d" % (k, self.counter)) for k in BATCH_KEYS],
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

    def _check_merged(self, key: bytes, value: bytes | None, who: str) -> None:
        if value not in self.merged[key]:
            raise Violation(f"{who} read {key!r} = {value!r}; it may hold {self.merged[key]!r}")

    def op_scan(self) -> None:
        try:
            rows = dict(self.writer().scan())
        except SlatepyError:
            self.report.failed["scan"] += 1
            return
        self._check_view(rows, "writer scan")

    def _check_view(self, rows: dict[bytes, bytes], who: str) -> None:
        for key in KEYS + BATCH_KEYS:
            self.model.check(key, rows.get(key), who)
        for key in MERGE_KEYS:
            self._check_merged(key, rows.get(key), who)
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
        try:
            txn.commit()
        except TransactionConflict:
            if not raced:
                raise Violation(f"a transaction on {key!r} conflicted with nothing") from None
            return
        except SlatepyError:
            self.report.failed["transaction"] += 1
            self.model.written(key, value)  # a failed durable write: its fate is unknown
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

    def op_compact(self) -> None:
        try:
            Compactor(
                self.faulty,
                settings=self.settings,
                policy=POLICY,
                expiry_clock=self.clock,
                merge_operator=concat,
            ).run_until_idle(max_rounds=8)
        except FencedError:
            pass  # the previous compactor object lost its epoch to this one: expected
        except SlatepyError:
            self.report.failed["compact"] += 1

    def op_gc(self) -> None:
        try:
            GarbageCollector(self.faulty, settings=self.settings, min_age=0).collect()
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
        """With faults off: a crash, then a fresh writer and a fresh reader must agree with the
        model; counts acknowledged writes that are gone."""
        self.faulty.enabled = False
        try:
            self.release_snapshots()
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
        finally:
            self.faulty.enabled = True

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
        return self.report
