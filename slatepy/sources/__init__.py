"""Sources: upstream services ingested into persist shards with bounded input reliance
(issue 30; design in ``docs/rfcs/0027-bounded-input-reliance.md``).

Layering: ``sources`` builds on ``persist`` (and ``errors``/``config``); ``cli`` and ``spark``
build on it. PostgreSQL needs the ``sources`` extra (psycopg2-binary for the replication
stream, psycopg 3 for nothing yet: see the RFC).
"""

from slatepy.sources.base import (
    Chunk,
    Event,
    OffsetFrontier,
    Progress,
    Source,
    SourceReader,
)
from slatepy.sources.errors import (
    IngestConflict,
    OffsetOutOfRange,
    SchemaChanged,
    SlotLost,
    SourceConfigError,
    SourceError,
    SourceUnavailable,
)
from slatepy.sources.ingest import Ingest, Stats, data_shards_of, remap_shard_of
from slatepy.sources.loadgen import LoadGen

__all__ = [
    "Chunk",
    "Event",
    "Ingest",
    "IngestConflict",
    "LoadGen",
    "OffsetFrontier",
    "OffsetOutOfRange",
    "Progress",
    "SchemaChanged",
    "SlotLost",
    "Source",
    "SourceConfigError",
    "SourceError",
    "SourceReader",
    "SourceUnavailable",
    "Stats",
    "data_shards_of",
    "remap_shard_of",
]
