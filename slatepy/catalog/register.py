"""Registration: a pipeline records itself in a durable catalog (issue 31 item 6; RFC 0028
Addendum C).

``slatepy ingest --catalog URL`` records its source with its data and remap shards, the Spark
persist sink its sink and shard, the KV bulk load its database. Each registration is one
commit made as the debug tool's edits are (:meth:`CatalogState.debug_commit`): at the
catalog's current upper, retried while other writers win, without opening the catalog as a
leader (which would fence the deployment's own leader) and without bumping the epoch. It is
idempotent: objects are looked up by name first, an unchanged one writes nothing, a changed
one is updated in place under its id; so a rerun or restart neither duplicates nor trips a
uniqueness rule. Callers register *before* writing data, so a misconfigured catalog fails
with nothing written, and a failed write leaves a registration that a rerun finds again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from slatepy.catalog.errors import UninitializedCatalog
from slatepy.catalog.objects import Database, Shard, ShardKey, Sink, Source
from slatepy.catalog.open import open_catalog
from slatepy.catalog.transaction import Transaction
from slatepy.config import Settings
from slatepy.errors import NotFound

REGISTER_TIMEOUT = 30.0
"""Seconds a registration retries while other writers of the catalog win its upper."""

ShardSpec = tuple[str, str, str]
"""``(location URL, shard id, purpose)`` of a shard to record (owner: the registrant)."""


def register(
    catalog_url: str,
    *,
    user: str,
    source: Source | None = None,
    sink: Sink | None = None,
    database: Database | None = None,
    shards: Sequence[ShardSpec] = (),
    settings: Settings | None = None,
) -> None:
    """Record ``source``, ``sink`` and/or ``database`` and their ``shards`` (owned by the
    registrant's name) in the catalog at ``catalog_url``, in one idempotent commit.

    Raises:
        UninitializedCatalog: nothing is at ``catalog_url`` (``slatepy catalog init`` it
            first: a mistyped URL must not create a second, unseen catalog).
        InvalidCatalogObject: a value does not fit (or another object holds the name).
        SlatepyError: the catalog cannot be reached; nothing was recorded.
    """
    owner = next((o.name for o in (source, sink, database) if o is not None), "")

    def edit(tx: Transaction) -> None:
        if source is not None:
            _upsert(tx, "sources", "source", source)
        if sink is not None:
            _upsert(tx, "sinks", "sink", sink)
        if database is not None:
            _upsert(tx, "databases", "database", database)
        for location, shard, purpose in shards:
            key, value = ShardKey(location, shard), Shard(purpose, owner)
            if tx.get("shards", key) != msgspec.to_builtins(value):
                tx.register_shard(location, shard, purpose, owner)

    try:
        state = open_catalog(catalog_url, create=False, settings=settings, user=user)
    except NotFound:
        raise UninitializedCatalog(f"no catalog at {catalog_url} (nothing is there)") from None
    with state:
        state.debug_commit(edit, user=user, timeout=REGISTER_TIMEOUT)


def _upsert(tx: Transaction, collection: str, kind: str, obj: Any) -> None:
    """Create ``obj`` unless an object of its name exists; update that one when it differs."""
    wanted = msgspec.to_builtins(obj)
    for key, value in tx.entries(collection):
        if value.get("name") == obj.name:
            if value != wanted:
                tx.set(collection, key, obj)
            return
    if kind == "database":
        tx.create_database(obj.name, obj.url, owner=obj.owner)
    elif kind == "source":
        tx.create_source(obj)
    else:
        tx.create_sink(obj)
