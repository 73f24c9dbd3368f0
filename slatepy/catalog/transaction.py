"""The in-memory catalog and its transactions, shared by every implementation (RFC 0028 §4).

:class:`Cache` holds the cached collections as canonical key JSON -> value JSON, with an
index per uniqueness rule. A :class:`Transaction` reads through its own pending changes to the
cache it was made from (reads see its own writes), checks each collection's uniqueness rule
as it writes, and turns into one batch of rows: a retraction and an insertion per changed
key, an audit event per change (an id allocator's and an appended storage-usage sample's
included: every committed change is audited), and the audit allocator's new value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from slatepy.catalog.errors import InvalidCatalogObject, ReadOnlyCatalog
from slatepy.catalog.objects import (
    COLLECTIONS,
    MAX_USER_BYTES,
    AuditEvent,
    Collection,
    Database,
    IdAllocator,
    NameKey,
    Objects,
    Shard,
    ShardKey,
    Sink,
    Source,
    StorageUsage,
    StringValue,
    collection,
)
from slatepy.catalog.storage import Row
from slatepy.errors import InvalidArgument


class Cache:
    """The cached collections of an open catalog (see the module docstring)."""

    def __init__(self, objects: Objects | None = None) -> None:
        self.rows: dict[str, dict[bytes, bytes]] = {
            name: {} for name, c in COLLECTIONS.items() if c.cached
        }
        self.unique: dict[str, dict[object, bytes]] = {
            name: {} for name, c in COLLECTIONS.items() if c.unique is not None
        }
        for name, entries in (objects or {}).items():
            for key, value in entries.items():
                self._insert(name, key, value)

    def _insert(self, name: str, key: bytes, value: bytes) -> None:
        if name not in self.rows:
            return
        self.rows[name][key] = value
        unique = _unique_of(name, value)
        if unique is not None:
            self.unique[name][unique] = key

    def _remove(self, name: str, key: bytes) -> None:
        value = self.rows.get(name, {}).pop(key, None)
        unique = None if value is None else _unique_of(name, value)
        if unique is not None:
            self.unique[name].pop(unique, None)

    def apply(self, rows: Iterable[Row]) -> None:
        """Apply one committed batch (retractions first)."""
        for name, key, value, diff in sorted(rows, key=lambda r: r[3]):
            if diff < 0:
                self._remove(name, key)
            else:
                self._insert(name, key, value)


def _unique_of(name: str, value: bytes) -> object | None:
    """The unique part of a stored value (None: no rule, or a value of an older version,
    which the debug tool may see before a migration, or a corrupt one it may repair)."""
    rule = COLLECTIONS[name].unique
    if rule is None:
        return None
    try:
        return rule(COLLECTIONS[name].decode_value(value))
    except msgspec.DecodeError:  # also: not JSON at all (corrupt; the tool may repair it)
        return None


class Transaction:
    """Changes to an open catalog, committed at once by ``commit_transaction`` (or nothing).

    Attributes:
        base_upper: The upper of the cache it reads; a commit needs the catalog still there.
        user: Who makes the changes (recorded in the audit log).
    """

    def __init__(
        self,
        cache: Cache,
        *,
        base_upper: int,
        user: str = "",
        clock: Callable[[], float] = time.time,
        writable: bool = True,
    ) -> None:
        check_user(user)
        self._cache = cache
        self.base_upper = base_upper
        self.user = user
        self._clock = clock
        self._writable = writable
        self._pending: dict[str, dict[bytes, bytes | None]] = {}
        # The unique parts of the pending values: collection -> unique part -> key.
        self._pending_unique: dict[str, dict[object, bytes]] = {}
        self._appended: list[tuple[str, bytes, bytes]] = []
        self._batch: list[Row] | None = None

    # -- generic access (JSON-able dicts), as the debug tool needs ------------------------

    def get(self, name: str, key: Any) -> dict[str, Any] | None:
        """The value at ``key`` as this transaction sees it, or None."""
        coll = self._cached(name)
        return _json(self._get(coll.name, coll.key_bytes(key)))

    def entries(self, name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every ``(key, value)`` of a cached collection as this transaction sees it."""
        self._cached(name)
        merged: dict[bytes, bytes | None] = {
            **self._cache.rows[name],
            **self._pending.get(name, {}),
        }
        return [
            (msgspec.json.decode(k), _json(v) or {})
            for k, v in sorted(merged.items())
            if v is not None
        ]

    def set(self, name: str, key: Any, value: Any) -> dict[str, Any] | None:
        """Insert or replace; returns the previous value (None: there was none).

        Raises:
            InvalidCatalogObject: the key or value does not fit the collection, the
                collection is append-only, the value breaks its uniqueness rule, or it
                moves an id allocator backwards.
        """
        coll = self._mutable(name)
        key_b, value_b = coll.key_bytes(key), coll.value_bytes(value)
        coll.check_size(key_b, value_b)
        previous = self._get(name, key_b)
        self._check_unique(coll, key_b, value_b)
        if previous is not None and name == "id_allocators":
            now = msgspec.json.decode(value_b, type=IdAllocator).next_id
            try:
                was = msgspec.json.decode(previous, type=IdAllocator).next_id
            except msgspec.DecodeError:  # corrupt: the tool's repair may set any value
                was = now  # (a create still never replaces an object whose id is taken)
            if now < was:
                raise _rewound(key_b)
        self._put(coll, key_b, value_b)
        return _json(previous)

    def delete(self, name: str, key: Any) -> dict[str, Any] | None:
        """Delete ``key``; returns the value it had (None: it had none, nothing changes).

        Raises:
            InvalidCatalogObject: an id allocator (its ids would be handed out again).
        """
        coll = self._mutable(name)
        key_b = coll.key_bytes(key)
        previous = self._get(name, key_b)
        if previous is not None and name == "id_allocators":
            raise _rewound(key_b)
        if previous is not None:
            self._put(coll, key_b, None)
        return _json(previous)

    # -- typed methods ---------------------------------------------------------------------

    def allocate_ids(self, kind: str, amount: int = 1) -> list[int]:
        """``amount`` fresh ids of ``kind`` (never handed out again once committed)."""
        current = self.get("id_allocators", NameKey(kind))
        start = 1 if current is None else int(current["next_id"])
        self.set("id_allocators", NameKey(kind), IdAllocator(start + amount))
        return list(range(start, start + amount))

    def create_database(self, name: str, url: str, *, owner: str = "") -> int:
        """Record a KV database; returns its id. A taken name raises and changes nothing."""
        return self._create("database", "databases", Database(name, url, owner))

    def create_source(self, source: Source) -> int:
        """Record a source (its connection string loses any password); returns its id."""
        return self._create("source", "sources", source)

    def create_sink(self, sink: Sink) -> int:
        return self._create("sink", "sinks", sink)

    def _create(self, kind: str, name: str, value: Any) -> int:
        """Insert ``value`` under a fresh id of ``kind``; if it is refused (also: the id is
        somehow taken already: a create never replaces), the id is not taken either."""
        alloc_key = COLLECTIONS["id_allocators"].key_bytes(NameKey(kind))
        pending = self._pending.setdefault("id_allocators", {})
        had, before = alloc_key in pending, pending.get(alloc_key)
        (new_id,) = self.allocate_ids(kind)
        try:
            if self.get(name, {"id": new_id}) is not None:
                raise InvalidCatalogObject(
                    f"{name}: id {new_id} (the next {kind} id) is taken already; "
                    "the id allocator is behind the collection"
                )
            self.set(name, {"id": new_id}, value)
        except Exception:
            if had:
                pending[alloc_key] = before
            else:
                del pending[alloc_key]
            raise
        return new_id

    def register_shard(self, location: str, shard: str, purpose: str, owner: str = "") -> None:
        self.set("shards", ShardKey(location, shard), Shard(purpose, owner))

    def set_config(self, key: str, value: int) -> None:
        self.set("config", {"key": key}, {"value": value})

    def set_setting(self, name: str, value: str) -> None:
        self.set("settings", NameKey(name), StringValue(value))

    def set_system_configuration(self, name: str, value: str) -> None:
        self.set("system_configurations", NameKey(name), StringValue(value))

    def record_storage_usage(self, usage: StorageUsage) -> int:
        """Append one storage-usage sample (an append-only, uncached collection)."""
        self._check_writable()
        coll = COLLECTIONS["storage_usage"]
        value = coll.value_bytes(usage)
        coll.check_size(b'{"id":0}', value)
        (new_id,) = self.allocate_ids("storage_usage")
        self._appended.append(("storage_usage", coll.key_bytes({"id": new_id}), value))
        return new_id

    # -- the batch ---------------------------------------------------------------------------

    def batch(self) -> list[Row]:
        """The rows this transaction commits (computed once; the transaction is then frozen).
        Each changed key and each appended sample appends one audit event."""
        if self._batch is not None:
            return self._batch
        events = [
            (kind, name, key)
            for name, changes in self._pending.items()
            for key, new in changes.items()
            if (kind := _change(self._cache.rows[name].get(key), new)) is not None
        ] + [("create", name, key) for name, key, _ in self._appended]
        appended = list(self._appended)
        if events:
            now_ms = int(self._clock() * 1000)
            audit = COLLECTIONS["audit_log"]
            ids = self.allocate_ids("audit_log", len(events))
            for new_id, (kind, name, key) in zip(ids, events, strict=True):
                event = AuditEvent(kind, name, msgspec.json.decode(key), self.user, now_ms)
                appended.append(
                    ("audit_log", audit.key_bytes({"id": new_id}), audit.value_bytes(event))
                )
        rows: list[Row] = []
        for name, changes in self._pending.items():
            for key, new in changes.items():
                old = self._cache.rows[name].get(key)
                if old == new:
                    continue
                if old is not None:
                    rows.append((name, key, old, -1))
                if new is not None:
                    rows.append((name, key, new, 1))
        rows.extend((name, key, value, 1) for name, key, value in appended)
        self._batch = rows
        self._writable = False
        return rows

    # -- helpers ------------------------------------------------------------------------------

    def _get(self, name: str, key: bytes) -> bytes | None:
        pending = self._pending.get(name, {})
        if key in pending:
            return pending[key]
        return self._cache.rows[name].get(key)

    def _cached(self, name: str) -> Collection:
        coll = collection(name)
        if not coll.cached:
            raise InvalidCatalogObject(
                f"collection {name!r} is not cached: read it from the catalog, not a transaction"
            )
        return coll

    def _check_writable(self) -> None:
        if not self._writable:
            raise ReadOnlyCatalog(
                "this transaction cannot change anything: its catalog is read-only, or it "
                "was committed already"
            )

    def _mutable(self, name: str) -> Collection:
        self._check_writable()
        coll = collection(name)
        if coll.append_only:
            raise InvalidCatalogObject(
                f"collection {name!r} is append-only: commits append to it, nothing edits it"
            )
        return coll

    def _put(self, coll: Collection, key: bytes, value: bytes | None) -> None:
        pending = self._pending.setdefault(coll.name, {})
        if coll.unique is not None:
            index = self._pending_unique.setdefault(coll.name, {})
            old = pending.get(key)
            if old is not None:
                index.pop(coll.unique(coll.decode_value(old)), None)
            if value is not None:
                index[coll.unique(coll.decode_value(value))] = key
        pending[key] = value

    def _check_unique(self, coll: Collection, key: bytes, value: bytes) -> None:
        if coll.unique is None:
            return
        wanted = coll.unique(coll.decode_value(value))
        other = self._pending_unique.get(coll.name, {}).get(wanted)
        if other is not None and other != key:
            raise _taken(coll, wanted, other)
        owner = self._cache.unique[coll.name].get(wanted)
        if owner is not None and owner != key and owner not in self._pending.get(coll.name, {}):
            raise _taken(coll, wanted, owner)


