"""Pure functions over a catalog's raw objects (RFC 0028 §4): a read as objects, the rows
between two sets of objects, the dump's JSON, and the audit event of an open."""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec

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


def objects_of(contents: Contents) -> Objects:
    objects: Objects = {}
    for name, key, value in contents.entries:
        objects.setdefault(name, {})[key] = value
    return objects


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


def dump_json(contents: Contents, *, ignore_large_collections: bool = False) -> str:
    """``{"epoch": N, "collections": {name: [{"key", "value", "time", "diff"}]}}`` of a
    consolidated read (every time is the upper minus one, every diff 1); no value shows a
    password (:func:`redact`: keys never hold one)."""
    objects = objects_of(contents)
    out: dict[str, Any] = {"epoch": contents.epoch, "collections": {}}
    for name in COLLECTIONS:
        if ignore_large_collections and name in LARGE_COLLECTIONS:
            continue
        rows = [
            {
                "key": msgspec.json.decode(k),
                "value": redact(msgspec.json.decode(v)),
                "time": contents.upper - 1,
                "diff": 1,
            }
            for k, v in objects.get(name, {}).items()
        ]
        out["collections"][name] = sorted(rows, key=lambda r: sort_key(r["key"]))
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
