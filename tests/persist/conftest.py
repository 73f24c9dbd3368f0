"""Persist fixtures: a PostgreSQL server for the session (RFC 0015 §13.2), a table name per
test so tests sharing that server never see each other's logs, and a counted memory store
with an object-store consensus on it (``store``, ``log``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from slatepy.config import Settings
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.store.base import ObjectStore
from slatepy.store.stack import open_stack
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


@pytest.fixture
def store() -> ObjectStore:
    """A fresh, counted memory store."""
    return open_stack("memory://", Settings())


@pytest.fixture
def log(store: ObjectStore) -> Iterator[Consensus]:
    """An object-store consensus on ``store`` with no minimum age (tests truncate at once)."""
    with ObjectConsensus(store, min_age=0) as opened:
        yield opened
