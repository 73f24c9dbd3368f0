"""The persist client: one blob store, one consensus, and a :class:`ShardMachine` per shard
shared by every handle it opens (RFC 0015 §9).

``PersistClient.open("s3://bucket/persist")`` (or ``file://``, ``memory://``) puts shard
blobs on that store and, unless ``consensus=`` says otherwise, the consensus log too. A
``memory://`` store is private to the client; its handles share it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from slatepy.closing import Closing
from slatepy.config import Settings, SettingsLike, resolve_settings
from slatepy.errors import ClosedError, InvalidArgument
from slatepy.persist.codec import Update
from slatepy.persist.config import PersistSettings
from slatepy.persist.critical import SinceHandle
from slatepy.persist.errors import UsageError
from slatepy.persist.ids import new_leased_reader_id, new_writer_id, validate_shard_id
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.open import open_consensus
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.maintenance import MaintenanceRunner
from slatepy.persist.read import ReadHandle, latest_snapshot
from slatepy.persist.state.outcome import Maintenance
from slatepy.persist.state.transitions import (
    ExpireLeasedReader,
    ExpireWriter,
    Finalize,
    RegisterCriticalReader,
    RegisterLeasedReader,
    expire_leased_reader,
    expire_writer,
    finalize,
    register_critical_reader,
    register_leased_reader,
)
from slatepy.persist.write import WriteHandle
from slatepy.store.base import ObjectStore
from slatepy.store.stack import open_stack
from slatepy.store.url import open_store
from slatepy.table.reader import TableReader

log = logging.getLogger(__name__)


class _Leased(Protocol):
    def heartbeat(self) -> None: ...


class _Closable(Protocol):
    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


Release = Callable[[], object]
"""Releases, by id, what a handle registered (for a handle dropped unclosed)."""


def _open(entry: tuple[weakref.ref[_Closable], Release | None]) -> bool:
    """Whether a tracked handle may still hold something: alive and unclosed, or dropped."""
    handle = entry[0]()
    return handle is None or not handle.closed


class Heartbeats:
    """The client's heartbeat thread: keeps the leases of its open handles (leased readers
    every ``reader_lease / 4``, writers every ``writer_lease / 4``), leaving three quarters
    of a lease for pauses and clock skew (RFC §7.1). Started with the first handle, stopped
    by ``close``. Handles are held weakly: one dropped without ``expire`` lets its lease
    lapse. A failed heartbeat is logged and tried again at the next interval."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[_Leased], float, float]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, handle: _Leased, interval: float) -> None:
        """Heartbeat ``handle`` every ``interval`` seconds from now on."""
        with self._changed:
            if self._stopped:
                return
            self._entries[id(handle)] = (
                weakref.ref(handle),
                interval,
                time.monotonic() + interval,
            )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="slatepy-persist-heartbeats", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def stop(self) -> None:
        """Stop the thread (waiting for a heartbeat in flight, up to 10 s)."""
        with self._changed:
            self._stopped = True
            thread, self._thread = self._thread, None
            self._changed.notify_all()
        if thread is not None:
            thread.join(10.0)

    def _loop(self) -> None:
        while True:
            with self._changed:
                if self._stopped:
                    return
                now = time.monotonic()
                due = [(key, ref) for key, (ref, _, at) in self._entries.items() if at <= now]
                for key, _ in due:
                    ref, interval, _ = self._entries[key]
                    self._entries[key] = (ref, interval, now + interval)
                if not due:
                    wake = min((at for _, _, at in self._entries.values()), default=now + 60)
                    self._changed.wait(max(0.0, wake - now))
                    continue
            for key, ref in due:
                handle = ref()
                if handle is None:
                    with self._changed:
                        self._entries.pop(key, None)
                    continue
                try:
                    handle.heartbeat()
                except ClosedError:
                    return
                except UsageError:  # the lease lapsed already: nothing left to keep
                    with self._changed:
                        self._entries.pop(key, None)
                except Exception:  # logged and retried: a heartbeat must not end the thread
                    log.warning("persist heartbeat failed", exc_info=True)


def _split_settings(
    settings: SettingsLike | PersistSettings,
    persist_settings: PersistSettings | Mapping[str, Any] | None,
    store_settings: Settings | None,
) -> tuple[PersistSettings, Settings]:
    """``PersistClient.open``'s settings arguments as (persist tunables, store settings)."""
    if store_settings is not None:
        if settings is not None and not isinstance(settings, PersistSettings):
            raise InvalidArgument("pass settings= or store_settings= (deprecated), not both")
        warnings.warn(
            "PersistClient.open(store_settings=) is deprecated: pass settings=",
            DeprecationWarning,
            stacklevel=3,
        )
    persist: dict[str, Any] = {}
    if isinstance(settings, PersistSettings):
        if persist_settings is not None:
            raise InvalidArgument("a PersistSettings goes in settings= or persist_settings=")
        persist_settings, settings = settings, store_settings
    elif isinstance(settings, Mapping):
        names = {field.name for field in dataclasses.fields(PersistSettings)}
        persist = {k: v for k, v in settings.items() if k in names}
        # A name of both (write_stall_timeout) sets both: it means the same in each.
        settings = {k: v for k, v in settings.items() if k not in names or k in _BOTH}
    elif settings is None:
        settings = store_settings
    if isinstance(persist_settings, Mapping):
        persist = {**persist, **persist_settings}
        persist_settings = None
    if persist:
        if persist_settings is not None:
            raise InvalidArgument("persist tunables given both in settings= and persist_settings=")
        persist_settings = PersistSettings.from_dict(persist)
    return persist_settings or PersistSettings(), resolve_settings(settings)


