"""The durable catalog: the record of what a slatepy deployment holds — databases, shards,
sources, sinks, settings, id allocation and an audit log — with one leader fenced by epoch,
versioned schema migrations and a debug tool (``slatepy catalog``). Issue 31; design in
``docs/rfcs/0028-durable-catalog.md``, usage in ``docs/catalog.md``.

Layering: ``catalog`` builds on ``persist`` (and below), never on ``engine``; ``cli`` builds on
it.
"""

from slatepy.catalog.errors import (
    CatalogContention,
    CatalogError,
    IncompatibleCatalogVersion,
    InvalidCatalogObject,
    MigrationNeeded,
    ReadOnlyCatalog,
    UninitializedCatalog,
)
from slatepy.catalog.objects import (
    CATALOG_VERSION,
    COLLECTIONS,
    Database,
    Shard,
    ShardKey,
    Sink,
    Source,
    StorageUsage,
    strip_password,
)
from slatepy.catalog.open import open_catalog, persist_catalog
from slatepy.catalog.shadow import ShadowCatalog, ShadowMismatch, open_shadow
from slatepy.catalog.state import CatalogState
from slatepy.catalog.transaction import Transaction

__all__ = [
    "CATALOG_VERSION",
    "COLLECTIONS",
    "CatalogContention",
    "CatalogError",
    "CatalogState",
    "Database",
    "IncompatibleCatalogVersion",
    "InvalidCatalogObject",
    "MigrationNeeded",
    "ReadOnlyCatalog",
    "ShadowCatalog",
    "ShadowMismatch",
    "Shard",
    "ShardKey",
    "Sink",
    "Source",
    "StorageUsage",
    "Transaction",
    "UninitializedCatalog",
    "open_catalog",
    "open_shadow",
    "persist_catalog",
    "strip_password",
]
