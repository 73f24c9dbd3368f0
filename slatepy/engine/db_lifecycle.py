"""``Db``'s lifecycle after open: flush, close, interpreter exit, garbage collection of an
unclosed ``Db``, a failed writer and ``os.fork``; and the weak callbacks that let an unclosed
``Db`` be collected."""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable

from slatepy.engine import forking
from slatepy.engine.db_reads import Reads
from slatepy.engine.db_state import DbState
from slatepy.engine.forking import forked_error
from slatepy.engine.memtable import Memtable
from slatepy.errors import (
    ClosedError,
    SlatepyError,
    WritesLost,
)
from slatepy.manifest.record import Manifest

log = logging.getLogger("slatepy.engine.db")  # the logger these messages always had

OPEN_DATABASES: weakref.WeakSet[Lifecycle] = weakref.WeakSet()
"""Databases not closed yet, so that interpreter exit can flush what they buffered."""


@atexit.register
def _flush_open_databases() -> None:
    for db in list(OPEN_DATABASES):
        db._flush_at_exit()


class Lifecycle(DbState):
    """The end of a :class:`~slatepy.engine.db.Db`'s life (see there)."""

    def flush(self) -> None:
        """Make every write made so far durable.

        Raises the writer's fatal error (``FencedError``, ``StoreUnavailable``) if any write
        so far could not be made durable; that report covers unawaited writes too.
        """
        self._check_open()
        try:
            self._wal.flush()
        except SlatepyError:
            self._wal.failure_reported()
            raise

    def close(self) -> None:
        """Flush outstanding writes and stop background work; idempotent.

        Raises:
            WritesLost: writes made with ``await_durable=False`` could not be made durable
                (the writer had failed; the failure is the ``__cause__``) and no ``flush()``
                reported it. Failures already raised to the writers that awaited them are
                not raised again.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = self._refused = True
        OPEN_DATABASES.discard(self)
        forking.untrack(self)
        try:
            self._wal.flush()
        except SlatepyError as exc:
            lost = self._wal.unwritten_unawaited()
            if lost:
                raise WritesLost(
                    f"{lost} writes made with await_durable=False were never made durable "
                    f"and are lost: the writer failed ({exc})",
                    count=lost,
                ) from exc
        finally:
            if self._compactor is not None:
                self._compactor.close(drain=self._settings.close_compaction_wait)
            self._wal.close()
            self._store.drain()
            # A closed database keeps no data in memory, even while its object is referenced
            # (``with Db.open(...) as db:`` leaves ``db`` bound): everything here is durable.
            with self._lock:
                self._memtable = Memtable()
            self._tables.clear_caches()

    def _flush_at_exit(self) -> None:
        """At interpreter exit, make buffered writes of a database nobody closed durable.

        Only the WAL buffer is flushed (background threads are left to the interpreter), so a
        process that forgot ``close()`` loses nothing it wrote and says so; a store that is
        gone by then costs its request timeout, once.
        """
        buffered = 0 if self._closed else self._wal.buffered()
        if not buffered:
            return
        log.warning(
            "database %s was not closed: flushing %d buffered writes at exit (call close())",
            self.url,
            buffered,
        )
        try:
            self._wal.flush()
        except SlatepyError as exc:
            log.error("%d unawaited writes to %s are lost at exit: %s", buffered, self.url, exc)

    def __del__(self) -> None:
        """Warn (``ResourceWarning``) about a database garbage-collected without ``close()``,
        then close it, so buffered writes are flushed and its threads stop.

        Like an unclosed file: the warning names the bug (a missing ``close()`` or ``with``);
        closing here keeps it from also losing the writes. At interpreter exit the atexit
        flush has already run and nothing more is done.
        """
        if not self._opened or getattr(self, "_closed", True) or sys.is_finalizing():
            return
        try:
            warnings.warn(
                f"database {self.url} was garbage-collected without close(); closing it now "
                "(use `with Db.open(...)` or call close())",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
        finally:  # also when warnings are errors (-W error): the writes still get flushed
            if threading.current_thread().name.startswith("slatepy-"):
                # Dropped on one of our own threads (the compactor's callback held the last
                # reference): close() joins those threads, so it runs on a thread of its own.
                closer = threading.Thread(
                    target=self._close_quietly, name="slatepy-close", daemon=True
                )
                closer.start()
            else:
                self._close_quietly()

    def _close_quietly(self) -> None:
        try:
            self.close()
        except SlatepyError as exc:
            log.error("closing the unclosed database %s failed: %s", self.url, exc)

    def _crash(self) -> None:
        """Stop like a killed process: no flush, background threads stopped (crash tests)."""
        OPEN_DATABASES.discard(self)
        forking.untrack(self)
        with self._lock:
            self._closed = self._refused = True
        if self._compactor is not None:
            self._compactor.close()
        self._wal.close()

    def _check_open(self) -> None:
        if self._closed:
            if self._forked_from:
                raise forked_error(f"the database {self.url}", self._forked_from)
            raise ClosedError("the database is closed; open it again to use it")

    def _check_readable(self) -> None:
        """Reads need an open database whose writer has not failed: after a failure the
        memtable may hold writes that were never made durable, and no read may return
        those once the failure was reported (RFC 0026). ``WalWriter.dead_error`` says so."""
        self._check_open()
        self._wal.check()

    def _writer_failed(self) -> None:
        self._refused = True

    def _mark_forked(self, parent_pid: int) -> None:
        """In a child of ``os.fork()`` (see :mod:`slatepy.engine.forking`): unusable here,
        and nothing to flush at the child's exit (the parent owns the buffered writes)."""
        OPEN_DATABASES.discard(self)
        self._forked_from = parent_pid
        self._closed = self._refused = True


def weak_callback(method: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    """``method`` as a callback that does not keep its object alive.

    The in-process compactor's thread holds its callback for as long as it runs; a bound
    method there would keep an unclosed ``Db`` reachable forever, so it could never be
    collected (nor warn that it was not closed).
    """
    ref = weakref.WeakMethod(method)

    def call(manifest: Manifest) -> None:
        target = ref()
        if target is not None:
            target(manifest)

    return call


def weak_sole_use(
    db: Reads,
) -> Callable[[], contextlib.AbstractContextManager[list[Manifest] | None]]:
    """``db._sole_use`` without keeping ``db`` alive (the collector outlives no writer)."""
    ref = weakref.ref(db)

    def call() -> contextlib.AbstractContextManager[list[Manifest] | None]:
        live = ref()
        return contextlib.nullcontext() if live is None else live._sole_use()

    return call


def weak_call(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` as a callback that does not keep its object alive (the WAL's flusher
    thread holds the WAL writer, which holds this; see :func:`weak_callback`)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        target = ref()
        if target is not None:
            target()

    return call
