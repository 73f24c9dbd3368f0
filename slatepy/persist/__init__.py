"""Persist shards: durable, definite time-varying collections of ``((key, value), time, diff)``
updates with ``upper``/``since`` frontiers, shared by writers and readers through the object
store (issue 13; design in ``docs/rfcs/0015-persist-shards.md``).

Layering: ``persist`` builds on ``table``, ``format``, ``store``, ``errors`` and ``config``,
never on the KV ``engine``, ``compactor``, ``gc`` or ``manifest``.
"""

from slatepy.persist.client import PersistClient
from slatepy.persist.codec import Update
from slatepy.persist.config import PersistSettings
from slatepy.persist.critical import SinceHandle
from slatepy.persist.errors import (
    Indeterminate,
    InvalidBounds,
    OpaqueMismatch,
    SinceError,
    StateConflictError,
    UpperMismatch,
    UsageError,
)
from slatepy.persist.read import Listen, Progress, ReadHandle, Updates
from slatepy.persist.write import Batch, BatchBuilder, WriteHandle

__all__ = [
    "Batch",
    "BatchBuilder",
    "Indeterminate",
    "InvalidBounds",
    "Listen",
    "OpaqueMismatch",
    "PersistClient",
    "PersistSettings",
    "Progress",
    "ReadHandle",
    "SinceError",
    "SinceHandle",
    "StateConflictError",
    "Update",
    "Updates",
    "UpperMismatch",
    "UsageError",
    "WriteHandle",
]
