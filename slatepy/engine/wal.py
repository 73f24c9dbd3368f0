"""The WAL writer: buffers writes and flushes them as SSTs with group commit.

Writes are appended to the open *generation* (the buffer). Flushing seals the generation,
gives it the next WAL id and writes it as one SST under the fencing protocol. Up to
``max_parallel_writes`` sealed generations are written at once; a caller who needs
durability while all PUT slots are busy waits, and the first waiter to get a free slot seals
everything that piled up meanwhile with one PUT (group commit, no waiting for the tick).

Acknowledgement follows the seed ("Parallel Writes", option 2): a write is acknowledged as
soon as *its* SST is written, even if an earlier in-flight SST failed. Any failure is fatal
to the writer: the failed generation's writes are already visible in this process's
memtable, so carrying on would let later writes become durable while earlier ones are lost.
No generation is sealed after a failure; in-flight ones run to completion; the writes whose
own SST failed hear the failure itself, and every later write and flush raises
:meth:`WalWriter.dead_error`: the handle can no longer write, open the database again (the
first failure is its ``__cause__``, not repeated as if it were new; issue 29).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from slatepy.config import Settings
from slatepy.engine.fencing import write_wal_sst
from slatepy.errors import SlatepyError, StoreError, StoreUnavailable
from slatepy.format.block import Entry
from slatepy.format.kinds import Operands, RangeTombstone
from slatepy.format.sst import SstBuilder
from slatepy.store.numbered import NumberedObjects
from slatepy.table.merge_operator import NO_MERGING, Merging

Buffer = dict[bytes, tuple[int, bytes | None]]
Sealed = tuple[int, int, Buffer, list[RangeTombstone], int]
"""A generation closed for writing: ``(generation, wal_id, buffer, ranges, unawaited)``."""

_SEQ, _VALUE = itemgetter(0), itemgetter(1)
_PLAIN = {bytes}
"""The value classes ``SstBuilder.extend`` encodes (it writes no tombstones or kinds)."""

WAL_BLOCK_BYTES = 64 * 1024
"""Data block size of WAL SSTs (at least; ``Settings.block_size`` if larger). Nothing
point-reads a WAL SST, so a large block costs no read amplification, and building one
costs per block: a flush of 200,000 puts (16-byte keys, 100-byte values, SST version 5)
takes 0.26-0.28 s with 4 KiB blocks (6,250 of them) and 0.18 s with 64 KiB ones. The same
reasoning as persist's parts (``PART_BLOCK_BYTES``)."""


