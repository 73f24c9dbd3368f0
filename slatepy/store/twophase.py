"""Create-if-absent for stores without conditional writes: the seed's two-phase write.

``TwoPhaseStore`` wraps a store and replaces ``put(mode="create")`` by five steps:

1. write the bytes to a temporary object ``{dest}.{uuid}.{xxh3}``;
2. put the record ``{source, destination, committed=false}`` into DynamoDB on the condition
   that no record for ``destination`` exists: from here the write is durable and nobody else
   can have ``destination``; losing the condition is ``AlreadyExists`` (the loser deletes its
   temporary object);
3. copy the temporary object to ``destination``;
4. mark the record committed;
5. delete the temporary object.

``put`` returns after step 2 (the write is durable and exclusive) and steps 3-5 run on a
background thread, so a create costs one S3 PUT and one DynamoDB write of latency.

A record whose copy has not happened yet is durable but not yet visible, so every read that
misses (``get``/``head``/ranges on ``NotFound``) and every ``list`` completes the pending
records it could be looking for first (steps 3-5, idempotent). ``recover()`` completes them
all; ``Db``, ``DbReader`` and the garbage collector call it when they start. Everything
above the store sees the same contract as with a conditional put (RFC 0004).

Invariant: a record's source is deleted only after its destination was copied (step 5), by a
putter that learned it lost the claim, or by GC as a stray older than ``gc_min_age``. So a
claim whose outcome is unknown keeps its temporary object, and a record whose source and
destination are both gone was never acknowledged (or its object was collected) and is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import xxhash

from slatepy.errors import AlreadyExists, NotFound, StoreUnavailable
from slatepy.store.base import (
    ObjectMeta,
    ObjectStore,
    ObjectWriter,
    PutData,
    PutMode,
    WrappingStore,
)
from slatepy.store.dynamodb import DynamoRecords, Record, RecordExists

log = logging.getLogger(__name__)
T = TypeVar("T")

StepHook = Callable[[int, str], None]
"""Called after each step (1-5) with the destination; tests inject crashes here."""


def _no_hook(step: int, destination: str) -> None:
    pass


class TwoPhaseStore(WrappingStore):
    """``inner`` with exclusive creates through ``records`` (see the module docstring)."""

    def __init__(
        self,
        inner: ObjectStore,
        records: DynamoRecords,
        *,
        background: bool = True,
        after_step: StepHook = _no_hook,
        claim_attempts: int = 4,
        claim_backoff: float = 0.05,
    ) -> None:
        """Wrap ``inner``.

        Args:
            inner: The store holding temporaries and destinations.
            records: The transactional store of the claims.
            background: Run steps 3-5 on a background thread after ``put`` returns.
            after_step: Called after each step (tests inject crashes here).
            claim_attempts: PutItem attempts (each with botocore's own retries) before a
                claim whose outcome stays unknown is reported as ``definite=False``.
            claim_backoff: Seconds before the second attempt, doubling after each.
        """
        super().__init__(inner)
        self.records = records
        self._after_step = after_step
        self._claim_attempts = max(1, claim_attempts)
        self._claim_backoff = claim_backoff
        # The write is durable after step 2 (the seed's point), so steps 3-5 may finish after
        # ``put`` returns; anyone who needs the object first completes it themselves.
        self._completer = (
            ThreadPoolExecutor(2, thread_name_prefix="slatepy-two-phase") if background else None
        )
        self._lock = threading.Lock()
        self._in_flight: set[Future[None]] = set()

    @property
    def supports_if_match(self) -> bool:
        return False

    def open_writer(self, path: str) -> ObjectWriter:
        """Streamed writes overwrite, which needs no claim: passed through."""
        return self.inner.open_writer(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        if mode == "overwrite":
            return self.inner.put(path, data)
        if mode != "create":
            raise StoreUnavailable(
                "If-Match writes are not available through the two-phase CAS", path=path
            )
        source = f"{path}.{uuid.uuid4().hex}.{xxhash.xxh3_64_intdigest(data):016x}"
        self.inner.put(source, data)
        self._after_step(1, path)
        self._claim(path, source)
        self._after_step(2, path)
        if self._completer is None:
            self._complete(path, source)
        else:
            future = self._completer.submit(self._complete_quietly, path, source)
            with self._lock:
                self._in_flight.add(future)
            future.add_done_callback(self._forget)
        return None

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def drain(self) -> None:
        """Wait until every background completion started so far has finished (or failed:
        a failed one is left to the next read, list or recovery)."""
        with self._lock:
            pending = list(self._in_flight)
        wait(pending)

    def _complete_quietly(self, destination: str, source: str) -> None:
        try:
            self._complete(destination, source)
        except Exception as exc:  # the next read, list or recovery completes it
            log.warning("two-phase completion of %s deferred: %s", destination, exc)

    def _claim(self, path: str, source: str) -> None:
        """Step 2 with a known outcome: return if the claim is ours, raise otherwise.

        Raises:
            AlreadyExists: another claim holds ``path``; our temporary object is deleted.
            StoreUnavailable: ``definite=False``: after every attempt nobody could tell
                whether our claim landed. The temporary object is kept: a claim that lands
                late needs it, and GC removes it after ``gc_min_age`` if none does.
        """
        error: StoreUnavailable | None = None
        for attempt in range(self._claim_attempts):
            if attempt:
                time.sleep(self._claim_backoff * 2 ** (attempt - 1))
            try:
                self.records.claim(path, source)
                return
            except RecordExists as lost:
                if lost.existing is not None and lost.existing.source == source:
                    return  # an earlier attempt of ours landed and its reply was lost
                if lost.existing is None and error is not None:
                    # The record that failed our condition is gone already. It could only
                    # have been ours if it was completed and collected, which takes longer
                    # than this loop; retry to get a definite answer.
                    continue
                self._discard(source)
                raise AlreadyExists(f"object already exists: {path}", path=path) from None
            except StoreUnavailable as exc:
                error = exc  # the PutItem may have landed: retry with the same source
        raise StoreUnavailable(
            f"claiming {path} stayed uncertain after {self._claim_attempts} attempts ({error}); "
            f"the claim may still land, so its temporary {source} is kept: the next read, "
            "list or recovery completes the write if it did. Check whether the object exists "
            "before writing it again (create_if_absent does)",
            path=path,
            definite=False,
        ) from error

    def _discard(self, source: str) -> None:
        """Delete the temporary of a lost claim; if that fails, GC takes it as a stray."""
        try:
            self.inner.delete(source)
        except StoreUnavailable as exc:
            log.warning("two-phase: could not delete the temporary %s, left to GC: %s", source, exc)

    def _complete(self, destination: str, source: str) -> bool:
        """Steps 3-5 for a claimed record (idempotent: recovery repeats them).

        Returns:
            False if the record was an orphan (see :meth:`_drop_orphan`) and is now dropped:
            ``destination`` does not exist.
        """
        try:
            self.inner.copy(source, destination)
        except NotFound:
            # The source is deleted (step 5) only after the copy (step 3): if it is gone, an
            # earlier completion already put the destination in place.
            try:
                self.inner.head(destination)
            except NotFound:
                self._drop_orphan(destination, source)
                return False
        self._after_step(3, destination)
        # False means the record was completed and collected meanwhile (or replaced by a
        # newer claim, which its own putter completes): nothing to mark, never re-create it.
        self.records.mark_committed(destination, source)
        self._after_step(4, destination)
        self.inner.delete(source)
        self._after_step(5, destination)
        return True

    def _drop_orphan(self, destination: str, source: str) -> None:
        """Delete a record whose source and destination are both gone; it can never complete.

        Safe, because such a claim was never acknowledged or its object was collected. A
        source is deleted only (a) by step 5, after the copy, so the destination existed and
        is gone only if GC deleted it, and GC then deletes the record too (we finish its job);
        (b) by a putter that learned another claim holds the destination (its ``put`` raised
        ``AlreadyExists``; this record landed late, after that claim was removed); (c) by an
        older slatepy's putter that took an unknown claim for a failure (its ``put`` raised);
        or (d) by GC as a stray older than ``gc_min_age``: GC completes every pending record
        first, so the claim landed after that, later than any ``put`` waits (a stalled
        ``put`` would need to hang for ``gc_min_age``, the assumption RFC 0003 already makes).
        Before, such a record raised ``CorruptionError`` on every read and every open.

        The delete is conditional on ``source`` so a newer claim of the destination stays.
        """
        if self.records.delete_if_source(destination, source):
            log.warning(
                "two-phase: dropped the record for %s: its temporary %s and the destination "
                "are both gone, so the write can never complete and was never acknowledged",
                destination,
                source,
            )

    def _complete_record(self, record: Record) -> bool:
        """Complete ``record`` unless committed; False if it turned out to be an orphan."""
        return record.committed or self._complete(record.destination, record.source)

    def recover(self) -> int:
        """Complete every uncommitted record of this database; returns how many completed.

        Orphans (records that can never complete, see :meth:`_drop_orphan`) are dropped with
        a warning and not counted.
        """
        completed = sum(self._complete_record(record) for record in self.records.pending())
        if completed:
            log.info("two-phase recovery completed %d pending writes", completed)
        return completed

    def _read(self, path: str, read: Callable[[], T]) -> T:
        """``read()``; on ``NotFound`` complete a pending write of ``path`` and read again.

        A committed record also means read again: the completion may have copied the object
        between the miss and the record lookup.
        """
        try:
            return read()
        except NotFound:
            record = self.records.get(path)
            if record is None:
                raise
            if not record.committed and not self._complete_record(record):
                raise
            return read()

    def get(self, path: str) -> bytes:
        return self._read(path, lambda: self.inner.get(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self._read(path, lambda: self.inner.get_range(path, start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._read(path, lambda: self.inner.get_ranges(path, ranges))

    def get_suffix(self, path: str, length: int) -> bytes:
        return self._read(path, lambda: self.inner.get_suffix(path, length))

    def head(self, path: str) -> ObjectMeta:
        return self._read(path, lambda: self.inner.head(path))

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        for record in self.records.pending(prefix, offset):
            self._complete_record(record)
        return self.inner.list(prefix, offset=offset)

    def delete(self, path: str) -> None:
        """Delete the object, then its record (the seed's transactional-store GC).

        Background completions started here finish first: one still copying could otherwise
        put the object back after the delete.
        """
        self.drain()
        self.inner.delete(path)
        self.records.delete(path)
