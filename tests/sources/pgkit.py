"""Helpers of the PostgreSQL source tests: SQL, the expected collection, stepping an ingest."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg2

from slatepy.persist import PersistClient
from slatepy.persist.consolidation import consolidate
from slatepy.sources import Ingest
from slatepy.sources.postgres import Table, connect, describe, parse_lsn

Collection = dict[tuple[bytes, bytes], int]


def sql(url: str, *statements: str) -> list[Any]:
    """Run ``statements`` (autocommit); the rows of the last."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def setup_orders(url: str, rows: int = 5, *, publication: str = "pub") -> None:
    """Table ``orders`` (id primary key, item, qty; REPLICA IDENTITY FULL) with ``rows`` rows
    and a publication of it."""
    sql(
        url,
        "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int)",
        "ALTER TABLE orders REPLICA IDENTITY FULL",
        f"INSERT INTO orders SELECT g, 'item' || g, g FROM generate_series(1, {rows}) g",
        f"CREATE PUBLICATION {publication} FOR TABLE orders",
    )


def expected(url: str, publication: str = "pub") -> dict[str, Collection]:
    """Every published table's contents now, encoded as the source encodes rows."""
    conn = connect(url)
    try:
        tables = describe(conn, publication, url)
        return {t.name: contents(conn, t) for t in tables}
    finally:
        conn.close()


def contents(conn: Any, table: Table) -> Collection:
    schema, _, name = table.name.partition(".")
    cols = ", ".join(f'"{c}"::text' for c, _ in table.columns)
    out: Collection = {}
    with conn.cursor() as cur:
        cur.execute(f'SELECT {cols} FROM "{schema}"."{name}"')
        for row in cur.fetchall():
            kv = table.row(row)
            out[kv] = out.get(kv, 0) + 1
    return out


def current_lsn(url: str) -> int:
    return parse_lsn(sql(url, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


def snapshot(client: PersistClient, shard: str, as_of: int) -> Collection:
    """The consolidated collection of ``shard`` at ``as_of``."""
    reader = client.open_leased_reader(shard)
    try:
        return {kv: d for kv, _, d in consolidate(reader.snapshot(as_of), since=as_of)}
    finally:
        reader.expire()


def step_until(ingest: Ingest, done: Callable[[], bool], timeout: float = 60.0) -> None:
    """Step ``ingest`` until ``done()`` (checked after a commit), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        ingest.step(0.05)
        ingest.commit()
        if done():
            return
        assert time.monotonic() < deadline, f"not done after {timeout} s: {ingest.stats()}"


def caught_up(ingest: Ingest, url: str) -> Callable[[], bool]:
    """``done`` for :func:`step_until`: the committed offset reached the server's written
    WAL now (so every transaction committed before the call is durable in the shards)."""
    target = parse_lsn(sql(url, "SELECT pg_current_wal_lsn()::text")[0][0])
    return lambda: ingest.committed[0] >= target