class WalWriter:
    """Owns the WAL tail of one writer epoch.

    Args:
        wal: The WAL sequence.
        epoch: This writer's epoch (its fencing SSTs are already written).
        next_id: The WAL id the next sealed generation is written to.
        settings: Flush thresholds, ``max_parallel_writes`` and retry counts.
    """

    def __init__(
        self,
        wal: NumberedObjects,
        *,
        epoch: int,
        next_id: int,
        settings: Settings,
        merging: Merging = NO_MERGING,
    ) -> None:
        self._wal = wal
        self._merging = merging
        self._epoch = epoch
        self._settings = settings
        self._flush_bytes = settings.flush_bytes
        self._next_id = next_id
        # The condition's lock, for paths that take it without waiting: ``with`` on it is
        # C-level, on the Condition a Python-level wrapper (a third of a put's WAL cost).
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._buffer: Buffer = {}
        self._ranges: list[RangeTombstone] = []  # the open generation's range tombstones
        self._buffer_bytes = 0
        self._buffer_unawaited = 0  # entries in the open generation nobody awaits
        self._generation = 0  # the open one; every lower generation is sealed
        self._in_flight: set[int] = set()
        self._reserved = 0  # write slots held by reserve() for a seal()
        self._failed: dict[int, SlatepyError] = {}
        self._error: SlatepyError | None = None
        self._dead: SlatepyError | None = None  # what later calls raise (dead_error)
        self._failed_at = 0.0
        self.on_failure: Callable[[], None] | None = None
        """Called once when the writer fails, before any caller hears of it (on the writing
        thread, under this writer's lock: it must only set a flag)."""
        self.lost_unawaited = 0  # unawaited entries in failed generations, not yet reported
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.ssts_written = 0
        self.max_seq_by_id: dict[int, int] = {}
        self._ticker = threading.Thread(target=self._tick, name="slatepy-wal-flush", daemon=True)
        self._ticker.start()

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def next_id(self) -> int:
        return self._next_id

    @property
    def error(self) -> SlatepyError | None:
        return self._error

    def check(self) -> None:
        """Raise :meth:`dead_error` if the writer has failed."""
        if self._error is not None:
            raise self.dead_error()

    def dead_error(self) -> SlatepyError:
        """The error for a call on a writer that failed: of the first failure's type (an
        ``except FencedError`` still matches), saying that the handle can no longer write
        and to open the database again, with the failure as ``__cause__`` (its message,
        say "No space left on device", may no longer be true: it is not repeated as news).
        """
        first = self._error
        assert first is not None
        if self._dead is not None:
            return self._dead
        message = (
            f"this writer of {self._wal.store.url} failed "
            f"{time.strftime('%H:%M:%S', time.localtime(self._failed_at))} and can no longer "
            "write (writes since are not durable, and its reads are refused: what it holds "
            "in memory may not be); open the database again to continue. The failure: "
            f"{first}"
        )
        dead: SlatepyError
        try:
            if isinstance(first, StoreError):
                dead = type(first)(message, path=first.path, definite=first.definite)
            else:
                dead = type(first)(message)
        except TypeError:  # an error type with other arguments: the family's base
            dead = SlatepyError(message)
        dead.__cause__ = first
        self._dead = dead
        return dead

    def append(
        self,
        entries: Iterable[Entry],
        *,
        awaited: bool,
        ranges: Sequence[RangeTombstone] = (),
    ) -> int:
        """Add entries (and range tombstones) to the open generation (atomically) and return
        that generation.

        ``awaited`` says whether the caller will flush and so hear about a failure; losing
        writes nobody awaited is counted in ``lost_unawaited``. A merge operator that raises
        leaves the generation as it was (the write fails whole; RFC 0026, stop 41).
        """
        with self._mutex:
            self.check()
            buffer, kept_ranges = self._buffer, self._ranges
            if ranges:  # first: see Memtable.apply
                self._ranges = [*kept_ranges, *ranges]
            try:
                versions = self._stacked(entries, buffer)
            except BaseException:
                self._ranges = kept_ranges
                raise
            added = sum(len(t.start) + len(t.end) + 16 for t in ranges) if ranges else 0
            for key, version in versions:
                buffer[key] = version
                added += len(key) + len(version[1] or b"") + 16
            count = len(ranges) + len(versions)
            if not awaited:
                self._buffer_unawaited += count
            self._buffer_bytes += added
            if self._buffer_bytes >= self._flush_bytes:
                self._wake.set()
            return self._generation

    def _stacked(
        self, entries: Iterable[Entry], buffer: Buffer
    ) -> list[tuple[bytes, tuple[int, bytes | None]]]:
        """The ``(key, (seq, value))`` :meth:`append` puts in the buffer for ``entries``,
        the buffer left unchanged, so that a merge operator raising changes nothing.

        One entry per key in an SST: operands stack on this generation's version of the key
        (only on it: older ones are in older SSTs; an earlier entry of the batch is one), or
        on nothing if a range tombstone of this generation deleted it since."""
        versions: list[tuple[bytes, tuple[int, bytes | None]]] = []
        own: dict[bytes, tuple[int, bytes | None]] = {}
        for key, seq, written in entries:
            value = written
            if value.__class__ is Operands:
                older = own.get(key) or buffer.get(key)
                if older is not None:
                    old_seq, old = older
                    if any(t.start <= key < t.end and t.seq > old_seq for t in self._ranges):
                        old = None
                    value = self._merging.stack(key, old, value)
            own[key] = (seq, value)
            versions.append((key, (seq, value)))
        return versions

    def append_applied(
        self,
        entries: Sequence[Entry],
        *,
        awaited: bool,
        ranges: Sequence[RangeTombstone],
        apply: Callable[[], None],
    ) -> int:
        """:meth:`append`, then ``apply`` (the memtable's half of the write) in the same hold
        of the lock, so the generation cannot be sealed in between: if ``apply`` raises (a
        merge operator's error), the append is taken back and the write is nowhere, rather
        than durable though reported failed (RFC 0026, stop 41). For writes with merge operands only
        (no other write's ``apply`` can raise)."""
        with self._mutex:
            buffer = self._buffer
            before = {key: buffer.get(key) for key, _, _ in entries}
            kept_ranges, counters = self._ranges, (self._buffer_bytes, self._buffer_unawaited)
            generation = self.append(entries, awaited=awaited, ranges=ranges)
            try:
                apply()
            except BaseException:
                for key, version in before.items():
                    if version is None:
                        buffer.pop(key, None)
                    else:
                        buffer[key] = version
                self._ranges = kept_ranges
                self._buffer_bytes, self._buffer_unawaited = counters
                raise
            return generation

    def append_version(self, key: bytes, version: tuple[int, bytes | None], awaited: bool) -> int:
        """:meth:`append` of one ``(seq, value)`` whose value is not merge operands (a put or
        a delete), the tuple the writer also puts in its memtable: a single write's path."""
        with self._mutex:
            if self._error is not None:
                raise self.dead_error()
            self._buffer[key] = version
            if not awaited:
                self._buffer_unawaited += 1
            value = version[1]
            self._buffer_bytes += len(key) + (0 if value is None else len(value)) + 16
            if self._buffer_bytes >= self._flush_bytes:
                self._wake.set()
            return self._generation

    def append_versions(self, versions: Buffer, count: int, payload: int, *, awaited: bool) -> int:
        """:meth:`append` of a batch of ``count`` entries (``versions`` holds the last per
        key) with values that are not merge operands, ``payload`` bytes of keys and values
        in all: one ``dict.update`` instead of an insertion per entry."""
        with self._mutex:
            if self._error is not None:
                raise self.dead_error()
            self._buffer.update(versions)
            if not awaited:
                self._buffer_unawaited += count
            self._buffer_bytes += payload + 16 * count
            if self._buffer_bytes >= self._flush_bytes:
                self._wake.set()
            return self._generation

    def flush(self, generation: int | None = None, *, only_this: bool = False) -> None:
        """Make ``generation`` (default: the open one) durable.

        Args:
            only_this: Wait for this generation's SST alone (a write's acknowledgement);
                by default every earlier generation must be durable too, and any failure
                so far is raised.
        """
        with self._cond:
            if generation is None:
                generation = self._generation
            while generation == self._generation and (self._buffer or self._ranges):
                self.check()
                if len(self._in_flight) + self._reserved < self._settings.max_parallel_writes:
                    sealed = self._seal()
                    break
                self._cond.wait()
            else:
                sealed = None
        if sealed is not None:
            self._write(*sealed)
        with self._cond:
            if only_this:
                self._cond.wait_for(lambda: generation not in self._in_flight)
                if generation in self._failed:
                    raise self._failed[generation]
            else:
                self._cond.wait_for(lambda: not any(g <= generation for g in self._in_flight))
                self.check()

    def settle(self) -> None:
        """Wait until every sealed generation is written or failed, then raise
        :meth:`dead_error` if the writer failed: what was sealed before is durable (a
        snapshot holds no write the database lost)."""
        with self._cond:
            sealed = self._generation - 1
            self._cond.wait_for(lambda: not any(g <= sealed for g in self._in_flight))
            self.check()

    def reserve(self) -> None:
        """Wait for a free write slot and hold it for the next :meth:`seal` (or
        :meth:`unreserve`). A seal under the writer's lock must not wait for a slot, nor
        write past ``max_parallel_writes``: fencing counts on no more PUTs than that in
        flight (``slatepy.engine.fencing``)."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._error is not None
                    or len(self._in_flight) + self._reserved < self._settings.max_parallel_writes
                )
            )
            self._reserved += 1

    def unreserve(self) -> None:
        """Give back the slot :meth:`reserve` holds, unused."""
        with self._cond:
            self._reserved -= 1
            self._cond.notify_all()

    def seal(self) -> Sealed | None:
        """Close the open generation now, whatever it holds, in the slot :meth:`reserve`
        holds, and return it for :meth:`write_sealed` (None: it holds nothing, and the slot
        is given back). Every write appended before this call is then in a lower WAL id than
        every write appended after it: the boundary a snapshot needs so a change feed from
        its seq + 1 holds exactly the writes it lacks (``Db.snapshot``). Writes no data, so
        the caller may hold the writer's lock. After a fatal error it seals nothing: no
        write can follow then, so there is no boundary to make."""
        with self._cond:
            self._reserved -= 1  # the slot passes to the sealed generation, or back
            if self._error is not None or not (self._buffer or self._ranges):
                self._cond.notify_all()
                return None
            return self._seal()

    def write_sealed(self, sealed: Sealed) -> None:
        """Write a generation :meth:`seal` closed; a failure is stored and raised to later
        writes and flushes, as the background flusher's are."""
        self._write(*sealed)

    def buffered(self) -> int:
        """Entries in the open generation (written, not yet sealed into a WAL SST)."""
        with self._cond:
            return len(self._buffer) + len(self._ranges)

    def unwritten_unawaited(self) -> int:
        """Unawaited entries that failed or can no longer be written (after a failure)."""
        with self._cond:
            pending = self._buffer_unawaited if self._error is not None else 0
            return self.lost_unawaited + pending

    def failure_reported(self) -> None:
        """The caller was told of the failure: unawaited writes so far count as reported."""
        with self._cond:
            self.lost_unawaited = 0
            if self._error is not None:
                self._buffer_unawaited = 0

    def _seal(self) -> Sealed:
        """Close the open generation and give it the next WAL id (caller holds the lock)."""
        sealed = (
            self._generation,
            self._next_id,
            self._buffer,
            self._ranges,
            self._buffer_unawaited,
        )
        self._ranges = []
        self._in_flight.add(self._generation)
        self._generation += 1
        self._next_id += 1
        self._buffer, self._buffer_bytes, self._buffer_unawaited = {}, 0, 0
        return sealed

    def _write(
        self,
        generation: int,
        wal_id: int,
        buffer: Buffer,
        ranges: list[RangeTombstone],
        unawaited: int,
    ) -> None:
        error: SlatepyError | None = None
        max_seq = 0
        try:
            # No bloom filter and large blocks: WAL SSTs are only read whole (replay,
            # readers, compaction, the change feed), never point-read.
            builder = SstBuilder(
                writer_epoch=self._epoch,
                block_size=max(self._settings.block_size, WAL_BLOCK_BYTES),
                bloom_bits_per_key=0,
                compression=self._settings.compression,
                compression_level=self._settings.compression_level,
            )
            keys = sorted(buffer)
            versions = list(map(buffer.__getitem__, keys))
            values = list(map(_VALUE, versions))
            if set(map(type, values)) <= _PLAIN:  # no tombstones or entry kinds: bulk
                builder.extend(keys, list(map(_SEQ, versions)), values)
            else:
                for key, (seq, value) in zip(keys, versions, strict=True):
                    builder.add(key, seq, value)
            for tombstone in ranges:
                builder.add_range_tombstone(tombstone)
            encoded = builder.finish()
            max_seq = encoded.meta.props.max_seq
            write_wal_sst(
                self._wal,
                wal_id,
                encoded.data,
                self._epoch,
                attempts=self._settings.wal_write_attempts,
            )
        except SlatepyError as exc:
            error = exc
        except Exception as exc:
            # Anything else (a client bug, MemoryError) must still fail this generation:
            # left in flight, every later put and close() would wait for it for ever.
            error = StoreUnavailable(
                f"writing {self._wal.path(wal_id)} failed unexpectedly: {exc!r}",
                path=self._wal.path(wal_id),
                definite=False,
            )
            error.__cause__ = exc
        with self._cond:
            self._in_flight.discard(generation)
            if error is None:
                self.ssts_written += 1
                self.max_seq_by_id[wal_id] = max_seq
            else:
                self._failed[generation] = error
                if self._error is None:
                    self._error, self._failed_at = error, time.time()
                    # Before anyone hears of the failure: no read may follow the report
                    # and still see the writes it lost.
                    if self.on_failure is not None:
                        self.on_failure()
                self.lost_unawaited += unawaited
            self._cond.notify_all()

    def _tick(self) -> None:
        interval = self._settings.flush_interval
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set() or self._error is not None:
                return
            try:
                self.flush(only_this=True)
            except SlatepyError:
                return  # stored in self._error; writers see it on their next call

    def close(self) -> None:
        """Stop the background flusher (callers flush first if they want durability)."""
        self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._ticker:
            self._ticker.join()
