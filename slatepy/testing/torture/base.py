"""The torture workload's state and lifecycle: the faulty store, the writer (opened, crashed,
closed), writes as the model sees them, whole-view checks, compaction and GC passes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import msgspec

from slatepy.compactor import Compactor
from slatepy.config import Settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader
from slatepy.engine.snapshot import Snapshot
from slatepy.errors import (
    FencedError,
    SlatepyError,
)
from slatepy.gc import GarbageCollector
from slatepy.store.base import ObjectStore
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.torture.model import (
    BATCH_KEYS,
    CODECS,
    KEYS,
    MERGE_KEYS,
    OPEN_ATTEMPTS,
    PAD,
    POLICY,
    RETAINS,
    HeldCheckpoint,
    HeldClone,
    Model,
    Report,
    Violation,
    WriteLog,
    concat,
    counter_of,
)


class TortureBase:
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
