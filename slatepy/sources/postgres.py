"""PostgreSQL logical replication as a source (RFC 0027 §6): ``pgoutput``, a publication and
a replication slot; the offset is the LSN (one partition).

* **Driver.** The stream uses psycopg2's ``LogicalReplicationConnection``: psycopg 3 cannot
  consume a replication stream (its issue #71 is open; 3.3 only lets ``START_REPLICATION``
  run, PR #1219). Catalog queries use the same driver, so one connection library is loaded.
* **Start.** With nothing durable yet (resume offset 0) the reader makes sure the slot exists,
  then takes a consistent snapshot of every published table through a *temporary* slot made
  with ``SNAPSHOT 'use'`` at LSN ``S``, and streams the real slot from its confirmed position
  ``C <= S``. Rows of the snapshot come at offset 0; each streamed transaction that committed
  before ``S`` is already in it, so it also comes negated at offset 0 (Materialize's
  *rewind*), and no progress is reported before the stream passes ``S``. At offset 0 the
  source thus reads "the tables as of the first frontier it reports", even when the slot was
  made by an earlier attempt that crashed.
* **Offsets.** A transaction's updates are at its ``commit_lsn``; after its Commit the
  progress is ``commit_lsn + 1``; when idle, a keepalive's ``wal_end`` moves it (everything
  committing before it has been sent).
* **Rows.** Each published table needs ``REPLICA IDENTITY FULL``: an update or delete then
  carries the whole old row, retracted as ``((key, old row), -1)``. Keys are the primary-key
  columns (the whole row for a table without one), values the whole row, both JSON arrays of
  the columns' text forms (``None`` for NULL).
* **Commit** is a standby status update with ``flush = write = apply =`` the offset frontier;
  the slot's ``confirmed_flush_lsn`` moves there and ``restart_lsn`` follows.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from slatepy.errors import InvalidArgument
from slatepy.sources import pgoutput
from slatepy.sources.base import SNAPSHOT_OFFSET, Chunk, Event, OffsetFrontier, Progress, Row
from slatepy.sources.errors import (
    SchemaChanged,
    SlotLost,
    SourceConfigError,
    SourceError,
    SourceUnavailable,
)

log = logging.getLogger(__name__)

_IDENTITY = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX", "f": "FULL"}
_FEEDBACK_INTERVAL = 1.0


def _driver() -> Any:
    try:
        import psycopg2
        import psycopg2.extras
    except ImportError:
        raise InvalidArgument(
            'the PostgreSQL source needs psycopg2: pip install "slatepy[sources]"'
        ) from None
    return psycopg2


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` -> int."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def format_lsn(lsn: int) -> str:
    """int -> ``'16/B374D848'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def slot_name_of(shard: str) -> str:
    """The default replication slot of an ingest into ``shard``."""
    name = "".join(c if c.isalnum() else "_" for c in shard.lower())
    return f"slatepy_{name}"[:63]


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path or '/'}"


def connect(url: str, *, replication: bool = False, timeout: float = 5.0) -> Any:
    """A psycopg2 connection (a logical replication one with ``replication``).

    Raises:
        SourceConfigError: the server refused the credentials or the database.
        SourceUnavailable: the server could not be reached.
    """
    psycopg2 = _driver()
    factory = psycopg2.extras.LogicalReplicationConnection if replication else None
    try:
        conn = psycopg2.connect(
            url, connection_factory=factory, connect_timeout=max(1, int(timeout))
        )
    except psycopg2.OperationalError as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        refused = (
            "authentication failed",
            "does not exist",
            "no pg_hba.conf entry",
            "password",
            "permission denied",
        )
        if any(word in text for word in refused):
            raise SourceConfigError(
                f"PostgreSQL at {_where(url)} refused the connection: {text}"
            ) from None
        raise SourceUnavailable(f"cannot reach PostgreSQL at {_where(url)}: {text}") from None
    if not replication:
        conn.autocommit = True
    return conn


@dataclass(frozen=True)
class Table:
    """A published table as the catalog described it when the source was made."""

    oid: int
    name: str  # schema.table
    columns: tuple[tuple[str, int], ...]  # (name, type oid)
    key: tuple[int, ...]  # primary-key column positions; () = the whole row is the key

    def row(self, values: Sequence[str | None]) -> tuple[bytes, bytes]:
        """The ``(key, value)`` of a row given as its columns' text forms."""
        value = msgspec.json.encode(list(values))
        if not self.key:
            return value, b""
        return msgspec.json.encode([values[i] for i in self.key]), value