def check_user(user: str) -> None:
    """Raise unless ``user`` fits an audit event (:data:`MAX_USER_BYTES`).

    Raises:
        InvalidArgument: it does not.
    """
    if len(user.encode(errors="replace")) > MAX_USER_BYTES:
        raise InvalidArgument(
            f"user {user[:40]!r}...: at most {MAX_USER_BYTES} bytes (audit events record it)"
        )


def _rewound(key: bytes) -> InvalidCatalogObject:
    return InvalidCatalogObject(
        f"id_allocators {key.decode()}: an id allocator never moves backwards nor goes away "
        "(its ids would be handed out again)"
    )


def _taken(coll: Collection, wanted: object, owner: bytes) -> InvalidCatalogObject:
    return InvalidCatalogObject(
        f"{coll.name}: {wanted!r} is taken already (by key {owner.decode()}); each is unique"
    )


def _change(old: bytes | None, new: bytes | None) -> str | None:
    if old == new:
        return None
    return "create" if old is None else "delete" if new is None else "update"


def _json(raw: bytes | None) -> dict[str, Any] | None:
    """A stored value as a dict (as stored: also one of an older version, before a
    migration, which the debug tool may replace); one that is not JSON (corrupt) as
    ``{"unreadable": its text}``, so that the tool shows what it replaces or deletes."""
    if raw is None:
        return None
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {"unreadable": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"unreadable": raw.decode(errors="replace")}
