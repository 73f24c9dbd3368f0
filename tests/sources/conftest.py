"""Source fixtures: one PostgreSQL 15 server with ``wal_level=logical`` for the session, a
fresh database per test (slots and publications are per database), and a persist client on a
memory store."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from slatepy.config import Settings
from slatepy.persist import PersistClient
from slatepy.store.stack import open_stack
from slatepy.testing.postgres import PostgresServer, missing_reason, postgres_server


@pytest.fixture(scope="session")
def logical_postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server with logical replication, for the session."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server(logical=True) as server:
        yield server


@pytest.fixture
def pg_url(logical_postgres: PostgresServer) -> Iterator[str]:
    """The URL of a new database on the logical server; dropped (with its slots) after."""
    import psycopg2

    name = f"src_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(logical_postgres.url())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield logical_postgres.url(name)
    finally:
        _drop(admin, name)
        admin.close()


def _drop(admin: Any, name: str) -> None:
    """Drop the database's slots (waiting for their walsenders to end: a closed or killed
    ingest's may linger a moment, longer on a busy machine), then the database. A slot left
    behind would hold one of the server's ``max_replication_slots`` for the session."""
    import psycopg2

    deadline = time.monotonic() + 30
    with admin.cursor() as cur:
        while True:
            try:
                cur.execute(
                    "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots "
                    "WHERE database = %s AND active_pid IS NOT NULL",
                    (name,),
                )
                cur.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s",
                    (name,),
                )
                break
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        cur.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def client() -> Iterator[PersistClient]:
    """A persist client on a fresh memory store."""
    with PersistClient.open(open_stack("memory://", Settings())) as opened:
        yield opened
