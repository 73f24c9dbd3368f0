"""Object-store access: one interface over obstore, selected by URL, plus wrappers."""

from slatepy.store.base import IfMatch, ObjectMeta, ObjectStore, PutMode
from slatepy.store.metrics import MetricsStore, OpStats, StoreMetrics
from slatepy.store.obstore_store import ObstoreStore
from slatepy.store.url import open_store

__all__ = [
    "IfMatch",
    "MetricsStore",
    "ObjectMeta",
    "ObjectStore",
    "ObstoreStore",
    "OpStats",
    "PutMode",
    "StoreMetrics",
    "open_store",
]
