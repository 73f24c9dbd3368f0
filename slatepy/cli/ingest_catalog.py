"""``slatepy ingest --catalog URL``: record the ingest's source, remap shard and data shards
in a durable catalog before it writes anything (RFC 0028 Addendum C)."""

from __future__ import annotations

import argparse

from slatepy.catalog import Source as CatalogSource
from slatepy.catalog import strip_password
from slatepy.catalog.register import register
from slatepy.config import Settings
from slatepy.sources import LoadGen, Source, data_shards_of, remap_shard_of

USER = "slatepy ingest"
"""The audit log's user for an ingest's registration."""


def source_name(shard: str, location: str) -> str:
    """The catalog name of the ingest into ``shard`` at ``location`` (unique per deployment:
    the same shard id at two locations is two ingests)."""
    return f"{shard}@{strip_password(location)}"


def register_ingest(args: argparse.Namespace, source: Source, settings: Settings) -> None:
    """Record the ingest of ``source`` that ``args`` describe in ``args.catalog``.

    Raises:
        SlatepyError: the catalog is missing or unreachable (nothing is written then).
    """
    data = data_shards_of(args.shard, source.outputs)
    remap = remap_shard_of(args.shard)
    if isinstance(source, LoadGen):
        kind, connection = "loadgen", ""
        options = {"partitions": str(args.partitions), "rate": str(args.rate)}
    else:
        kind, connection = "postgres", args.source
        options = {"publication": args.publication or ""}
        slot = getattr(source, "slot", None)
        if slot:
            options["slot"] = str(slot)
    record = CatalogSource(
        name=source_name(args.shard, args.into),
        kind=kind,
        connection=connection,  # the catalog drops any password (objects.strip_password)
        location=args.into,
        data_shard=args.shard,
        remap_shard=remap,
        options=options,
    )
    shards = [(args.into, remap, "remap")] + [(args.into, s, "data") for s in data]
    register(args.catalog, user=USER, source=record, shards=shards, settings=settings)