_BOTH = frozenset({"write_stall_timeout"})
"""Names that are both a store setting and a persist tunable."""


def _debug(purpose: str) -> str:
    """What a handle records about itself in the state: ``host:pid purpose``."""
    return f"{socket.gethostname()}:{os.getpid()} {purpose}".strip()


class PersistClient(Closing):
    """Opens handles on the shards of one location. Thread-safe; close it (or use it as a
    context manager) to release the consensus connection and wake waiting reads."""

    def __init__(
        self,
        blob: ObjectStore,
        consensus: Consensus,
        settings: PersistSettings,
        *,
        owns_consensus: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.blob = blob
        self.consensus = consensus
        self.settings = settings
        self._owns_consensus = owns_consensus
        self._clock = clock
        self._machines: dict[str, ShardMachine] = {}
        # Parts are only scanned (uncached, chunked): no block cache is needed.
        self._tables = TableReader(blob, block_cache_bytes=0, meta_cache_bytes=1 << 20)
        self._heartbeats = Heartbeats()
        # Merges and GC of the shards this client writes, off the callers' paths.
        self._maintenance = MaintenanceRunner(self._tables)
        self._lock = threading.Lock()
        self._closed = False
        # The handles opened and not closed, held weakly (a dropped one stops heartbeating,
        # its lease lapses), each with what releases its registration by id: close() closes
        # the live ones and releases the dropped ones.
        self._handles: list[tuple[weakref.ref[_Closable], Release | None]] = []

    def _track(self, handle: _Closable, release: Release | None) -> None:
        with self._lock:
            self._handles = [entry for entry in self._handles if _open(entry)]
            self._handles.append((weakref.ref(handle), release))

    @classmethod
    def open(
        cls,
        url: str | ObjectStore,
        *,
        consensus: str | Consensus | None = None,
        settings: SettingsLike | PersistSettings = None,
        persist_settings: PersistSettings | Mapping[str, Any] | None = None,
        store_settings: Settings | None = None,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> PersistClient:
        """Open a client on the blob store ``url`` (or a store instance).

        Args:
            url: ``memory://`` (private to this client), ``file:///abs/path``, ``s3://...``.
            consensus: None (a log on the blob store), a ``postgresql://`` URL, or a
                ``Consensus`` instance (used as is; the caller closes it).
            settings: The store's settings as everywhere (a ``Settings``, a dict or a TOML
                path, resolved over ``SLATEPY_*`` as ``Db.open`` does); a dict may also
                hold persist tunables, and a ``PersistSettings`` is taken as
                ``persist_settings``.
            persist_settings: Persist tunables (leases, part sizes...), or a dict of them.
            store_settings: Deprecated alias of a ``Settings`` passed as ``settings``.
            clock: Wall clock in seconds (state walltimes, leases, batch ages; tests).
            create: Create a location that does not exist yet (a ``file://`` directory), as
                ``Db.open`` does; False raises ``NotFound`` instead (inspection tools).

        Raises:
            InvalidArgument / UnsupportedStore: the URL or consensus is unusable.
            NotFound: ``create`` is False and nothing is at ``url``.
        """
        persist, store_settings = _split_settings(settings, persist_settings, store_settings)
        settings = persist
        target = open_store(url, store_settings, create=create) if isinstance(url, str) else url
        blob = open_stack(target, store_settings)
        log = open_consensus(
            blob,
            consensus,
            min_age=settings.consensus_min_age,
            clock=clock,
            statement_timeout=store_settings.store_timeout,
        )
        return cls(
            blob, log, settings, owns_consensus=not isinstance(consensus, Consensus), clock=clock
        )

    def machine(self, shard_id: str) -> ShardMachine:
        """The shared state machine of ``shard_id`` in this client.

        Raises:
            UsageError: an invalid shard id.
            ClosedError: the client is closed.
        """
        validate_shard_id(shard_id)
        with self._lock:
            if self._closed:
                raise ClosedError("the persist client is closed")
            machine = self._machines.get(shard_id)
            if machine is None:
                machine = ShardMachine(
                    shard_id, self.consensus, self.blob, self.settings, clock=self._clock
                )
                self._machines[shard_id] = machine
            return machine

    def open_writer(self, shard_id: str, *, purpose: str = "") -> WriteHandle:
        """A write handle on ``shard_id`` (registered with its first append).

        Raises:
            UsageError: invalid shard id, or the shard is finalized.
        """
        machine = self.machine(shard_id)
        state = machine.fetch()
        if state.finalized:
            raise UsageError(f"shard {shard_id!r} is finalized; it accepts no writers")
        writer_id = new_writer_id()
        submit: Callable[[Maintenance], None] | None = None
        if self.settings.compaction == "on":
            runner = self._maintenance

            def submit(maintenance: Maintenance) -> None:
                runner.submit(machine, writer_id, maintenance)

        handle = WriteHandle(
            machine, writer_id, state.upper, debug=_debug(purpose), maintenance=submit
        )
        self._heartbeats.add(handle, self.settings.writer_lease / 4)
        self._track(
            handle,
            lambda: machine.run(expire_writer, ExpireWriter(writer_id), on_uncertain=rerun_as_is),
        )
        if self.settings.compaction == "on":
            self._maintenance.watch(machine, writer_id, owner=handle)
        return handle

    def open_leased_reader(self, shard_id: str, *, purpose: str = "") -> ReadHandle:
        """A read handle on ``shard_id``, registered (one state change) at the shard's since.

        Raises:
            UsageError: invalid shard id, the shard is finalized, or too many readers.
        """
        machine = self.machine(shard_id)
        reader_id = new_leased_reader_id()
        reader = machine.run(
            register_leased_reader,
            RegisterLeasedReader(reader_id, _debug(purpose)),
            on_uncertain=rerun_as_is,
        )
        handle = ReadHandle(machine, self._tables, reader_id, reader.since)
        self._heartbeats.add(handle, self.settings.reader_lease / 4)
        self._track(
            handle,
            lambda: machine.run(
                expire_leased_reader, ExpireLeasedReader(reader_id), on_uncertain=rerun_as_is
            ),
        )
        return handle

    def snapshot_latest(self, shard_id: str) -> tuple[int | None, list[Update]]:
        """The shard's upper now and its contents as of ``upper - 1``, registering nothing
        (no state change: a read-only credential suffices, and no writer's compare-and-set
        is disturbed). See :func:`slatepy.persist.read.latest_snapshot`.

        Raises:
            SinceError: the shard's since is beyond ``upper - 1``.
            CorruptionError / StateConflictError: see ``latest_snapshot``.
        """
        return latest_snapshot(self.machine(shard_id), self._tables)

    def open_critical_since(self, shard_id: str, reader_id: str) -> SinceHandle:
        """The critical since hold ``reader_id`` on ``shard_id``: registered at the shard's
        since with opaque ``b""`` the first time, the existing hold unchanged after that.

        Raises:
            UsageError: invalid ids, or the shard is finalized.
        """
        machine = self.machine(shard_id)
        reader = machine.run(
            register_critical_reader,
            RegisterCriticalReader(reader_id, _debug("critical")),
            on_uncertain=rerun_as_is,
        )
        handle = SinceHandle(machine, reader_id, reader)
        self._track(handle, None)  # durable by design: nothing to release
        return handle

    def finalize_shard(self, shard_id: str) -> None:
        """Finalize ``shard_id``: no handles or writes any more; GC may delete its data.
        Idempotent.

        Raises:
            UsageError: the shard's since or upper is not None (close it with an append to
                ``new_upper=None`` and downgrade every since to None first).
        """
        self.machine(shard_id).run(finalize, Finalize(), on_uncertain=rerun_as_is)

    def list_shards(self) -> list[str]:
        """Every shard with a consensus log, sorted."""
        return self.consensus.list_keys()

    def wait_maintenance(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for this client's queued merges and GC passes to
        finish (a short-lived process that appended, before it closes: its merge claims are
        otherwise left to expire). Answers whether the queue emptied."""
        deadline = time.monotonic() + timeout
        while not self._maintenance.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        """Close the handles this client opened and still open, wake waiting reads, and
        close the consensus if this client opened it. Closing releases what the handles
        registered: leased readers and writers are expired (one state change each), so
        none is left in the shard until its lease lapses; a critical since stays (durable
        by design: only ``SinceHandle.expire`` releases it). A release that fails is logged
        and its lease lapses as it would have. Idempotent; handles fail with
        ``ClosedError`` afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            machines = list(self._machines.values())
            handles, self._handles = self._handles, []
        self._maintenance.close()
        for ref, release in handles:
            handle = ref()
            try:
                if handle is not None:
                    handle.close()
                elif release is not None:
                    release()
            except Exception:  # the rest still close; the lease lapses by itself
                log.warning("persist: releasing a handle on close failed", exc_info=True)
        self._heartbeats.stop()
        for machine in machines:
            machine.close()
        if self._owns_consensus:
            self.consensus.close()
