"""A local disk cache of immutable object-store data (RFC 0010).

:class:`DiskCache` keeps checksummed parts of objects in a directory that every process on
the machine may share; :class:`DiskCachedStore` serves ranged reads from it and counts what
it saved in the store metrics. :func:`slatepy.store.stack.open_stack` decides when to use it.
"""

from slatepy.store.disk_cache.cache import DiskCache, EntryName, Evicted, Piece, Usage
from slatepy.store.disk_cache.entry import CorruptCacheEntry
from slatepy.store.disk_cache.store import (
    CACHEABLE_PREFIXES,
    FILL_LIMIT,
    PART_SIZE,
    DiskCachedStore,
)

__all__ = [
    "CACHEABLE_PREFIXES",
    "FILL_LIMIT",
    "PART_SIZE",
    "CorruptCacheEntry",
    "DiskCache",
    "DiskCachedStore",
    "EntryName",
    "Evicted",
    "Piece",
    "Usage",
]
