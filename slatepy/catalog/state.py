"""The durable catalog state: one implementation over any :class:`Storage` (RFC 0028 §1, §4).

Unopened, a state answers ``is_initialized``, ``check_open``, ``dump``, ``deploy_generation``
and ``entries`` from storage. ``open()`` initializes or migrates in memory and writes the
changes together with the epoch bump as one write at the upper it read; from then on every
commit is one write at the cached upper, checked against the epoch first, so an older
leader's commit after a newer ``open()`` raises ``FencedError`` and writes nothing.
``open_read_only()`` caches a snapshot and refuses every mutation.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec

from slatepy.catalog.errors import (
    CatalogContention,
    CatalogError,
    IncompatibleCatalogVersion,
    MigrationNeeded,
    ReadOnlyCatalog,
    UninitializedCatalog,
)
from slatepy.catalog.objects import (
    CATALOG_VERSION,
    ConfigKey,
    ConfigValue,
    collection,
    initial_objects,
)
from slatepy.catalog.reads import TypedReads
from slatepy.catalog.snapshot import (
    add_open_event,
    check_objects,
    diff_objects,
    dump_json,
    holder,
    objects_of,
    sort_key,
)
from slatepy.catalog.storage import Contents, Row, Storage
from slatepy.catalog.transaction import Cache, Transaction, check_user
from slatepy.catalog.upgrade import catalog_version, check_version, upgrade
from slatepy.errors import FencedError, TransactionConflict
from slatepy.persist import StateConflictError

T = TypeVar("T")
Mode = Literal["unopened", "writable", "read_only", "fenced", "closed"]
OPEN_ATTEMPTS = 5
"""Tries of ``open()`` when another opener wins the race for the same upper."""
LOST_RACES = (FencedError, StateConflictError, CatalogContention)
"""What a write that lost to other writers raises, nothing written: another writer took
the upper, (persist) other actors kept winning the shard's consensus log (its reader
registrations count), or (PostgreSQL) serialization failures outlasted the stash's retries.
An open and a debug edit start again from a fresh read."""
TICK_SECONDS = 2.0
"""How long a debug edit that lost a race tries, once, to fence the writer that beat it
with an empty write at the current upper (:meth:`CatalogState._tick`)."""


class _WriteLost(Exception):
    """A debug edit's write lost a race (``race``, one of :data:`LOST_RACES`): not its read."""

    def __init__(self, race: Exception) -> None:
        super().__init__(str(race))
        self.race = race


