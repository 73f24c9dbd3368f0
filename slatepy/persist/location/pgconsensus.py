"""``Consensus`` in PostgreSQL (RFC 0015 §3.3): ``consensus="postgresql://..."``.

One table holds every key's log, one row per entry, primary key ``(shard, seqno)``; a second
(``{table}_shards``) one row per key ever written, which makes the first insert safe. One
psycopg 3 connection per instance in autocommit mode (every statement is its own READ
COMMITTED transaction: one round trip), guarded by a lock, opened on first use and again
after it breaks. The table is created on first connection under an advisory lock
(concurrent ``CREATE TABLE IF NOT EXISTS`` can fail on the catalog's unique index).

Errors: anything failing before a statement is sent (``connect``: refused, unknown host,
authentication, missing database) is ``StoreUnavailable(definite=True)``; a connection lost
or a statement cancelled (``statement_timeout``) after sending is indefinite, and
``compare_and_set`` resolves it by reading the row back on a new connection. Reads and
``truncate`` are idempotent and are tried once more on a fresh connection when an idle one
turns out to be dead (a server restart). ``statement_timeout`` bounds every statement
server-side; ``connect_timeout`` bounds connecting.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from slatepy.errors import ClosedError, InvalidArgument, StoreUnavailable
from slatepy.persist.location.consensus import (
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    check_data,
    check_key,
    check_limit,
    check_seqno,
    next_seqno,
)

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

DEFAULT_TABLE = "slatepy_consensus"
SCHEMA_LOCK = 7394611205316437
"""The advisory lock id serializing schema creation (any constant every client agrees on)."""
TABLE_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,55}")
"""Lower-case identifiers short enough that ``{table}_shards`` fits PostgreSQL's 63 bytes."""