def describe(conn: Any, publication: str, url: str) -> list[Table]:
    """The published tables, checked for what the source needs.

    Raises:
        SourceConfigError: the publication is missing or empty, or a table lacks
            ``REPLICA IDENTITY FULL``.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
        if cur.fetchone() is None:
            raise SourceConfigError(
                f"publication {publication!r} does not exist in {_where(url)} "
                f"(CREATE PUBLICATION {publication} FOR TABLE ...)"
            )
        cur.execute(
            "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_publication_tables p "
            "JOIN pg_namespace n ON n.nspname = p.schemaname "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename "
            "WHERE p.pubname = %s ORDER BY n.nspname, c.relname",
            (publication,),
        )
        found = cur.fetchall()
        if not found:
            raise SourceConfigError(f"publication {publication!r} publishes no table")
        tables = []
        for oid, schema, name, identity in found:
            qualified = f"{schema}.{name}"
            cur.execute(
                "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (oid,),
            )
            columns = tuple((n, int(t)) for n, t in cur.fetchall())
            cur.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
                (oid,),
            )
            pk = {n for (n,) in cur.fetchall()}
            if identity != "f":
                missing = "" if pk or identity != "d" else " and no primary key"
                raise SourceConfigError(
                    f"table {qualified} has REPLICA IDENTITY {_IDENTITY.get(identity, identity)}"
                    f"{missing}: its updates and deletes would not carry the old row; run "
                    f"ALTER TABLE {qualified} REPLICA IDENTITY FULL"
                )
            key = tuple(i for i, (n, _) in enumerate(columns) if n in pk)
            tables.append(Table(int(oid), qualified, columns, key))
    return tables


class PostgresSource:
    """The tables of ``publication`` in the database at ``url``, read through ``slot``.

    Making one connects once to check the publication and its tables (see :func:`describe`).
    """

    slot_wait = 5.0
    """Seconds an open waits for another session to let go of the slot before terminating
    it (a killed predecessor's walsender lingers a moment; tests shorten it)."""

    def __init__(self, url: str, publication: str, *, slot: str, timeout: float = 5.0) -> None:
        self.url = url
        self.publication = publication
        self.slot = slot
        self.timeout = timeout
        conn = connect(url, timeout=timeout)
        try:
            self.tables = describe(conn, publication, url)
        finally:
            conn.close()

    @property
    def outputs(self) -> Sequence[str]:
        return [t.name for t in self.tables]

    @property
    def partitions(self) -> int:
        return 1

    def shapes(self) -> Sequence[bytes]:
        return [msgspec.json.encode([t.name, t.columns, t.key]) for t in self.tables]

    def open(self, resume: OffsetFrontier) -> PostgresReader:
        return PostgresReader(self, resume[0])

    def slot_state(self, conn: Any) -> tuple[int | None, str | None, int | None] | None:
        """``(confirmed_flush_lsn, wal_status, active_pid)`` of the slot, None if absent."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT confirmed_flush_lsn::text, wal_status, active_pid "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            )
            row = cur.fetchone()
        if row is None:
            return None
        flush, status, pid = row
        return (None if flush is None else parse_lsn(flush)), status, pid


class PostgresReader:
    """The replication stream from one LSN (see the module docstring)."""

    def __init__(self, source: PostgresSource, resume: int) -> None:
        self._source = source
        self._tables = {t.oid: (i, t) for i, t in enumerate(source.tables)}
        self._events: list[Event] = []
        self._hold = 0  # no progress below it (the snapshot's LSN while rewinding)
        self._progress = resume
        self._txn: dict[int, list[Row]] | None = None
        self._txn_lsn = 0
        self._last_feedback = 0.0
        self._committed = 0
        self._sql: Any = None
        self._conn = connect(source.url, replication=True, timeout=source.timeout)
        try:
            self._start(resume)
        except BaseException:
            self._conn.close()
            raise

    def _start(self, resume: int) -> None:
        psycopg2 = _driver()
        source, slot = self._source, self._source.slot
        state = self._wait_inactive()
        if state is not None and state[1] == "lost":
            raise SlotLost(
                f"replication slot {slot!r} was invalidated (max_slot_wal_keep_size): the "
                f"WAL the shards need from {format_lsn(resume)} is gone; re-create the source"
            )
        if resume == SNAPSHOT_OFFSET:
            if state is None:
                with self._conn.cursor() as cur:
                    cur.create_replication_slot(slot, output_plugin="pgoutput")
            self._snapshot()
        elif state is None:
            raise SlotLost(
                f"replication slot {slot!r} does not exist (dropped?): the shards need WAL from "
                f"{format_lsn(resume)}; re-create the source"
            )
        elif state[0] is not None and state[0] > resume:
            raise SlotLost(
                f"replication slot {slot!r} confirmed {format_lsn(state[0])}, beyond the "
                f"shards' resumption LSN {format_lsn(resume)}: that WAL may be gone"
            )
        cur = self._conn.cursor()
        try:
            cur.start_replication(
                slot_name=slot,
                decode=False,
                start_lsn=resume,
                options={"proto_version": "1", "publication_names": source.publication},
            )
        except psycopg2.Error as exc:
            raise self._failure(exc) from None
        self._cur = cur

    def _wait_inactive(self) -> tuple[int | None, str | None, int | None] | None:
        """The slot's state once no other session holds it (a killed predecessor's walsender
        may linger for a moment; after ``slot_wait``, 5 s, it is terminated, as Materialize
        does)."""
        wait = self._source.slot_wait
        deadline = time.monotonic() + wait
        while True:
            state = self._source.slot_state(self._conn)
            if state is None or state[2] is None:
                return state
            if time.monotonic() > deadline:
                with self._conn.cursor() as cur:
                    cur.execute("SELECT pg_terminate_backend(%s)", (state[2],))
                deadline = time.monotonic() + wait
            time.sleep(0.1)

    def _snapshot(self) -> None:
        """The published tables at a temporary slot's consistent point, as offset-0 rows."""
        source = self._source
        conn = connect(source.url, replication=True, timeout=source.timeout)
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                cur.execute(
                    f'CREATE_REPLICATION_SLOT "{source.slot}_snap" TEMPORARY LOGICAL pgoutput '
                    "(SNAPSHOT 'use')"
                )
                (_, point, _, _) = cur.fetchone()
                for i, table in enumerate(source.tables):
                    schema, _, name = table.name.partition(".")
                    ident = _driver().extensions.quote_ident
                    cols = ", ".join(f"{ident(c, cur)}::text" for c, _ in table.columns)
                    cur.execute(f"SELECT {cols} FROM {ident(schema, cur)}.{ident(name, cur)}")
                    rows = [(*table.row(r), 1) for r in cur.fetchall()]
                    if rows:
                        self._events.append(Chunk(i, 0, SNAPSHOT_OFFSET, rows))
                cur.execute("COMMIT")
        finally:
            conn.close()
        self._hold = parse_lsn(point)
        log.info("snapshot of %s at %s", source.publication, point)

    def _failure(self, exc: Exception) -> SourceError:
        slot = self._source.slot
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        if getattr(exc, "pgcode", None) == "55000" or "invalidated" in str(exc):
            return SlotLost(f"replication slot {slot!r} cannot be read: {text}")
        if getattr(exc, "pgcode", None) == "42704":
            return SlotLost(f"replication slot {slot!r} does not exist: {text}")
        return SourceUnavailable(f"replication of slot {slot!r} failed: {text}")

    # -- reading ----------------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Event]:
        psycopg2 = _driver()
        deadline = time.monotonic() + min(timeout, 0.5)
        try:
            while True:
                message = self._cur.read_message()
                if message is not None:
                    self._handle(message.payload)
                    if len(self._events) >= 1000:
                        break
                    continue
                if self._events or time.monotonic() >= deadline:
                    break
                select.select([self._conn], [], [], max(0.0, deadline - time.monotonic()))
            if self._txn is None:  # between transactions, a keepalive's wal_end is progress
                self._advance(self._cur.wal_end)
            if time.monotonic() - self._last_feedback >= _FEEDBACK_INTERVAL:
                self._feedback()
        except psycopg2.Error as exc:
            raise self._failure(exc) from None
        events, self._events = self._events, []
        return events

    def _advance(self, lsn: int) -> None:
        if lsn > self._progress and lsn >= self._hold:
            self._progress = lsn
            self._events.append(Progress((lsn,)))

    def _handle(self, payload: bytes) -> None:
        message = pgoutput.decode(payload)
        if isinstance(message, pgoutput.Begin):
            self._txn, self._txn_lsn = {}, message.final_lsn
        elif isinstance(message, pgoutput.Commit):
            assert self._txn is not None
            for output, rows in self._txn.items():
                self._events.append(Chunk(output, 0, message.commit_lsn, rows))
                if message.commit_lsn < self._hold:  # in the snapshot already: rewind
                    undo = [(k, v, -d) for k, v, d in rows]
                    self._events.append(Chunk(output, 0, SNAPSHOT_OFFSET, undo))
            self._txn = None
            self._advance(message.commit_lsn + 1)
        elif isinstance(message, pgoutput.Relation):
            self._check_relation(message)
        elif isinstance(message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
            self._change(message)
        elif isinstance(message, pgoutput.Truncate):
            names = [self._tables[o][1].name for o in message.oids if o in self._tables]
            raise SchemaChanged(
                f"table {', '.join(names)} was truncated: a truncate carries no rows to "
                "retract; re-create the source"
            )

    def _check_relation(self, relation: pgoutput.Relation) -> None:
        found = self._tables.get(relation.oid)
        if found is None:
            log.warning("ignoring %s: not published when the source started", relation.qualified)
            return
        table = found[1]
        now = tuple((c.name, c.type_oid) for c in relation.columns)
        if now != table.columns or relation.replica_identity != "f":
            raise SchemaChanged(
                f"table {table.name} changed (ALTER TABLE): columns {list(table.columns)} "
                f"became {list(now)}, replica identity "
                f"{_IDENTITY.get(relation.replica_identity, relation.replica_identity)}; "
                "re-create the source to ingest the new shape"
            )

    def _change(self, change: pgoutput.Insert | pgoutput.Update | pgoutput.Delete) -> None:
        found = self._tables.get(change.oid)
        if found is None or self._txn is None:
            return
        output, table = found
        rows = self._txn.setdefault(output, [])
        if isinstance(change, pgoutput.Insert):
            rows.append((*table.row(_text(change.new)), 1))
            return
        old = change.old
        if old is None or (isinstance(change, pgoutput.Delete) and change.key_only):
            raise SchemaChanged(
                f"table {table.name} sent a change without its old row: its replica identity "
                "is no longer FULL"
            )
        rows.append((*table.row(_text(old)), -1))
        if isinstance(change, pgoutput.Update):
            new = [
                o if n is pgoutput.UNCHANGED else n for n, o in zip(change.new, old, strict=True)
            ]
            rows.append((*table.row(_text(new)), 1))

    # -- feedback ---------------------------------------------------------------------------

    def _feedback(self) -> None:
        lsn = self._committed
        self._cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, apply_lsn=lsn, reply=True)
        self._last_feedback = time.monotonic()

    def commit(self, frontier: OffsetFrontier) -> None:
        psycopg2 = _driver()
        if frontier[0] <= self._committed:
            return
        self._committed = frontier[0]
        try:
            self._cur.send_feedback(
                write_lsn=self._committed,
                flush_lsn=self._committed,
                apply_lsn=self._committed,
                reply=True,
                force=True,
            )
        except psycopg2.Error as exc:
            raise self._failure(exc) from None
        self._last_feedback = time.monotonic()

    def lag(self) -> int | None:
        """Bytes of WAL the server has written beyond the reader's progress."""
        try:
            if self._sql is None:
                self._sql = connect(self._source.url, timeout=self._source.timeout)
            with self._sql.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn()::text")
                (now,) = cur.fetchone()
            return max(0, parse_lsn(now) - self._progress)
        except (SourceError, _driver().Error):
            return None

    def close(self) -> None:
        for conn in (self._conn, self._sql):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


def _text(values: pgoutput.TupleData) -> list[str | None]:
    out: list[str | None] = []
    for v in values:
        if isinstance(v, pgoutput._Unchanged):
            raise SchemaChanged("an unchanged TOAST column came without its old value")
        out.append(v)
    return out
