"""Pure functions over a catalog's raw objects (RFC 0028 §4): a read as objects, the rows
between two sets of objects, the dump's JSON, and the audit event of an open."""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec

from slatepy.catalog.errors import CatalogError
from slatepy.catalog.objects import (
    COLLECTIONS,
    LARGE_COLLECTIONS,
    AuditEvent,
    ConfigKey,
    IdAllocator,
    NameKey,
    Objects,
    redact,
)
from slatepy.catalog.storage import Contents, Row
from slatepy.catalog.upgrade import catalog_version


def holder() -> str:
    """Who this process is, for the fence row (``host:pid``)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def objects_of(contents: Contents, description: str = "") -> Objects:
    """The live rows of a read as ``collection -> key -> value``.

    Raises:
        CatalogError: a key holds more than one live value (corruption: no commit makes
            that, and taking either would let the key's value change with no commit).
    """
    objects: Objects = {}
    counts: dict[tuple[str, bytes], int] = {}
    for name, key, value in contents.entries:
        entries = objects.setdefault(name, {})
        if key in entries:
            counts[name, key] = counts.get((name, key), 1) + 1
        entries[key] = value
    if counts:
        (name, key), count = next(iter(counts.items()))
        raise CatalogError(
            f"catalog {description}: corrupt: {name} {_text(key)} holds {count} values at once"
        )
    return objects


def _text(key: bytes) -> str:
    return key.decode(errors="replace")


def check_objects(objects: Objects, description: str) -> None:
    """Raise unless every object is one this code's version reads: it is of a collection of
    this version and its key and value decode as that collection's types. What an open, a
    read-only open and ``check_open`` ask of a catalog (after migrating it), so that a
    leader never caches what its reads then fail on, and ``check_open`` (the upgrade check)
    says yes only when ``open`` would succeed.

    Raises:
        CatalogError: naming the first object that does not decode, and why (msgspec's
            reason names the field, never the value: it may hold a password), a
            collection this version does not have, or two objects of one unique name.
    """
    for name, entries in objects.items():
        coll = COLLECTIONS.get(name)
        if coll is None:  # a newer version's was refused by the version check before
            raise CatalogError(
                f"catalog {description}: corrupt: it holds collection {name!r}, which this "
                "version does not have"
            )
        owners: dict[object, bytes] = {}
        items = sorted(entries.items()) if coll.unique is not None else entries.items()
        for key, value in items:
            try:
                coll.decode_key(key)
                decoded = coll.decode_value(value)
            except msgspec.DecodeError as exc:
                raise corrupt(description, name, key, exc) from None
            if coll.unique is not None:
                owner = owners.setdefault(coll.unique(decoded), key)
                if owner != key:
                    raise CatalogError(
                        f"catalog {description}: corrupt: {name} {coll.unique(decoded)!r} "
                        f"is held by {_text(owner)} and {_text(key)}; each is unique"
                    )


def corrupt(description: str, name: str, key: bytes, exc: Exception) -> CatalogError:
    """The error of an object that does not decode (see :func:`check_objects`)."""
    return CatalogError(
        f"catalog {description}: corrupt: {name} {_text(key)} does not decode ({exc}); "
        "`slatepy catalog edit` or `delete` repairs it"
    )


def sort_key(key: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(key.values())


def diff_objects(old: Objects, new: Objects) -> list[Row]:
    """The rows that turn ``old`` into ``new``."""
    rows: list[Row] = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name, {}), new.get(name, {})
        for key in before.keys() | after.keys():
            was, now = before.get(key), after.get(key)
            if was == now:
                continue
            if was is not None:
                rows.append((name, key, was, -1))
            if now is not None:
                rows.append((name, key, now, 1))
    return rows


def dump_json(
    contents: Contents, *, description: str = "", ignore_large_collections: bool = False
) -> str:
    """``{"epoch": N, "collections": {name: [{"key", "value", "time", "diff"}]}}`` of a
    consolidated read (every time is the upper minus one, every diff 1); no value shows a
    password (:func:`redact`: keys never hold one). Collections this code does not know (a
    newer version's) follow its own, so the dump is always the whole catalog.

    Raises:
        CatalogError: an object is not JSON (corrupt), naming it.
    """
    objects = objects_of(contents, description)
    out: dict[str, Any] = {"epoch": contents.epoch, "collections": {}}
    for name in [*COLLECTIONS, *sorted(objects.keys() - COLLECTIONS.keys())]:
        if ignore_large_collections and name in LARGE_COLLECTIONS:
            continue
        rows = []
        for k, v in objects.get(name, {}).items():
            try:
                key, value = msgspec.json.decode(k), msgspec.json.decode(v)
            except msgspec.DecodeError as exc:
                raise corrupt(description, name, k, exc) from None
            rows.append({"key": key, "value": redact(value), "time": contents.upper - 1, "diff": 1})
        if name in COLLECTIONS:
            rows.sort(key=lambda r: sort_key(r["key"]))
        else:  # no schema: the keys' values may not compare
            rows.sort(key=lambda r: msgspec.json.encode(r["key"]))
        out["collections"][name] = rows
    return msgspec.json.encode(out).decode()


def add_open_event(objects: Objects, event: str, *, epoch: int, user: str, now_ms: int) -> None:
    """Append to ``objects`` (and its audit id allocator) the audit event of an open:
    ``event`` ``initialize``, ``migrate`` or ``open``; its key records the epoch taken and
    the version and deploy generation the open leaves (every open changes the catalog, if
    only its epoch, so every open is audited)."""
    alloc_key = msgspec.json.encode(NameKey("audit_log"))
    allocators = objects.setdefault("id_allocators", {})
    raw = allocators.get(alloc_key)
    next_id = 1 if raw is None else msgspec.json.decode(raw, type=IdAllocator).next_id
    allocators[alloc_key] = msgspec.json.encode(IdAllocator(next_id + 1))
    generation = objects.get("config", {}).get(msgspec.json.encode(ConfigKey("deploy_generation")))
    key = {
        "epoch": epoch,
        "catalog_version": catalog_version(objects),
        "deploy_generation": None
        if generation is None
        else msgspec.json.decode(generation)["value"],
    }
    record = AuditEvent(event, "config", key, user, now_ms)
    audit = objects.setdefault("audit_log", {})
    audit[msgspec.json.encode({"id": next_id})] = msgspec.json.encode(record)
