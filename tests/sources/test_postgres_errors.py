"""Bad inputs and faults of the PostgreSQL source (issue 30): each a definite, typed error
naming the cause, with nothing committed upstream."""

from __future__ import annotations

import threading

import pytest

from slatepy.persist import PersistClient
from slatepy.sources import (
    SchemaChanged,
    SlotLost,
    SourceConfigError,
    SourceError,
    SourceUnavailable,
)
from slatepy.sources.postgres import PostgresSource
from slatepy.testing.postgres import free_port
from tests.sources.pgkit import caught_up, setup_orders, sql, step_until
from tests.sources.test_postgres import make


def test_an_unreachable_server() -> None:
    port = free_port()
    with pytest.raises(SourceUnavailable, match=f"cannot reach PostgreSQL at 127.0.0.1:{port}/db"):
        PostgresSource(f"postgresql://postgres@127.0.0.1:{port}/db", "pub", slot="s")


def test_wrong_credentials(pg_url: str) -> None:
    wrong = pg_url.replace("postgres@", "nobody@")
    with pytest.raises(SourceConfigError, match=r'refused the connection: .*"nobody"'):
        PostgresSource(wrong, "pub", slot="s")


def test_a_missing_publication(pg_url: str) -> None:
    with pytest.raises(SourceConfigError, match="publication 'nope' does not exist"):
        PostgresSource(pg_url, "nope", slot="s")


def test_a_table_without_primary_key_or_replica_identity(pg_url: str) -> None:
    sql(pg_url, "CREATE TABLE bare (v text)", "CREATE PUBLICATION pub FOR TABLE bare")
    with pytest.raises(
        SourceConfigError,
        match=r"public.bare has REPLICA IDENTITY DEFAULT and no primary key.*"
        r"ALTER TABLE public.bare REPLICA IDENTITY FULL",
    ):
        PostgresSource(pg_url, "pub", slot="s")


def test_alter_table_of_a_published_table(client: PersistClient, pg_url: str) -> None:
    setup_orders(pg_url)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    committed = ingest.committed
    sql(pg_url, "ALTER TABLE orders ADD COLUMN note text", "INSERT INTO orders VALUES (9, 'x', 9)")
    with pytest.raises(SchemaChanged, match=r"table public.orders changed \(ALTER TABLE\)"):
        step_until(ingest, lambda: False, timeout=10)
    assert ingest.committed == committed
    ingest.close()


def _run(ingest_run: object) -> list[BaseException]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            ingest_run()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return errors


def test_a_slot_dropped_under_a_running_ingest(client: PersistClient, pg_url: str) -> None:
    setup_orders(pg_url)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    sql(
        pg_url,
        "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots "
        "WHERE slot_name = 'slot_orders'",
        "SELECT pg_drop_replication_slot('slot_orders')",
    )
    errors = _run(lambda: ingest.run(threading.Event()))
    assert len(errors) == 1 and isinstance(errors[0], SlotLost), errors
    assert "replication slot 'slot_orders' does not exist (dropped?)" in str(errors[0])


def test_a_slot_invalidated_by_max_slot_wal_keep_size(client: PersistClient, pg_url: str) -> None:
    setup_orders(pg_url)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    ingest.close()
    sql(pg_url, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()")
    try:
        sql(pg_url, "CREATE TABLE filler (v text)")
        for _ in range(3):
            sql(
                pg_url,
                "INSERT INTO filler SELECT repeat('y', 500) FROM generate_series(1, 20000)",
                "SELECT pg_switch_wal()",
            )
        sql(pg_url, "CHECKPOINT")
        status = sql(pg_url, "SELECT wal_status FROM pg_replication_slots")[0][0]
        assert status == "lost"
        again = make(client, pg_url)
        with pytest.raises(SlotLost, match="slot 'slot_orders' was invalidated") as caught:
            again.start()
        assert isinstance(caught.value, SourceError) and caught.value.definite
        again.close()
    finally:
        sql(pg_url, "ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()")


def test_alter_table_while_no_ingest_runs(client: PersistClient, pg_url: str) -> None:
    setup_orders(pg_url)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    ingest.close()
    sql(pg_url, "ALTER TABLE orders ALTER COLUMN qty TYPE bigint")
    again = make(client, pg_url)
    with pytest.raises(SchemaChanged, match=r"public\.orders changed shape since its shards"):
        again.start()
    again.close()