class _Queries:
    """The statements for one table name (composed once, quoted as identifiers).

    Two tables: ``{table}`` holds the entries; ``{table}_shards`` one row per key that ever
    had an entry, claimed by the key's first insert and never deleted (see
    :meth:`PostgresConsensus.compare_and_set` for why).
    """

    def __init__(self, table: str) -> None:
        t = sql.Identifier(table)
        shards = sql.Identifier(f"{table}_shards")
        self.create = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {t} ("
                " shard text NOT NULL,"
                " seqno bigint NOT NULL CHECK (seqno > 0),"
                " data bytea NOT NULL,"
                " PRIMARY KEY (shard, seqno))"
            ).format(t=t),
            sql.SQL("CREATE TABLE IF NOT EXISTS {shards} (shard text PRIMARY KEY)").format(
                shards=shards
            ),
        ]
        # See PostgresConsensus.compare_and_set for why these are atomic.
        self.cas_first = sql.SQL(
            "WITH claim AS ("
            " INSERT INTO {shards} (shard) VALUES (%(shard)s)"
            " ON CONFLICT (shard) DO NOTHING RETURNING shard)"
            " INSERT INTO {t} (shard, seqno, data)"
            " SELECT shard, 1, %(data)s FROM claim"
            " ON CONFLICT (shard, seqno) DO NOTHING"
        ).format(t=t, shards=shards)
        self.cas_next = sql.SQL(
            "INSERT INTO {t} (shard, seqno, data)"
            " SELECT shard, %(new)s, %(data)s FROM {t}"
            " WHERE shard = %(shard)s AND seqno = %(expected)s"
            " FOR KEY SHARE"
            " ON CONFLICT (shard, seqno) DO NOTHING"
        ).format(t=t)
        self.head = sql.SQL(
            "SELECT seqno, data FROM {t} WHERE shard = %(shard)s ORDER BY seqno DESC LIMIT 1"
        ).format(t=t)
        self.read = sql.SQL(
            "SELECT data FROM {t} WHERE shard = %(shard)s AND seqno = %(seqno)s"
        ).format(t=t)
        self.scan = sql.SQL(
            "SELECT seqno, data FROM {t} WHERE shard = %(shard)s AND seqno >= %(from)s"
            " ORDER BY seqno LIMIT %(limit)s"
        ).format(t=t)
        # Never the head: only rows below one that exists at or above ``seqno``.
        self.truncate = sql.SQL(
            "DELETE FROM {t} WHERE shard = %(shard)s AND seqno < %(seqno)s"
            " AND EXISTS (SELECT 1 FROM {t} WHERE shard = %(shard)s AND seqno >= %(seqno)s)"
        ).format(t=t)
        # One index probe per key, not a scan of every entry.
        self.keys = sql.SQL(
            "SELECT s.shard FROM {shards} s"
            " WHERE EXISTS (SELECT 1 FROM {t} WHERE shard = s.shard) ORDER BY s.shard"
        ).format(t=t, shards=shards)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresConsensus(Consensus):
    """Consensus in a PostgreSQL table; see the module docstring.

    Args:
        url: A libpq URL or conninfo (``postgresql://user@host:port/db?sslmode=...``).
        table: The table (created if missing); tests give each test its own.
        statement_timeout: Seconds any statement may run on the server.
        connect_timeout: Seconds connecting may take (libpq rounds up, at least 2).
        cas_attempts: Statement attempts per ``compare_and_set`` after failures that are
            definite, or uncertain and resolved by a read-back that found nothing.
        backoff: Seconds before the second attempt, doubling after each.

    Raises:
        InvalidArgument: ``url`` is not a valid conninfo, or ``table`` not a plain
            lower-case identifier. Nothing connects until the first call.
    """

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        statement_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        cas_attempts: int = 3,
        backoff: float = 0.02,
    ) -> None:
        try:
            info = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise InvalidArgument(f"consensus URL is not a PostgreSQL URL: {exc}") from None
        if TABLE_PATTERN.fullmatch(table) is None:
            raise InvalidArgument(f"table {table!r} must match {TABLE_PATTERN.pattern}")
        if statement_timeout <= 0 or connect_timeout <= 0 or cas_attempts < 1:
            raise InvalidArgument(
                "statement_timeout and connect_timeout must be > 0 and cas_attempts >= 1"
            )
        self._url = url
        self._where = (
            f"postgresql://{info.get('host', 'localhost')}:{info.get('port', 5432)}"
            f"/{info.get('dbname', '')} (table {table})"
        )
        options = f"-c statement_timeout={math.ceil(statement_timeout * 1000)}"
        self._options = f"{info['options']} {options}" if info.get("options") else options
        self._connect_timeout = max(2, math.ceil(connect_timeout))
        self._attempts = cas_attempts
        self._backoff = backoff
        self._q = _Queries(table)
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._schema_ready = False
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresConsensus({self._where!r})"

    # Connections.

    def _connection(self) -> Connection:
        """The open connection, connecting (and creating the table) if there is none.

        Raises:
            StoreUnavailable: ``definite=True``: no connection, nothing was sent.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop()
        try:
            conn = psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=self._connect_timeout,
                options=self._options,
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"connecting to {self._where} failed: {_first_line(exc)}", definite=True
            ) from exc
        if not self._schema_ready:
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                    for statement in self._q.create:
                        conn.execute(statement)
            except psycopg.Error as exc:
                conn.close()
                raise StoreUnavailable(
                    f"creating the consensus table on {self._where} failed: {_first_line(exc)}",
                    definite=True,
                ) from exc
            self._schema_ready = True
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # broken already: nothing to release
                conn.close()

    def _run(
        self, what: str, op: Callable[[Connection], T], *, mutating: bool, idempotent: bool
    ) -> T:
        """``op(connection)`` under the lock, with errors mapped to ``StoreUnavailable``.

        Args:
            mutating: ``op`` writes: a connection lost after sending it leaves its outcome
                unknown (``definite=False``). Reads always fail definitely.
            idempotent: If a connection that was already open fails, try ``op`` once more
                on a new one (an idle connection may have died with a server restart).

        Raises:
            StoreUnavailable: ``definite`` False if a write may have taken effect.
        """
        with self._lock:
            reused = self._conn is not None
            maybe_sent = False  # a mutating op may have reached the server
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                except StoreUnavailable as exc:
                    if maybe_sent:
                        raise StoreUnavailable(str(exc), definite=False) from exc
                    raise
                try:
                    return op(conn)
                except psycopg.OperationalError as exc:
                    self._drop()
                    maybe_sent = maybe_sent or mutating
                    if attempt == 1 and idempotent and reused:
                        continue
                    raise StoreUnavailable(
                        f"{what} on {self._where}: the connection failed "
                        f"({_first_line(exc)})"
                        + ("; the statement may have taken effect" if maybe_sent else ""),
                        definite=not maybe_sent,
                    ) from exc
                except psycopg.Error as exc:
                    # The server refused the statement: autocommit rolled it back.
                    raise StoreUnavailable(
                        f"{what} on {self._where} failed: {_first_line(exc)}",
                        definite=not maybe_sent,
                    ) from exc
            raise AssertionError("unreachable: the second attempt returns or raises")

    # Reads.

    def head(self, key: str) -> VersionedData | None:
        check_key(key)

        def op(conn: Connection) -> tuple[Any, ...] | None:
            return conn.execute(self._q.head, {"shard": key}).fetchone()

        row = self._run(f"head({key!r})", op, mutating=False, idempotent=True)
        return None if row is None else VersionedData(int(row[0]), bytes(row[1]))

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        check_key(key)
        check_seqno(from_seqno, "from_seqno", minimum=0)
        check_limit(limit)
        params = {"shard": key, "from": from_seqno, "limit": limit}

        def op(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(self._q.scan, params).fetchall()

        rows = self._run(f"scan({key!r}, {from_seqno})", op, mutating=False, idempotent=True)
        return [VersionedData(int(seqno), bytes(data)) for seqno, data in rows]

    def list_keys(self) -> list[str]:
        def op(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(self._q.keys).fetchall()

        return [str(row[0]) for row in self._run("list_keys", op, mutating=False, idempotent=True)]

    def _read(self, key: str, seqno: int) -> bytes | None:
        def op(conn: Connection) -> tuple[Any, ...] | None:
            return conn.execute(self._q.read, {"shard": key, "seqno": seqno}).fetchone()

        row = self._run(f"read({key!r}, {seqno})", op, mutating=False, idempotent=True)
        return None if row is None else bytes(row[0])

    # Writes.

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CasResult:
        """Insert ``data`` at ``expected + 1`` in one statement.

        Why one statement is atomic under READ COMMITTED (no SERIALIZABLE, no explicit
        transaction): "``expected`` is the head" is "row ``expected`` exists and row
        ``expected + 1`` does not", because rows are only inserted at head + 1 and deleted
        only below an existing higher row (``truncate``), so a log is always contiguous.

        * Row ``expected + 1`` absent: the primary key decides. Concurrent inserts of the same
          ``(shard, seqno)`` serialize on the unique index; a later one waits for an
          uncommitted earlier one and, once that commits, takes ``ON CONFLICT DO NOTHING``
          (rowcount 0). No unique-violation error, and at most one row per seqno.
        * Row ``expected`` present: the statement reads it ``FOR KEY SHARE``. A READ
          COMMITTED statement's snapshot is taken when it starts, so a plain ``EXISTS``
          could pass on a row a concurrent ``truncate`` deleted just after; the row lock
          instead re-checks the newest committed version (a deleted row yields nothing:
          rowcount 0) and keeps any ``DELETE`` of it waiting until we commit. So the
          predecessor exists when the new row commits, which rules out re-creating a seqno
          a truncation already removed (``truncate`` deletes row ``n`` only together with
          everything below it, and only once a higher row exists).
        * ``expected=None`` (seqno 1): there is no row to lock, and "no row for the shard"
          in the statement's snapshot could be stale the same way (row 1 inserted, row 2
          appended and row 1 truncated after the snapshot: the insert would re-create row
          1). So the first insert instead claims the key in ``{table}_shards``, whose rows
          are never deleted, in the same statement: the claim's primary key lets exactly
          one first insert per key ever succeed (a concurrent claim waits for the other
          transaction and then takes ``DO NOTHING``), and row 1 is inserted only with it.

        Rowcount 1 is ``Committed``; 0 is ``Mismatch(head)``. A connection lost after the
        statement was sent is resolved by reading row ``expected + 1`` back (our bytes:
        committed; another's: mismatch; none: the insert is tried again, which is safe for
        the same reason two racing inserts are).
        """
        check_key(key)
        new = next_seqno(expected)
        check_data(data)
        query = self._q.cas_first if expected is None else self._q.cas_next
        params: dict[str, object] = {"shard": key, "new": new, "expected": expected, "data": data}

        def op(conn: Connection) -> int:
            return conn.execute(query, params).rowcount

        what = f"compare_and_set({key!r}, {expected})"
        uncertain = False
        error: StoreUnavailable | None = None
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                inserted = self._run(what, op, mutating=True, idempotent=False)
            except StoreUnavailable as exc:
                error = exc
                if exc.definite:
                    continue
                uncertain = True
                found = self._read_back(key, new, what, exc)
                if found is None:
                    continue  # not there: insert again (at most one of the two can land)
                return Committed() if found == data else Mismatch(self.head(key))
            if inserted == 1:
                return Committed()
            if uncertain and self._read_back(key, new, what, None) == data:
                return Committed()  # an earlier attempt of this call landed
            return Mismatch(self.head(key))
        raise StoreUnavailable(
            f"{what} failed {self._attempts} times; last: {error}"
            + (
                " (an attempt may still land: read the head before writing again)"
                if uncertain
                else ""
            ),
            definite=not uncertain,
        ) from error

    def _read_back(
        self, key: str, seqno: int, what: str, failure: StoreUnavailable | None
    ) -> bytes | None:
        """The data at ``seqno`` (``None``: no row), or ``StoreUnavailable(definite=False)``."""
        try:
            return self._read(key, seqno)
        except StoreUnavailable as exc:
            first = f"the write's outcome is unknown ({failure}) and " if failure else ""
            raise StoreUnavailable(
                f"{what}: {first}reading row {seqno} back failed ({exc}); read the head "
                "before writing again",
                definite=False,
            ) from exc

    def truncate(self, key: str, seqno: int) -> int:
        check_key(key)
        check_seqno(seqno, "seqno")

        def op(conn: Connection) -> int:
            return conn.execute(self._q.truncate, {"shard": key, "seqno": seqno}).rowcount

        deleted = self._run(f"truncate({key!r}, {seqno})", op, mutating=True, idempotent=True)
        if deleted == 0:
            head = self.head(key)
            if head is None or seqno > head.seqno:
                raise InvalidArgument(
                    f"truncate({key!r}, {seqno}): the head is "
                    f"{head.seqno if head else None}; truncating above the head would delete it"
                )
        return deleted

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
