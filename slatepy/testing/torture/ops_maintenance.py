"""The torture workload's change feed check, compaction, GC, crashes and reopens."""

from __future__ import annotations

from slatepy.engine.wal_reader import WalHistoryGone, WalReader, WalRecord
from slatepy.errors import (
    CorruptionError,
    NotFound,
    SlatepyError,
)
from slatepy.testing.torture.base import TortureBase
from slatepy.testing.torture.model import (
    MERGE_KEYS,
    Violation,
    counter_or_operand,
    feed_values,
)


class MaintenanceOps(TortureBase):
    """The change feed (``WalReader``), compaction, GC, crashes and clean reopens."""

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

    def op_crash(self) -> None:
        self.crash()

    def op_reopen(self) -> None:
        self.close_writer()
