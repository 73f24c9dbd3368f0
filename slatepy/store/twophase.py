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
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from slatepy.errors import AlreadyExists, CorruptionError, NotFound, StoreUnavailable
from slatepy.format.checksum import checksum
from slatepy.store.base import ObjectMeta, ObjectStore, PutMode, WrappingStore
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
    ) -> None:
        super().__init__(inner)
        self.records = records
        self._after_step = after_step
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

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        if mode == "overwrite":
            return self.inner.put(path, data)
        if mode != "create":
            raise StoreUnavailable(
                "If-Match writes are not available through the two-phase CAS", path=path
            )
        source = f"{path}.{uuid.uuid4().hex}.{checksum(data):016x}"
        self.inner.put(source, data)
        self._after_step(1, path)
        try:
            self.records.claim(path, source)
        except RecordExists as lost:
            if lost.existing is None or lost.existing.source != source:
                self.inner.delete(source)
                raise AlreadyExists(f"object already exists: {path}", path=path) from None
            # Our own claim landed on an attempt whose reply was lost: it is ours.
        except StoreUnavailable:
            self._resolve_uncertain_claim(path, source)
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
        """Wait until every background completion started so far has finished."""
        with self._lock:
            pending = list(self._in_flight)
        wait(pending)

    def _complete_quietly(self, destination: str, source: str) -> None:
        try:
            self._complete(destination, source)
        except Exception as exc:  # the next read, list or recovery completes it
            log.warning("two-phase completion of %s deferred: %s", destination, exc)

    def _resolve_uncertain_claim(self, path: str, source: str) -> None:
        """A claim failed indefinitely: find out whether it landed before going on."""
        record = self.records.get(path)  # raises StoreUnavailable if still unreachable
        if record is not None and record.source == source:
            return
        self.inner.delete(source)
        if record is not None:
            raise AlreadyExists(f"object already exists: {path}", path=path)
        raise StoreUnavailable(f"claiming {path} failed", path=path, definite=True)

    def _complete(self, destination: str, source: str) -> None:
        """Steps 3-5 for a claimed record (idempotent: recovery repeats them)."""
        try:
            self.inner.copy(source, destination)
        except NotFound:
            # The source is deleted (step 5) only after the copy (step 3): if it is gone, an
            # earlier completion already put the destination in place.
            try:
                self.inner.head(destination)
            except NotFound:
                raise CorruptionError(
                    f"two-phase record for {destination} names {source}, which is gone, "
                    "and the destination was never written"
                ) from None
        self._after_step(3, destination)
        self.records.mark_committed(destination)
        self._after_step(4, destination)
        self.inner.delete(source)
        self._after_step(5, destination)

    def _complete_record(self, record: Record) -> None:
        if not record.committed:
            self._complete(record.destination, record.source)

    def recover(self) -> int:
        """Complete every uncommitted record of this database; returns how many."""
        pending = self.records.pending()
        for record in pending:
            self._complete_record(record)
        if pending:
            log.info("two-phase recovery completed %d pending writes", len(pending))
        return len(pending)

    def _read(self, path: str, read: Callable[[], T]) -> T:
        """``read()``; on ``NotFound`` complete a pending write of ``path`` and read again."""
        try:
            return read()
        except NotFound:
            record = self.records.get(path)
            if record is None or record.committed:
                raise
            self._complete_record(record)
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
        """Delete the object, then its record (the seed's transactional-store GC)."""
        self.inner.delete(path)
        self.records.delete(path)
