"""slatepy: a SlateDB-style LSM key-value store on object storage."""

from slatepy.config import Settings
from slatepy.engine import Db, DbReader, WriteBatch
from slatepy.engine.checkpoint import Checkpoint
from slatepy.engine.clone import clone
from slatepy.engine.wal_reader import WalHistoryGone, WalReader, WalRecord
from slatepy.errors import (
    AlreadyExists,
    ClosedError,
    CompactionAbandoned,
    CorruptionError,
    FencedError,
    InvalidArgument,
    InvalidType,
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
    "Checkpoint",
    "ClosedError",
    "CompactionAbandoned",
    "CorruptionError",
    "Db",
    "DbReader",
    "FencedError",
    "InvalidArgument",
    "InvalidType",
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
    "WalHistoryGone",
    "WalReader",
    "WalRecord",
    "WriteBatch",
    "WriteStalled",
    "WritesLost",
    "clone",
]
