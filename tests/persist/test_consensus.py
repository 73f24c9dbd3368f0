"""The consensus conformance suite (``slatepy.testing.persist_conformance``) on every location:
the object-store log over memory, file, S3 (moto) and S3 with the DynamoDB two-phase CAS, and
PostgreSQL (a real server, a table per test); plus how ``open_consensus`` picks one.

Location-specific behaviour lives beside this file: ``test_objconsensus.py`` (request counts,
the truncation age guard, interrupted truncation, corrupt objects, paused races) and
``test_pgconsensus.py`` (a killed or unreachable server, statement timeouts, the row locks
the compare-and-set relies on).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy.errors import InvalidArgument
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.persist.location.open import open_consensus, redact
from slatepy.persist.location.pgconsensus import PostgresConsensus
from slatepy.store import open_store
from slatepy.testing.persist_conformance import ConsensusConformance, Faulty, Opener
from slatepy.testing.persist_faults import ProxyWriteFaults, StoreWriteFaults
from slatepy.testing.postgres import PostgresServer
from tests.conftest import Backend, make_backend

OBJECT_BACKENDS = [
    "memory",
    "file",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-dynamodb", marks=pytest.mark.s3),
]


class TestObjectConsensus(ConsensusConformance):
    """The default log: numbered create-if-absent objects on the blob store."""

    @pytest.fixture(params=OBJECT_BACKENDS)
    def backend(self, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
        return make_backend(request.param, request, tmp_path)

    @pytest.fixture
    def open_consensus(self, backend: Backend) -> Iterator[Opener]:
        # Each instance on its own store object, as separate processes would be (memory://
        # is one shared instance: it is the only way two of them see the same objects).
        with Opener(lambda: ObjectConsensus(backend.store(), min_age=0)) as opener:
            yield opener

    @pytest.fixture
    def faulty(self, backend: Backend, open_consensus: Opener) -> Faulty:
        faults = StoreWriteFaults(backend.store())
        consensus = open_consensus.track(ObjectConsensus(faults, min_age=0))
        return Faulty(consensus, faults, open_consensus())


class TestPostgresConsensus(ConsensusConformance):
    """PostgreSQL: one table per test on the session's server."""

    @pytest.fixture
    def open_consensus(self, postgres: PostgresServer, pg_table: str) -> Iterator[Opener]:
        with Opener(lambda: PostgresConsensus(postgres.url(), table=pg_table)) as opener:
            yield opener

    @pytest.fixture
    def faulty(
        self, postgres: PostgresServer, pg_table: str, open_consensus: Opener
    ) -> Iterator[Faulty]:
        proxy = ProxyWriteFaults(postgres.port)
        try:
            through_proxy = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
            consensus = open_consensus.track(
                PostgresConsensus(through_proxy, table=pg_table, connect_timeout=2)
            )
            consensus.list_keys()  # connected (and the table made) before a fault is armed
            yield Faulty(consensus, proxy, open_consensus())
        finally:
            proxy.close()


# Choosing the location.


def test_none_is_the_object_store_log_on_the_blob_store() -> None:
    store = open_store("memory://")
    with open_consensus(store) as consensus:
        assert isinstance(consensus, ObjectConsensus)
        assert consensus.store is store
        assert consensus.min_age == 3600.0
        assert consensus.compare_and_set("s", None, b"x").__class__.__name__ == "Committed"
    assert [m.path for m in store.list("consensus/")] == ["consensus/s/" + "0" * 19 + "1.diff"]


def test_an_instance_passes_through() -> None:
    store = open_store("memory://")
    with ObjectConsensus(store, min_age=0) as mine:
        assert open_consensus(store, mine) is mine


def test_a_postgresql_url_is_postgres_without_connecting() -> None:
    store = open_store("memory://")
    for url in ("postgresql://u@127.0.0.1:1/db", "postgres://u@127.0.0.1:1/db"):
        consensus = open_consensus(store, url, table="other_table")
        assert isinstance(consensus, PostgresConsensus)
        assert "other_table" in repr(consensus)
        consensus.close()


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("mysql://admin:hunter2@db/x", "mysql://admin:***@db/x"),
        ("memory://", "memory://"),
        ("", "''"),
        (42, "a int"),
        (b"postgresql://x", "a bytes"),
    ],
)
def test_anything_else_is_invalid_and_named(value: object, shown: str) -> None:
    with pytest.raises(InvalidArgument, match="is not supported") as raised:
        open_consensus(open_store("memory://"), value)  # type: ignore[arg-type]
    assert shown in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_a_malformed_postgresql_url_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="not a PostgreSQL URL"):
        open_consensus(open_store("memory://"), "postgresql://u@h:notaport/db?bogus=1")


def test_redact_hides_only_the_password() -> None:
    assert redact("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact("not a url") == "not a url"


def test_consensus_is_the_abstract_interface() -> None:
    with pytest.raises(TypeError):
        Consensus()  # type: ignore[abstract]
