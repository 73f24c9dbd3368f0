"""Choosing a shard's ``Consensus`` from what the caller passed (RFC 0015 §3.3).

``PersistClient.open(blob_url, consensus=...)`` hands its ``consensus`` argument here:

* ``None``: the object-store log on the blob store itself (no server needed);
* ``"postgresql://..."`` (or ``postgres://``): a table in that PostgreSQL database;
* a :class:`Consensus` instance: used as is (tests, wrappers, a shared instance).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from slatepy.errors import InvalidArgument
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.objconsensus import DEFAULT_MIN_AGE, ObjectConsensus
from slatepy.store.base import ObjectStore

POSTGRES_SCHEMES = ("postgresql", "postgres")


def open_consensus(
    blob_store: ObjectStore,
    consensus: str | Consensus | None = None,
    *,
    min_age: float = DEFAULT_MIN_AGE,
    clock: Callable[[], float] = time.time,
    statement_timeout: float = 30.0,
    table: str | None = None,
) -> Consensus:
    """The consensus named by ``consensus`` for a client whose blob store is ``blob_store``.

    Args:
        blob_store: The client's blob store (the object-store log lives on it).
        consensus: ``None``, a PostgreSQL URL, or a ``Consensus``; see the module docstring.
        min_age: The object-store log's truncation guard (``consensus_min_age``).
        clock: The object-store log's wall clock (tests pass a fake one).
        statement_timeout: PostgreSQL's per-statement limit (``store_timeout``).
        table: PostgreSQL table name (default ``slatepy_consensus``).

    Raises:
        InvalidArgument: ``consensus`` is none of the above (the message names it, without
            a password), or the PostgreSQL URL is malformed.
        UnsupportedStore: a PostgreSQL URL, but psycopg is not installed.
    """
    if consensus is None:
        return ObjectConsensus(blob_store, min_age=min_age, clock=clock)
    if isinstance(consensus, Consensus):
        return consensus
    if isinstance(consensus, str) and _scheme(consensus) in POSTGRES_SCHEMES:
        try:
            from slatepy.persist.location.pgconsensus import DEFAULT_TABLE, PostgresConsensus
        except ImportError as exc:
            from slatepy.errors import UnsupportedStore

            raise UnsupportedStore(
                f"consensus={redact(consensus)!r} needs psycopg: pip install 'slatepy[postgres]'"
            ) from exc
        return PostgresConsensus(
            consensus, table=table or DEFAULT_TABLE, statement_timeout=statement_timeout
        )
    shown = redact(consensus) if isinstance(consensus, str) else f"a {type(consensus).__name__}"
    raise InvalidArgument(
        f"consensus={shown!r} is not supported: pass None (a log on the blob store), a "
        "postgresql:// URL, or a Consensus instance"
    )


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
