"""The torture workload's data operations: puts, deletes, TTLs, range deletes, merges,
ingests, batches, flushes, reads, scans, readers, iterators and transactions."""

from __future__ import annotations

import threading
import time

from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.engine.reader import DbReader
from slatepy.errors import (
    SlatepyError,
    TransactionConflict,
)
from slatepy.testing.torture.base import TortureBase
from slatepy.testing.torture.model import (
    BATCH_KEYS,
    KEYS,
    MERGE_KEYS,
    PAD,
    READS_DURING_BATCH,
    Violation,
    concat,
    counter_of,
)


class DataOps(TortureBase):
    """The operations on the data, each checked against the model."""

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

    def op_scan(self) -> None:
        try:
            rows = dict(self.writer().scan())
        except SlatepyError:
            self.report.failed["scan"] += 1
            return
        self._check_view(rows, "writer scan")

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
