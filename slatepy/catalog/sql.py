"""The SQL stash: the catalog as a small time-varying collection store in SQLite (stdlib
``sqlite3``) or PostgreSQL (``psycopg`` 3), as Materialize's stash was (RFC 0028 §3.2).

Four tables per catalog, named after its ``shard`` (``{p}_fence``, ``{p}_collections``,
``{p}_data``, ``{p}_uppers``): a fence row ``(epoch, nonce, holder)``, one row per collection,
the data rows ``(collection_id, key, value, time, diff)`` and an upper per collection (all
moved together: every write is one tick of the whole catalog). Every write is one
serializable transaction that checks the fence first (the epoch, and the nonce of the
writer's open, which catches a catalog dropped and made again) and then the upper; an open
sets a new epoch and nonce in the same transaction, and compacts: the rows of retracted
values are deleted. Nothing exists before the first open:
reads of a missing catalog see upper 0, and only ``write`` creates the tables (SQLite: the
file too).
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from slatepy.catalog.errors import CatalogContention, CatalogError
from slatepy.catalog.objects import COLLECTIONS
from slatepy.catalog.storage import Contents, Row, Storage, fenced_message
from slatepy.errors import FencedError, InvalidArgument, StoreUnavailable

T = TypeVar("T")
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")
SERIALIZATION_RETRIES = 20
INSERT_ROWS = 1000
"""Rows per PostgreSQL INSERT statement (5 parameters each: far below its 65535)."""


class _Fenced(Exception):
    """Raised inside a transaction to roll it back, then re-raised as FencedError."""


class SqlStorage(Storage):
    """A catalog in SQLite (``path``) or PostgreSQL (``conninfo``); see the module docstring.

    Args:
        sqlite_path: The SQLite database file (exactly one of the two).
        postgres_url: A ``postgresql://`` URL.
        shard: The table-name prefix, as it is (lower-case letters, digits, ``_``; anything
            else is refused, never mapped: two names would then be one catalog).
    """

    def __init__(
        self,
        *,
        sqlite_path: str | None = None,
        postgres_url: str | None = None,
        shard: str = "catalog",
        description: str,
    ) -> None:
        if _PREFIX.fullmatch(shard) is None:
            # No mapping of other names onto tables: two names would then be one catalog.
            like = shard.replace("-", "_").replace(".", "_").lower()
            hint = (
                f"; shard {like!r} opens the tables it named before"
                if _PREFIX.fullmatch(like)
                else ""
            )
            raise InvalidArgument(
                f"catalog shard {shard!r} cannot name SQL tables: in SQL a shard is up to 41 "
                f"lower-case letters, digits and _, not starting with a digit{hint}"
            )
        prefix = shard
        if (sqlite_path is None) == (postgres_url is None):
            raise InvalidArgument("give exactly one of sqlite_path and postgres_url")
        self.description = description
        self._sqlite_path = sqlite_path
        self._postgres_url = postgres_url
        self._t = {n: f"{prefix}_{n}" for n in ("fence", "collections", "data", "uppers")}
        self._p = "?" if sqlite_path is not None else "%s"
        self._conn: Any = None
        self._wal = False
        self._lock = threading.Lock()
        # The nonce of this storage's last open (its leader's fence) and the nonce its last
        # read saw (what an open expects to replace): a read never changes the former.
        self._nonce: bytes | None = None
        self._read_nonce: bytes | None = None

    # -- connections and transactions ----------------------------------------------------

    def _connect(self, *, create: bool) -> Any:
        if self._conn is not None:
            return self._conn
        if self._postgres_url is not None:
            import psycopg

            try:
                self._conn = psycopg.connect(
                    self._postgres_url, autocommit=True, connect_timeout=10
                )
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"cannot connect to {self._say(exc)}") from None
            except psycopg.ProgrammingError as exc:  # a malformed URL
                raise InvalidArgument(f"cannot connect to {self._say(exc)}") from None
            return self._conn
        assert self._sqlite_path is not None
        if not create and not os.path.exists(self._sqlite_path):
            return None
        try:
            conn = sqlite3.connect(
                self._sqlite_path, timeout=30, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.description}: {exc}") from None
        self._conn = conn
        return conn

    def _say(self, exc: BaseException | str) -> str:
        """``description: exc`` on one line, without the URL's password (a driver's message
        may quote the URL)."""
        text = " ".join(str(exc).split())
        if self._postgres_url:
            text = text.replace(self._postgres_url, self.description)
            try:
                password = urlsplit(self._postgres_url).password
            except ValueError:  # unparsable: the whole URL is all a message could quote
                password = None
            if password:
                text = text.replace(password, "***")
        return f"{self.description}: {text}"

    def _run(self, body: Callable[[Any], T], *, write: bool) -> T | None:
        """Run ``body(cursor)`` in one serializable transaction (retried on serialization
        failures); None if there is no database yet and ``write`` is False."""
        with self._lock:
            conn = self._connect(create=write)
            if conn is None:
                return None
            if self._postgres_url is not None:
                return self._run_postgres(conn, body, write=write)
            return self._run_sqlite(conn, body, write=write)

    def _run_sqlite(self, conn: sqlite3.Connection, body: Callable[[Any], T], *, write: bool) -> T:
        try:
            if write and not self._wal:  # only a write may change the file (WAL: a write)
                conn.execute("PRAGMA journal_mode=WAL")
                self._wal = True
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            result = body(cur)
            cur.execute("COMMIT")
            return result
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and not str(exc).startswith("no such"):
                raise StoreUnavailable(self._say(exc)) from None
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CORRUPT":  # damaged, not foreign
                raise CatalogError(f"{self._say(exc)}: corrupt") from None
            if isinstance(exc, sqlite3.DatabaseError):  # not a database, a table not ours
                raise CatalogError(f"{self._say(exc)}: not a catalog") from None
            raise

    def _run_postgres(self, conn: Any, body: Callable[[Any], T], *, write: bool) -> T:
        import psycopg
        from psycopg import errors

        for attempt in range(SERIALIZATION_RETRIES):
            try:
                with conn.cursor() as cur:
                    # A read says so: PostgreSQL then refuses any write in it and need
                    # not track it against the writers' serializable transactions.
                    mode = "" if write else " READ ONLY"
                    cur.execute(f"BEGIN ISOLATION LEVEL SERIALIZABLE{mode}")
                    try:
                        result = body(cur)
                        cur.execute("COMMIT")
                        return result
                    except BaseException:
                        if not conn.closed:
                            conn.execute("ROLLBACK")
                        raise
            except (errors.SerializationFailure, errors.DeadlockDetected) as exc:
                if attempt == SERIALIZATION_RETRIES - 1:
                    raise CatalogContention(
                        f"{self._say(exc)}: a serialization failure on each of "
                        f"{SERIALIZATION_RETRIES} tries; nothing was written"
                    ) from None
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # let the winner finish
            except psycopg.OperationalError as exc:
                # A write's connection lost at its COMMIT may have committed: indefinite.
                self._conn = None
                raise StoreUnavailable(self._say(exc), definite=not write) from None
            except errors.InsufficientPrivilege as exc:  # refused: not a matter of content
                refused = exc.diag.message_primary or str(exc)
                raise StoreUnavailable(self._say(refused), definite=True) from None
            except psycopg.ProgrammingError as exc:  # a table of the name that is not ours
                raise CatalogError(f"{self._say(exc)}: not a catalog") from None
        raise AssertionError("unreachable")

    def _exists(self, cur: Any) -> bool:
        if self._sqlite_path is not None:
            cur.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (self._t["uppers"],),
            )
        else:
            cur.execute("SELECT to_regclass(%s)", (self._t["uppers"],))
            return cur.fetchone()[0] is not None
        return cur.fetchone() is not None

    def _create(self, cur: Any) -> None:
        blob = "BLOB" if self._sqlite_path is not None else "bytea"
        t, p = self._t, self._p
        if self._postgres_url is not None:
            cur.execute("SELECT pg_advisory_xact_lock(7394611205316438)")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {t['fence']} "
            f"(epoch bigint NOT NULL, nonce {blob} NOT NULL, holder text NOT NULL)"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {t['collections']} "
            "(collection_id bigint PRIMARY KEY, name text NOT NULL UNIQUE)"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {t['data']} (collection_id bigint NOT NULL, "
            f"key {blob} NOT NULL, value {blob} NOT NULL, time bigint NOT NULL, "
            "diff bigint NOT NULL)"
        )
        cur.execute(
            f"CREATE INDEX IF NOT EXISTS {t['data']}_key ON {t['data']} (collection_id, key)"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {t['uppers']} "
            "(collection_id bigint PRIMARY KEY, upper bigint NOT NULL)"
        )
        cur.execute(f"SELECT count(*) FROM {t['fence']}")
        if cur.fetchone()[0] == 0:
            cur.execute(f"INSERT INTO {t['fence']} VALUES (0, {p}, '')", (b"",))
        ids = self._collection_ids(cur)
        upper = self._upper(cur) if ids else 0
        cid = max(ids.values(), default=0)
        for name in COLLECTIONS:
            if name not in ids:  # a fresh id: one of a collection gone may still hold rows
                cid += 1
                cur.execute(f"INSERT INTO {t['collections']} VALUES ({p}, {p})", (cid, name))
                cur.execute(f"INSERT INTO {t['uppers']} VALUES ({p}, {p})", (cid, upper))

    def _fence(self, cur: Any) -> tuple[int, bytes, str]:
        """The one fence row.

        Raises:
            CatalogError: there is not exactly one, or it is not of the fence's types
                (SQLite keeps any value in any column).
        """
        fence = self._t["fence"]
        cur.execute(f"SELECT epoch, nonce, holder FROM {fence}")
        found = cur.fetchall()
        if len(found) != 1:
            raise self._corrupt(f"{fence} holds {len(found)} rows, not 1")
        epoch, nonce, holder = found[0]
        if type(epoch) is not int or not isinstance(nonce, bytes | memoryview):
            raise self._corrupt(f"{fence} holds an epoch or nonce of the wrong type")
        return epoch, bytes(nonce), str(holder)

    def _upper(self, cur: Any) -> int:
        uppers = self._t["uppers"]
        cur.execute(f"SELECT min(upper) FROM {uppers}")
        upper = cur.fetchone()[0]
        if type(upper) is not int:
            raise self._corrupt(f"{uppers} holds no upper, or one that is not a number")
        return upper

    def _collection_ids(self, cur: Any) -> dict[str, int]:
        cur.execute(f"SELECT name, collection_id FROM {self._t['collections']}")
        return {str(name): int(cid) for name, cid in cur.fetchall()}

    def _corrupt(self, what: str) -> CatalogError:
        return CatalogError(f"{self.description}: corrupt: {what}")

    def _insert(self, cur: Any, rows: list[tuple[int, bytes, bytes, int, int]]) -> None:
        """Insert data rows. PostgreSQL: multi-row INSERTs, not psycopg's ``executemany``,
        which pipelines: a serialization failure while it is still sending made psycopg log
        "error ignored terminating <psycopg.Pipeline ...>" (a warning on the CLI's standard
        error) before the retry that then succeeded."""
        data = self._t["data"]
        if self._sqlite_path is not None:
            cur.executemany(f"INSERT INTO {data} VALUES (?, ?, ?, ?, ?)", rows)
            return
        for start in range(0, len(rows), INSERT_ROWS):
            chunk = rows[start : start + INSERT_ROWS]
            values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
            cur.execute(f"INSERT INTO {data} VALUES {values}", [x for r in chunk for x in r])

    def _compact(self, cur: Any) -> None:
        """Delete the rows of every ``(collection, key, value)`` whose diffs sum to zero: what
        was retracted leaves the table (an open does this, so a catalog's history never
        outgrows its content by more than the changes since the last open)."""
        data = self._t["data"]
        cur.execute(
            f"DELETE FROM {data} WHERE (collection_id, key, value) IN ("
            f"SELECT collection_id, key, value FROM {data} "
            "GROUP BY collection_id, key, value HAVING sum(diff) = 0)"
        )

    # -- Storage -------------------------------------------------------------------------

    def upper(self) -> int:
        def body(cur: Any) -> int:
            return self._upper(cur) if self._exists(cur) else 0

        return self._run(body, write=False) or 0

    def read(self) -> Contents:
        t = self._t

        def body(cur: Any) -> Contents:
            if not self._exists(cur):
                return Contents(0, 0, [])
            epoch, nonce, holder = self._fence(cur)
            self._read_nonce = nonce
            cur.execute(
                f"SELECT d.collection_id, c.name, d.key, d.value, sum(d.diff) FROM {t['data']} d "
                f"LEFT JOIN {t['collections']} c ON c.collection_id = d.collection_id "
                "GROUP BY d.collection_id, c.name, d.key, d.value HAVING sum(d.diff) <> 0"
            )
            entries = []
            for cid, name, key, value, total in cur.fetchall():
                if name is None:  # its collection row is gone: the rows would be unseen
                    raise self._corrupt(
                        f"{t['data']} holds rows of collection id {cid}, "
                        f"which {t['collections']} does not name"
                    )
                if total != 1:
                    raise self._corrupt(f"{name} row {bytes(key)!r} counts {total}")
                entries.append((str(name), bytes(key), bytes(value)))
            upper = self._upper(cur)
            if upper == 0 and (entries or epoch):  # an open would take it for a new one
                raise self._corrupt(f"it holds rows and epoch {epoch} at upper 0")
            return Contents(upper, epoch, entries, holder)

        return self._run(body, write=False) or Contents(0, 0, [])

    def read_collection(self, name: str) -> list[tuple[bytes, bytes]]:
        t, p = self._t, self._p

        def body(cur: Any) -> list[tuple[bytes, bytes]]:
            if not self._exists(cur):
                return []
            cur.execute(
                f"SELECT d.key, d.value FROM {t['data']} d JOIN {t['collections']} c "
                f"ON c.collection_id = d.collection_id WHERE c.name = {p} "
                "GROUP BY d.key, d.value HAVING sum(d.diff) <> 0",
                (name,),
            )
            return [(bytes(k), bytes(v)) for k, v in cur.fetchall()]

        return self._run(body, write=False) or []

    def write(
        self,
        rows: list[Row],
        *,
        expected_upper: int,
        epoch: int | None,
        new_epoch: int | None = None,
        holder: str = "",
    ) -> int:
        t, p = self._t, self._p
        nonce = os.urandom(16) if new_epoch is not None else self._nonce

        def body(cur: Any) -> int:
            if not self._exists(cur):
                if expected_upper != 0 or new_epoch is None:
                    raise _Fenced(f"catalog {self.description} no longer exists")
                self._create(cur)
            current_epoch, current_nonce, _ = self._fence(cur)
            mine = self._read_nonce if new_epoch is not None else self._nonce
            if epoch is not None and (
                current_epoch != epoch or (expected_upper and current_nonce != mine)
            ):
                raise _Fenced(f"unexpected fence epoch {current_epoch}, expected {epoch}")
            upper = self._upper(cur)
            if upper != expected_upper:
                raise _Fenced(fenced_message(epoch, current_epoch, expected_upper, upper))
            if new_epoch is not None:
                cur.execute(
                    f"UPDATE {t['fence']} SET epoch = {p}, nonce = {p}, holder = {p}",
                    (new_epoch, nonce, holder),
                )
            ids = self._collection_ids(cur)
            if any(c not in ids for c, _, _, _ in rows):  # made by a version without it
                self._create(cur)
                ids = self._collection_ids(cur)
            self._insert(cur, [(ids[c], k, v, expected_upper, d) for c, k, v, d in rows])
            cur.execute(f"UPDATE {t['uppers']} SET upper = {p}", (expected_upper + 1,))
            if new_epoch is not None:
                self._compact(cur)
            return expected_upper + 1

        try:
            result = self._run(body, write=True)
        except _Fenced as exc:
            raise FencedError(f"catalog {self.description}: {exc}") from None
        assert result is not None
        if new_epoch is not None:
            self._nonce = nonce
        return result

    def confirm(self, upper: int, epoch: int) -> None:
        def body(cur: Any) -> tuple[int, bytes, int]:
            if not self._exists(cur):
                return 0, b"", 0
            current_epoch, nonce, _ = self._fence(cur)
            return current_epoch, nonce, self._upper(cur)

        current_epoch, nonce, current_upper = self._run(body, write=False) or (0, b"", 0)
        if current_epoch != epoch or nonce != self._nonce:
            raise FencedError(
                f"catalog {self.description}: unexpected fence epoch {current_epoch}, "
                f"expected {epoch}"
            )
        if current_upper != upper:
            raise FencedError(
                f"catalog {self.description}: "
                + fenced_message(epoch, current_epoch, upper, current_upper)
            )

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