class CatalogState(TypedReads):
    """A durable catalog, unopened until :meth:`open` or :meth:`open_read_only`. Safe to
    share between threads: opens, new transactions, commits and leadership checks take
    turns, so a commit that loses to another thread's raises ``TransactionConflict``, never
    a fence.

    Args:
        storage: Where it lives (persist or the SQL stash).
        clock: Wall clock in seconds, for audit events.
        user: Recorded in the audit events of this state's commits.
        deploy_generation: Set config ``deploy_generation`` to this at ``open()``.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        clock: Callable[[], float] = time.time,
        user: str = "",
        deploy_generation: int | None = None,
    ) -> None:
        check_user(user)
        self._storage = storage
        self._clock = clock
        self._user = user
        self._deploy_generation = deploy_generation
        self._mode: Mode = "unopened"
        self._epoch: int | None = None
        self._upper = 0
        self._cache = Cache()
        self._lock = threading.RLock()
        self._debug_wrote = False

    @property
    def description(self) -> str:
        return self._storage.description

    @property
    def epoch(self) -> int | None:
        """This state's epoch once opened (a read-only open: the epoch it saw), else None."""
        return self._epoch

    @property
    def upper(self) -> int:
        """The upper of the cached state (0 until opened)."""
        return self._upper

    @property
    def is_read_only(self) -> bool:
        return self._mode == "read_only"

    @property
    def debug_wrote(self) -> bool:
        """Whether the last :meth:`debug_commit` wrote anything (its edit, or the empty
        write that fences a writer overtaking it): a leader still running is then fenced."""
        return self._debug_wrote

    # -- opening ------------------------------------------------------------------------

    def is_initialized(self) -> bool:
        """Whether anything ever opened this catalog for writing. Writes nothing."""
        self._check_not_closed()
        return self._storage.upper() > 0

    def open(self) -> None:
        """Initialize the catalog, or migrate it to this code's version, and become its
        leader: the changes and the epoch bump are one write.

        Raises:
            IncompatibleCatalogVersion: the catalog is newer than this code (or too old).
            FencedError: other openers kept winning the race (after several tries).
            StateConflictError, CatalogContention: (persist) other actors kept winning
                its consensus log, (PostgreSQL) serialization failures; after as many tries,
                nothing written.
            CatalogError: the catalog holds an object this version cannot read (corrupt).
        """
        with self._lock:
            self._open()

    def _open(self) -> None:
        self._check_unopened()
        for attempt in range(OPEN_ATTEMPTS):
            try:
                self._open_once()
                return
            except LOST_RACES:
                if attempt == OPEN_ATTEMPTS - 1:
                    raise

    def initialize(self) -> bool:
        """Create the catalog and become its leader (as :meth:`open`), only if nothing ever
        opened it: ``slatepy catalog init``. Of concurrent initializers exactly one creates
        it; the others find it created (their write at upper 0 loses, and they read again)
        and change nothing.

        Returns:
            True: this call created it (the state is open, at epoch 1). False: it exists
            (this state stays unopened; nothing was written).

        Raises:
            As :meth:`open`.
        """
        with self._lock:
            self._check_unopened()
            for attempt in range(OPEN_ATTEMPTS):
                contents = self._storage.read()
                if contents.upper != 0:
                    return False
                try:
                    self._open_at(contents)
                    return True
                except LOST_RACES:
                    if attempt == OPEN_ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")

    def _open_once(self) -> None:
        self._open_at(self._storage.read())

    def _open_at(self, contents: Contents) -> None:
        old = objects_of(contents, self.description)
        if contents.upper == 0:
            new, event = initial_objects(self._deploy_generation or 0), "initialize"
        else:
            new, found = upgrade({k: dict(v) for k, v in old.items()})
            check_objects(new, self.description)
            event = "migrate" if found != CATALOG_VERSION else "open"
            if self._deploy_generation is not None:
                new["config"][msgspec.json.encode(ConfigKey("deploy_generation"))] = (
                    msgspec.json.encode(ConfigValue(self._deploy_generation))
                )
        epoch = contents.epoch + 1
        now_ms = int(self._clock() * 1000)
        add_open_event(new, event, epoch=epoch, user=self._user, now_ms=now_ms)
        rows = diff_objects(old, new)
        self._upper = self._storage.write(
            rows,
            expected_upper=contents.upper,
            epoch=contents.epoch,
            new_epoch=epoch,
            holder=holder(),
        )
        self._epoch = epoch
        self._cache = Cache(new)
        self._mode = "writable"

    def open_read_only(self) -> None:
        """Cache the catalog as it is now, changing nothing; every mutation then fails.

        Raises:
            UninitializedCatalog: nothing opened it for writing yet.
            MigrationNeeded: it is at an older version (``open()`` would migrate it).
            IncompatibleCatalogVersion: it is newer than this code.
        """
        with self._lock:
            self._check_unopened()
            contents = self._read_initialized()
            objects = objects_of(contents, self.description)
            found = catalog_version(objects)
            check_version(found)
            if found < CATALOG_VERSION:
                raise MigrationNeeded(
                    f"catalog {self.description} is at version {found}; this code's version "
                    f"is {CATALOG_VERSION}: open it for writing once to migrate it"
                )
            check_objects(objects, self.description)
            self._cache = Cache(objects)
            self._upper, self._epoch = contents.upper, contents.epoch
            self._mode = "read_only"

    def check_open(self) -> tuple[int, int]:
        """Would ``open()`` succeed? Reads and migrates in memory, writes nothing.

        Returns:
            The catalog's version (0: uninitialized: open would initialize it) and this
            code's version.

        Raises:
            IncompatibleCatalogVersion: it would not (the catalog is too new or too old).
            CatalogError: it would not (a migration step fails, or the catalog holds an
                object this code's version cannot read: corrupt).
        """
        self._check_not_closed()
        contents = self._storage.read()
        if contents.upper == 0:
            return 0, CATALOG_VERSION
        new, found = upgrade(objects_of(contents, self.description))
        check_objects(new, self.description)
        return found, CATALOG_VERSION

    # -- transactions ------------------------------------------------------------------

    def transaction(self, *, user: str | None = None) -> Transaction:
        """A transaction on the cached catalog (a read-only catalog's refuses writes); its
        base upper is the cache's (never one whose commit is still being applied)."""
        with self._lock:
            self._check_open()
            return Transaction(
                self._cache,
                base_upper=self._upper,
                user=self._user if user is None else user,
                clock=self._clock,
                writable=self._mode == "writable",
            )

    def commit_transaction(self, tx: Transaction) -> None:
        """Commit ``tx`` as one write at the cached upper (nothing, if it changed nothing).

        Raises:
            ReadOnlyCatalog: this state is not open for writing.
            TransactionConflict: another transaction committed since ``tx`` was made.
            FencedError: a newer ``open()`` (or a debug edit) happened; nothing was written
                and this state refuses everything from now on.
        """
        with self._lock:
            self._check_writable()
            if tx.base_upper != self._upper:
                raise TransactionConflict(
                    f"the transaction read the catalog at {tx.base_upper}; it is at "
                    f"{self._upper} now: make a new transaction"
                )
            rows = tx.batch()
            if rows:
                self._write(rows)

    def _write(self, rows: list[Row]) -> None:
        try:
            self._upper = self._storage.write(rows, expected_upper=self._upper, epoch=self._epoch)
        except FencedError:
            self._mode = "fenced"
            raise
        self._cache.apply(rows)

    def confirm_leadership(self) -> None:
        """A linearized check that this state is still the catalog's leader.

        Raises:
            FencedError: a newer opener (or an edit) changed the catalog.
            ReadOnlyCatalog: this state was not opened for writing.
        """
        with self._lock:
            self._check_writable()
            assert self._epoch is not None
            try:
                self._storage.confirm(self._upper, self._epoch)
            except FencedError:
                self._mode = "fenced"
                raise

    def debug_commit(
        self, edit: Callable[[Transaction], T], *, user: str, timeout: float = 30.0
    ) -> T:
        """Run ``edit`` on a transaction over the catalog as stored now (not migrated) and
        commit it at the current upper without bumping or checking the epoch, again from
        a fresh read while other writers win (:data:`LOST_RACES`; up to ``timeout``
        seconds): the debug tool's edits. A live leader is fenced by them. After the first
        lost race the edit first fences the writer that won with one empty write
        (:meth:`_tick`, for up to :data:`TICK_SECONDS`), so a leader committing without
        pause cannot overtake it forever; an edit that changes nothing writes nothing.

        Raises:
            ReadOnlyCatalog: this state was opened (read-only, or as a leader, which the
                edit would fence): the tool's edits are an unopened state's.
            IncompatibleCatalogVersion: ``edit`` changes objects (not config or id
                allocators, which every version shares) of a catalog at another version
                than this code's: they would be of the wrong version.
        """
        self._check_not_closed()
        if self._mode != "unopened":
            raise ReadOnlyCatalog(
                f"catalog {self.description} is open ({self._mode}): debug edits are made "
                "by an unopened state"
            )
        deadline = time.monotonic() + timeout
        delay = 0.01
        ticked = False
        self._debug_wrote = False
        while True:
            try:
                return self._debug_commit_once(edit, user=user)
            except (_WriteLost, *LOST_RACES) as exc:
                race = exc.race if isinstance(exc, _WriteLost) else exc
                # Only an edit that lost at its write fences (an edit that changes nothing
                # never writes, and a read's lost race says nothing of a leader).
                if isinstance(exc, _WriteLost) and not ticked:
                    ticked = True
                    if self._tick(min(deadline, time.monotonic() + TICK_SECONDS)):
                        self._debug_wrote = True
                        continue  # the leader is fenced: read again at once
                if time.monotonic() + delay > deadline:
                    raise race from None
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(1.0, delay * 2)

    def _tick(self, until: float) -> bool:
        """Move the upper by one empty write at the upper just read, again at once while
        other writers win, until ``until``: True once it landed. An edit's read-then-write
        takes longer than the gap between a busy leader's commits, so it never lands while
        the leader runs; this write fences that leader (as the edit would have) in the
        window of one upper read, after which the edit has the catalog to itself."""
        while time.monotonic() < until:
            upper = self._storage.upper()
            if upper == 0:  # nothing to fence (an empty write would make a shard that
                return False  # is not a catalog)
            try:
                self._storage.write([], expected_upper=upper, epoch=None)
                return True
            except LOST_RACES:
                continue
        return False

    def _debug_commit_once(self, edit: Callable[[Transaction], T], *, user: str) -> T:
        contents = self._read_initialized()
        objects = objects_of(contents, self.description)
        tx = Transaction(Cache(objects), base_upper=contents.upper, user=user)
        result = edit(tx)
        rows = tx.batch()
        if not rows:
            return result
        if {r[0] for r in rows} - {"config", "id_allocators", "audit_log"}:
            found = catalog_version(objects)
            if found != CATALOG_VERSION:
                raise IncompatibleCatalogVersion(
                    f"catalog {self.description} is at version {found}, this code's "
                    f"version is {CATALOG_VERSION}: edit it with that version's slatepy, "
                    "or open() it to migrate it first",
                    found=found,
                    code=CATALOG_VERSION,
                )
        try:
            self._storage.write(rows, expected_upper=contents.upper, epoch=None)
        except LOST_RACES as exc:
            raise _WriteLost(exc) from exc
        self._debug_wrote = True
        return result

    # -- reads ----------------------------------------------------------------------------

    def entries(self, name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every ``(key, value)`` of a collection as JSON-able dicts, sorted by key. Cached
        collections come from memory once opened; the rest are read from storage, by a
        leader only after confirming its leadership.

        Raises:
            FencedError: this state leads no more (uncached collections only).
        """
        coll = collection(name)
        with self._lock:  # never a cache half-way through applying a commit
            cached = coll.cached and self._mode in ("writable", "read_only")
            if cached:
                raw = list(self._cache.rows[name].items())
        if not cached:
            self._check_not_closed()
            if self._mode in ("writable", "fenced"):
                # As Materialize's persist catalog: a leader reads only while it leads.
                self.confirm_leadership()
            raw = self._storage.read_collection(name)
        try:
            items = [
                (msgspec.to_builtins(coll.decode_key(k)), msgspec.to_builtins(coll.decode_value(v)))
                for k, v in raw
            ]
        except msgspec.DecodeError as exc:  # unopened, on a catalog of another version
            raise CatalogError(
                f"catalog {self.description}: {name} holds an object this code's version "
                f"{CATALOG_VERSION} cannot read ({exc}): check_open() says why"
            ) from None
        return sorted(items, key=lambda kv: sort_key(kv[0]))

    def dump(self, *, ignore_large_collections: bool = False) -> str:
        """The catalog as stored now, as JSON: ``{"epoch": N, "collections": {name: [{"key",
        "value", "time", "diff"}]}}`` (a consolidated snapshot: every time is the upper
        minus one, every diff 1). Keys and values can be edited and passed back to the
        debug tool.

        Raises:
            UninitializedCatalog: there is nothing to dump.
        """
        self._check_not_closed()
        return dump_json(
            self._read_initialized(),
            description=self.description,
            ignore_large_collections=ignore_large_collections,
        )

    def current(self) -> Contents:
        """The stored contents now, with the epoch and who holds it (the debug tool)."""
        return self._read_initialized()

    def close(self) -> None:
        """Release the storage's connections and handles. Idempotent."""
        with self._lock:
            if self._mode != "closed":
                self._mode = "closed"
                self._storage.close()

    def __enter__(self) -> CatalogState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checks -----------------------------------------------------------------------------

    def _read_initialized(self) -> Contents:
        contents = self._storage.read()
        if contents.upper == 0:
            raise UninitializedCatalog(
                f"no catalog at {self.description}: `slatepy catalog init URL` (or open()) "
                "creates one"
            )
        return contents

    def _check_not_closed(self) -> None:
        if self._mode == "closed":
            raise CatalogError(f"catalog {self.description} is closed")

    def _check_unopened(self) -> None:
        self._check_not_closed()
        if self._mode != "unopened":
            raise CatalogError(f"catalog {self.description} is open already ({self._mode})")

    def _check_open(self) -> None:
        self._check_not_closed()
        if self._mode == "fenced":
            raise FencedError(f"catalog {self.description}: this state was fenced")
        if self._mode == "unopened":
            raise CatalogError(f"catalog {self.description} is not open: open() it first")

    def _check_writable(self) -> None:
        self._check_open()
        if self._mode != "writable":
            raise ReadOnlyCatalog(f"catalog {self.description} is open read-only")
