"""slatepy: a SlateDB-style LSM key-value store on object storage."""

from slatepy.config import Settings
from slatepy.engine import Db, DbReader, WriteBatch
from slatepy.errors import (
    AlreadyExists,
    ClosedError,
    CompactionAbandoned,
    CorruptionError,
    FencedError,
    InvalidArgument,
    ManifestConflictError,
    NotASlatepyDatabase,
    NotDurable,
    NotFound,
    PreconditionFailed,
    SlatepyError,
    StoreError,
    StoreUnavailable,
    TransactionConflict,
    WritesLost,
    WriteStalled,
)

__all__ = [
    "AlreadyExists",
    "ClosedError",
    "CompactionAbandoned",
    "CorruptionError",
    "Db",
    "DbReader",
    "FencedError",
    "InvalidArgument",
    "ManifestConflictError",
    "NotASlatepyDatabase",
    "NotDurable",
    "NotFound",
    "PreconditionFailed",
    "Settings",
    "SlatepyError",
    "StoreError",
    "StoreUnavailable",
    "TransactionConflict",
    "WriteBatch",
    "WriteStalled",
    "WritesLost",
]
