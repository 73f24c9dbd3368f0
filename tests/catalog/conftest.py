"""Catalog fixtures: ``place``, one catalog location per implementation (persist on files and
on S3 over moto, the SQL stash on SQLite and on a real PostgreSQL, and the shadow of SQLite
and persist), whose ``make()`` gives a new unopened state on the same catalog."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slatepy.catalog import CatalogState, ShadowCatalog, open_catalog, open_shadow
from slatepy.config import Settings
from slatepy.testing.postgres import PostgresServer, missing_reason, postgres_server
from tests.conftest import TEST_BUCKET, s3_settings

PLACES = ["persist-file", pytest.param("persist-s3", marks=pytest.mark.s3), "sqlite", "postgres"]


@dataclass
class Place:
    """A catalog location; ``url``/``shard``/``settings`` are what ``open_catalog`` (and the
    CLI) take; ``make()`` opens nothing, it only makes an unopened state."""

    name: str
    url: str
    shard: str = "catalog"
    settings: Settings | None = None
    secondary: Place | None = None
    made: list[Any] = field(default_factory=list)

    def state(self) -> CatalogState:
        state = open_catalog(self.url, shard=self.shard, settings=self.settings)
        self.made.append(state)
        return state

    def make(self) -> Any:
        """A new unopened state (a shadow for the shadow place)."""
        if self.secondary is None:
            return self.state()
        shadow = open_shadow(self.state(), self.secondary.state())
        self.made.append(shadow)
        return shadow

    def close_all(self) -> None:
        for state in reversed(self.made):
            state.close()
        if self.secondary is not None:
            self.secondary.close_all()


@pytest.fixture(scope="session")
def catalog_postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the catalog tests."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_server() as server:
        yield server


def make_place(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if name == "persist-file":
        return Place(name, f"file://{tmp_path}/persist")
    if name == "persist-s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        settings = s3_settings(endpoint, disk_cache_dir=str(tmp_path / "cache"))
        return Place(name, f"s3://{TEST_BUCKET}/c-{uuid.uuid4().hex[:12]}", settings=settings)
    if name == "sqlite":
        return Place(name, f"sqlite:///{tmp_path}/catalog.db")
    if name == "postgres":
        server: PostgresServer = request.getfixturevalue("catalog_postgres")
        return Place(name, server.url(), shard=f"c_{uuid.uuid4().hex[:12]}")
    assert name == "shadow"
    secondary = make_place("persist-file", request, tmp_path)
    return Place(name, f"sqlite:///{tmp_path}/catalog.db", secondary=secondary)


@pytest.fixture(params=[*PLACES, "shadow"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """A fresh catalog location on each implementation, and the shadow of two."""
    found = make_place(request.param, request, tmp_path)
    yield found
    found.close_all()


@pytest.fixture(params=PLACES)
def single(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """A fresh catalog location on each implementation (no shadow)."""
    found = make_place(request.param, request, tmp_path)
    yield found
    found.close_all()


Maker = Callable[[], CatalogState | ShadowCatalog]
