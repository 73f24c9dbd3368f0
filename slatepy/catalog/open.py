"""``open_catalog(url)``: the catalog implementation a URL names (RFC 0028 §6)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

from slatepy.catalog.objects import strip_password
from slatepy.catalog.persist import PersistStorage
from slatepy.catalog.sql import SqlStorage
from slatepy.catalog.state import CatalogState
from slatepy.catalog.storage import Storage
from slatepy.config import Settings, SettingsLike
from slatepy.errors import InvalidArgument, SlatepyError
from slatepy.persist import PersistClient, PersistSettings


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:`` URL, SQLAlchemy's way: ``sqlite:////abs/path.db`` (four
    slashes) is absolute, ``sqlite:///rel/path.db`` (three) relative to the working
    directory.

    Raises:
        InvalidArgument: not ``sqlite:///...`` with a path, or with a query (SQLAlchemy's
            driver options, which this stash does not take: not part of a file name).
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix) or "?" in url:
        raise InvalidArgument(
            f"{url!r}: a SQLite catalog URL is sqlite:////absolute/path.db or "
            "sqlite:///relative/path.db"
        )
    return url[len(prefix) :]


def _store_settings(
    settings: SettingsLike, store_settings: Settings | None, caller: str
) -> SettingsLike:
    """``settings=``, or the deprecated ``store_settings=`` (with a ``DeprecationWarning``)."""
    if store_settings is None:
        return settings
    if settings is not None:
        raise InvalidArgument(f"{caller}: pass settings= or store_settings= (deprecated), not both")
    warnings.warn(
        f"{caller}(store_settings=) is deprecated: pass settings=", DeprecationWarning, stacklevel=3
    )
    return store_settings


def open_storage(
    url: str,
    *,
    shard: str = "catalog",
    consensus: str | None = None,
    settings: SettingsLike = None,
    persist_settings: PersistSettings | None = None,
    create: bool = True,
    store_settings: Settings | None = None,
) -> Storage:
    """The storage ``url`` names (see :func:`open_catalog`; ``store_settings=`` is a
    deprecated alias of ``settings=``)."""
    settings = _store_settings(settings, store_settings, "open_storage")
    if consensus is not None and url.startswith(("sqlite:", "postgresql://", "postgres://")):
        raise InvalidArgument(
            f"a consensus ({strip_password(consensus)}) is for a persist catalog; "
            f"{strip_password(url)} is a SQL one, which has none"
        )
    if url.startswith("sqlite:"):
        return SqlStorage(sqlite_path=sqlite_path(url), shard=shard, description=url)
    if url.startswith(("postgresql://", "postgres://")):
        return SqlStorage(postgres_url=url, shard=shard, description=strip_password(url))
    try:
        client = PersistClient.open(
            url,
            consensus=consensus,
            settings=settings,
            persist_settings=persist_settings,
            create=create,
        )
    except SlatepyError as exc:  # persist's message may quote the URLs, passwords and all
        for given in (url, consensus):
            if given:
                exc.args = tuple(
                    a.replace(given, strip_password(given)) if isinstance(a, str) else a
                    for a in exc.args
                )
        raise
    return PersistStorage(
        client, shard, owns_client=True, description=f"{strip_password(url)} (shard {shard})"
    )


def open_catalog(
    url: str,
    *,
    shard: str = "catalog",
    consensus: str | None = None,
    settings: SettingsLike = None,
    persist_settings: PersistSettings | None = None,
    create: bool = True,
    clock: Callable[[], float] = time.time,
    user: str = "",
    deploy_generation: int | None = None,
    store_settings: Settings | None = None,
) -> CatalogState:
    """An **unopened** catalog state at ``url``: ``open()``, ``open_read_only()`` or only
    read it before opening.

    Args:
        url: ``sqlite:////abs/path.db`` (or ``sqlite:///relative.db``): the SQL stash in
            SQLite; ``postgresql://user@host/db``: the stash in PostgreSQL; any persist
            location (``file:///...``, ``s3://...``, ``memory://``): one persist shard.
        shard: The persist shard; in SQL, the tables' name prefix.
        consensus: The persist consensus (``postgresql://...``; default: on the store;
            refused for a SQL catalog, which has none).
        settings: The store's settings, as ``PersistClient.open`` takes them (a
            ``Settings``, a dict or a TOML path, over ``SLATEPY_*``; persist only).
        create: Create a missing ``file://`` location (persist only; False: ``NotFound``).
        clock: Wall clock for audit events.
        user: Recorded in the audit log with every commit.
        deploy_generation: Set config ``deploy_generation`` at ``open()``.
        store_settings: Deprecated alias of ``settings`` (a ``DeprecationWarning``).
    """
    storage = open_storage(
        url,
        shard=shard,
        consensus=consensus,
        settings=_store_settings(settings, store_settings, "open_catalog"),
        persist_settings=persist_settings,
        create=create,
    )
    return CatalogState(storage, clock=clock, user=user, deploy_generation=deploy_generation)


def persist_catalog(
    client: PersistClient, shard: str = "catalog", **kwargs: object
) -> CatalogState:
    """An unopened catalog in ``shard`` of an existing ``client`` (not closed with it):
    two of these on one ``memory://`` client share the catalog."""
    storage = PersistStorage(client, shard, owns_client=False, description=f"shard {shard}")
    return CatalogState(storage, **kwargs)  # type: ignore[arg-type]
