"""``Db``'s writes: puts, deletes, merges, range deletes and batches, one atomic WAL
generation each, with back-pressure while the memtable is over its budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter

from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE
from slatepy.engine.batch import (
    PutColumns,
    WriteBatch,
    check_delete_range,
    check_key,
    check_ttl,
    check_value,
    expiring,
)
from slatepy.engine.db_state import DbState
from slatepy.engine.locks import acquire
from slatepy.engine.memtable import Version
from slatepy.errors import (
    InvalidArgument,
)
from slatepy.format.block import Entry
from slatepy.format.kinds import Operands, RangeTombstone
from slatepy.table.priority import FOREGROUND
from slatepy.table.visibility import now_ms

_KEY, _VALUE = itemgetter(0), itemgetter(1)
_TOMBSTONE = type(None)

SEQ_STEP = 2
"""Writers assign even seqs only (an ingestion takes the odd one between, RFC 0016)."""


class Writes(DbState):
    """The write half of :class:`~slatepy.engine.db.Db` (see there)."""

    def put(
        self,
        key: bytes,
        value: bytes,
        *,
        await_durable: bool = True,
        ttl: float | None = None,
    ) -> None:
        """Set ``key`` to ``value``; with ``await_durable`` return only once it is in the WAL.

        With ``ttl`` (seconds; else ``Settings.default_ttl``) the value reads as absent once
        that much time has passed on the database's clock, and compaction drops it
        (RFC 0019).
        """
        # check_key/check_value's fast paths inlined: the single put is the hottest call.
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_SIZE:
            key = check_key(key)
        if type(value) is not bytes or len(value) > MAX_VALUE_SIZE:
            value = check_value(value)
        ttl = self._settings.default_ttl if ttl is None else check_ttl(ttl)
        if ttl is not None:
            value = expiring(value, ttl, now_ms(self._clock))
        self._apply_one(key, value, await_durable)

    def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        """Remove ``key`` (a tombstone until compaction drops it)."""
        self._apply_one(check_key(key), None, await_durable)

    def merge(self, key: bytes, operand: bytes, *, await_durable: bool = True) -> None:
        """Add ``operand`` to ``key``: reads see the merge operator's result of every operand
        written since the key's last put or delete, over that value (RFC 0019).

        Raises:
            InvalidArgument: no merge operator was given to :meth:`open`.
        """
        key, operand = check_key(key), check_value(operand)
        if self._merging.operator is None:
            raise InvalidArgument(
                "merge() needs a merge operator: open the database with "
                "Db.open(url, merge_operator=fn), fn(key, existing, operands) -> bytes"
            )
        self._apply([(key, Operands.of([operand]))], await_durable)

    def delete_range(self, start: bytes, end: bytes, *, await_durable: bool = True) -> None:
        """Remove every key ``start <= key < end`` (a range tombstone until compaction at the
        bottom level drops it with what it covers; RFC 0019).

        Raises:
            InvalidArgument: ``start >= end``, or a bound is not a valid key.
        """
        self._apply([], await_durable, check_delete_range(start, end))

    def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        """Apply a batch atomically: after a crash either all of it is there or none."""
        if not isinstance(batch, WriteBatch):
            raise InvalidArgument(f"write() takes a WriteBatch, got {type(batch).__name__}")
        if len(batch):
            written_ms, default_ttl = now_ms(self._clock), self._settings.default_ttl
            # Puts alone (the common batch) go as columns: no merges to look for, no ops to
            # split again (see _append_puts).
            puts = batch.puts_at(written_ms, default_ttl)
            if puts is not None:
                self._apply(puts, await_durable)
                return
            if batch.has_merges and self._merging.operator is None:
                raise InvalidArgument(
                    "the batch merges, which needs a merge operator: open the database with "
                    "Db.open(url, merge_operator=fn)"
                )
            ops = batch.ops_at(written_ms, default_ttl)
            self._apply(ops, await_durable, *batch.ranges)

    def _apply(
        self,
        ops: Sequence[tuple[bytes, bytes | None]],
        await_durable: bool,
        *ranges: tuple[bytes, bytes],
        check: Callable[[], None] | None = None,
    ) -> None:
        """Write ``ops`` and the range deletes ``ranges`` as one atomic batch; ``check`` (a
        transaction's validation) runs under the writer's lock just before, so no write lands
        between it and the batch."""
        self._backpressure()
        acquire(self._lock)  # not ``with``: see slatepy.engine.locks
        try:
            self._check_open()
            self._wal.check()
            if check is not None:
                check()
            self._seq += SEQ_STEP
            seq = self._seq
            generation = None
            if not ranges and len(ops) > 1:
                generation = self._append_puts(ops, seq, await_durable)
            if generation is None:
                entries: list[Entry] = [(key, seq, value) for key, value in ops]
                # Before the WAL has it: a failed lookup must fail the write whole.
                bases = self._memtable.ingested_bases(entries)
                tombstones = [RangeTombstone(start, end, seq) for start, end in ranges]
                memtable = self._memtable
                if self._merging.operator is not None and Operands in set(
                    map(type, map(_VALUE, ops))
                ):
                    # The merge operator (user code) may raise in the memtable's half: then
                    # the WAL's half is taken back, so a failed write is nowhere (RFC 0026).
                    generation = self._wal.append_applied(
                        entries,
                        awaited=await_durable,
                        ranges=tombstones,
                        apply=lambda: memtable.apply(entries, tombstones, bases),
                    )
                else:
                    # One WAL generation holds the whole batch, so it lands in one SST.
                    generation = self._wal.append(entries, awaited=await_durable, ranges=tombstones)
                    memtable.apply(entries, tombstones, bases)
            # Once made (a write that failed conflicts with nothing), still under the lock
            # and after the seq was taken, as ``Db.begin`` without the lock relies on.
            if self._txns.open:
                self._txns.record(ops, seq)
                if ranges:
                    self._txns.record_ranges(ranges, seq)
        finally:
            self._lock.release()
        if await_durable:
            with FOREGROUND:  # background compaction yields the GIL meanwhile
                self._wal.flush(generation, only_this=True)

    def _append_puts(
        self, ops: Sequence[tuple[bytes, bytes | None]], seq: int, await_durable: bool
    ) -> int | None:
        """Add a batch to the WAL buffer and the memtable if it holds only puts (no deletes
        or merges): one dict of versions updates both at C speed, the last op on a key
        winning as entry by entry. Returns the WAL generation, or None (not only puts:
        nothing done). Called under the writer's lock."""
        if isinstance(ops, PutColumns):  # puts alone, split already (WriteBatch.puts_at)
            keys, values = ops.keys, ops.values
        else:
            values = list(map(_VALUE, ops))
            kinds = set(map(type, values))
            if _TOMBSTONE in kinds or Operands in kinds:
                return None
            keys = list(map(_KEY, ops))
        versions: dict[bytes, Version] = dict(
            zip(keys, zip(repeat(seq), values))  # noqa: B905 (repeat is endless)
        )
        payload = sum(map(len, keys)) + sum(map(len, values))
        generation = self._wal.append_versions(versions, len(keys), payload, awaited=await_durable)
        # Without a key written twice, the versions hold every key and value: their payload.
        self._memtable.apply_versions(versions, payload if len(versions) == len(keys) else None)
        return generation

    def _apply_one(self, key: bytes, value: bytes | None, await_durable: bool) -> None:
        """:meth:`_apply` of one put or delete (not a merge, not in a transaction's commit),
        without building a batch: the path of every single write, whose one version tuple
        goes to both the WAL buffer and the memtable."""
        compactor, memtable = self._compactor, self._memtable
        # _backpressure's conditions, tested here first: most writes have nothing to do.
        if (compactor is not None and compactor.backoff.idle) or (
            memtable.size_bytes >= self._wake_bytes
        ):
            self._backpressure()
        lock = self._lock
        if not lock.acquire(False):  # acquire()'s first try, inlined: this path is hot
            acquire(lock)
        try:
            if self._closed:
                self._check_open()
            seq = self._seq + SEQ_STEP
            version = (seq, value)
            # Before anything changes: raises the WAL's fatal error, as _apply's check does.
            generation = self._wal.append_version(key, version, await_durable)
            self._seq = seq
            if self._txns.open:
                self._txns.record(((key, value),), seq)
            memtable.put_version(key, version)
        finally:
            lock.release()
        if await_durable:
            with FOREGROUND:  # background compaction yields the GIL meanwhile
                self._wal.flush(generation, only_this=True)

    def _backpressure(self) -> None:
        """Before a write: keep the compactor busy while writes come, and wait while the
        memtable holds ``max_unflushed_bytes`` or more."""
        unflushed = self._memtable.size_bytes
        compactor = self._compactor
        if compactor is not None:
            if compactor.backoff.idle:  # writes again after an idle spell: compact soon
                compactor.note_activity()
            if unflushed >= self._wake_bytes:
                # Half the budget left by kept versions used: compact now rather than at the
                # next interval, so writes seldom reach the bound and wait (the compactor
                # wakes at most once per flush_interval, when WAL SSTs it can compact may
                # exist).
                compactor.wake(min_interval=self._settings.flush_interval)
        if unflushed >= self._settings.max_unflushed_bytes:
            self._wait_for_compaction()
