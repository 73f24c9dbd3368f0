"""Persist fixtures: a PostgreSQL server for the session (RFC 0015 §13.2), and a table name
per test so tests sharing that server never see each other's logs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from slatepy.testing.postgres import PostgresServer, missing_reason, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server on 127.0.0.1 for the whole session."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server() as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of the test's own, for tests that kill and restart it (about a second)."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_table() -> str:
    """A consensus table name no other test uses."""
    return f"consensus_{uuid.uuid4().hex[:16]}"
