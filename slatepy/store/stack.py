"""The store stack a database, a reader, a compactor or a collector talks to.

From the bottom: the backend store for the URL (``open_store``), retries of idempotent
requests, then either a plain :class:`MetricsStore` or a :class:`DiskCachedStore`, which
counts the same way and also serves reads of immutable objects from a local disk cache
(RFC 0010). Composed here once so every entry point stacks the wrappers in the same order.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from slatepy.config import Settings
from slatepy.store.base import ObjectStore, WrappingStore
from slatepy.store.disk_cache import DiskCache, DiskCachedStore
from slatepy.store.metrics import MetricsStore
from slatepy.store.retry import with_retries
from slatepy.store.url import open_store

REMOTE_SCHEMES = ("s3", "gs", "az")
"""Schemes whose reads cross a network: ``disk_cache="auto"`` caches only these."""


def open_stack(url: str | ObjectStore, settings: Settings) -> MetricsStore:
    """The counted, retrying (and, where settings say so, disk-cached) store for ``url``.

    Args:
        url: A store URL, or a store to wrap (a test's shared memory store, a fault
            injector). A store that already has a disk cache in its stack gets no second one.
        settings: ``request_attempts`` and the ``disk_cache*`` settings are used here, the
            rest by ``open_store``.

    Raises:
        UnsupportedStore: the URL's scheme is not supported.
        InvalidArgument: the URL or settings are unusable.
    """
    inner = url if isinstance(url, ObjectStore) else open_store(url, settings)
    store = with_retries(inner, settings.request_attempts, give_up_after=settings.store_timeout)
    if not disk_cache_enabled(store.url, settings) or _has_disk_cache(store):
        return MetricsStore(store)
    cache = DiskCache.shared(disk_cache_dir(settings), settings.disk_cache_bytes)
    return DiskCachedStore(store, cache, namespace=cache_namespace(store.url, settings))


def disk_cache_enabled(url: str, settings: Settings) -> bool:
    """Whether reads of the store at ``url`` go through the disk cache.

    ``"auto"`` caches remote stores only: a ``file://`` store is a local disk already, and a
    ``memory://`` store is faster than any disk.
    """
    if settings.disk_cache == "auto":
        return urlsplit(url).scheme.lower() in REMOTE_SCHEMES
    return settings.disk_cache == "on"


def disk_cache_dir(settings: Settings) -> Path:
    """``disk_cache_dir``, else ``$XDG_CACHE_HOME/slatepy``, else ``~/.cache/slatepy``."""
    if settings.disk_cache_dir:
        return Path(settings.disk_cache_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "slatepy"


def cache_namespace(url: str, settings: Settings) -> str:
    """What tells this store's objects apart in a cache shared by every store on the machine.

    The URL names bucket and prefix but not the service: ``s3://b/p`` on MinIO and on AWS
    are different objects, so the endpoint (and Azure's account) is part of the namespace.
    """
    scheme = urlsplit(url).scheme.lower()
    env = os.environ
    if scheme == "s3":
        where = (
            settings.s3_endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        )
    elif scheme == "gs":
        where = settings.gcs_endpoint
    elif scheme == "az":
        account = settings.azure_account or env.get("AZURE_STORAGE_ACCOUNT_NAME")
        where = " ".join(filter(None, [account, settings.azure_endpoint])) or None
    else:
        where = None
    return f"{url} {where}" if where else url


def _has_disk_cache(store: ObjectStore) -> bool:
    layer: ObjectStore | None = store
    while layer is not None:
        if isinstance(layer, DiskCachedStore):
            return True
        layer = layer.inner if isinstance(layer, WrappingStore) else None
    return False
