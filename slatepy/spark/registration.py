"""Option ``catalog`` of the Spark sinks: the persist sink records its sink and shard, the KV
bulk load its database, in a durable catalog (RFC 0028 Addendum C). On the driver, when the
writer is made (before any task runs or anything is written), idempotently: a rerun or a
streaming query's restart finds its objects by name and writes nothing new."""

from __future__ import annotations

from slatepy.catalog import Database, Sink, strip_password
from slatepy.catalog.register import register

USER = "slatepy spark"
"""The audit log's user for a Spark sink's registration."""


def register_persist_sink(catalog: str, url: str, shard: str) -> None:
    """Record the ``slatepy.persist`` sink into ``shard`` at ``url``, and the shard."""
    name = f"{shard}@{strip_password(url)}"
    sink = Sink(
        name=name,
        kind="slatepy.persist",
        target=url,
        options={"shard": shard},
    )
    register(catalog, user=USER, sink=sink, shards=[(url, shard, "sink")])


def register_kv_database(catalog: str, url: str) -> None:
    """Record the KV database a ``slatepy`` bulk load writes (named by its location)."""
    name = strip_password(url)
    register(catalog, user=USER, database=Database(name, url))
