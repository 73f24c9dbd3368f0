"""The WAL writer: buffers writes and flushes them as SSTs with group commit.

Writes are appended to the current *generation* of the buffer. A flush swaps the buffer out,
encodes it as one SST and writes it to the next WAL id under the fencing protocol. Flushes
are serialised by ``_flush_lock`` (one WAL PUT in flight, ``max_parallel_writes = 1``), and
the caller that needs durability performs the flush itself: callers arriving while a PUT is
in flight pile into the next generation and the first of them to get the lock flushes all of
them with one PUT (group commit, no waiting for the next tick).

Any failure to make a generation durable is fatal to the writer: the generation's writes are
already visible in this process's memtable, so carrying on would let later writes become
durable while earlier acknowledged-in-memory ones are lost. Every later write and flush
raises the stored error; the caller reopens the database to recover.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from slatepy.config import Settings
from slatepy.engine.fencing import write_wal_sst
from slatepy.errors import SlatepyError
from slatepy.format.block import Entry
from slatepy.format.sst import SstBuilder
from slatepy.store.numbered import NumberedObjects


class WalWriter:
    """Owns the WAL tail of one writer epoch.

    Args:
        wal: The WAL sequence.
        epoch: This writer's epoch (its fencing SST is already written).
        next_id: The WAL id the next flush writes to.
        settings: Flush thresholds and retry counts.
    """

    def __init__(
        self, wal: NumberedObjects, *, epoch: int, next_id: int, settings: Settings
    ) -> None:
        self._wal = wal
        self._epoch = epoch
        self._settings = settings
        self._next_id = next_id
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._buffer: dict[bytes, tuple[int, bytes | None]] = {}
        self._buffer_bytes = 0
        self._generation = 0
        self._durable_generation = -1
        self._error: SlatepyError | None = None
        self._buffer_unawaited = False
        self.lost_unawaited = False
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
        """Raise the stored fatal error, if any."""
        if self._error is not None:
            raise self._error

    def append(self, entries: Iterable[Entry], *, awaited: bool) -> int:
        """Add entries to the current generation (atomically) and return that generation.

        ``awaited`` says whether the caller will flush and so hear about a failure; losing
        writes nobody awaited is recorded in ``lost_unawaited``.
        """
        with self._lock:
            self.check()
            self._buffer_unawaited |= not awaited
            added = 0
            for key, seq, value in entries:
                self._buffer[key] = (seq, value)
                added += len(key) + len(value or b"") + 16
            self._buffer_bytes += added
            if self._buffer_bytes >= self._settings.flush_bytes:
                self._wake.set()
            return self._generation

    def flush(self, generation: int | None = None) -> None:
        """Make every write up to ``generation`` (default: all so far) durable."""
        if generation is None:
            with self._lock:
                generation = self._generation
        with self._flush_lock:
            if self._durable_generation >= generation:
                return
            self.check()
            with self._lock:
                buffer, flushing = self._buffer, self._generation
                unawaited = self._buffer_unawaited
                self._buffer, self._buffer_bytes, self._buffer_unawaited = {}, 0, False
                self._generation += 1
            if buffer:
                try:
                    self._write(buffer)
                except SlatepyError:
                    self.lost_unawaited |= unawaited
                    raise
            self._durable_generation = flushing

    def _write(self, buffer: dict[bytes, tuple[int, bytes | None]]) -> None:
        builder = SstBuilder(
            writer_epoch=self._epoch,
            block_size=self._settings.block_size,
            bloom_bits_per_key=self._settings.bloom_bits_per_key,
        )
        for key in sorted(buffer):
            seq, value = buffer[key]
            builder.add(key, seq, value)
        encoded = builder.finish()
        data = encoded.data
        try:
            written = write_wal_sst(
                self._wal,
                self._next_id,
                data,
                self._epoch,
                attempts=self._settings.wal_write_attempts,
            )
        except SlatepyError as exc:
            self._error = exc
            raise
        self._next_id = written + 1
        self.ssts_written += 1
        self.max_seq_by_id[written] = encoded.meta.props.max_seq

    def _tick(self) -> None:
        interval = self._settings.flush_interval
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set() or self._error is not None:
                return
            with self._lock:
                pending = bool(self._buffer)
            if pending:
                try:
                    self.flush()
                except SlatepyError:
                    return  # stored in self._error; writers see it on their next call

    def close(self) -> None:
        """Stop the background flusher (callers flush first if they want durability)."""
        self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._ticker:
            self._ticker.join()
