"""The PostgreSQL source into persist (RFC 0027 §6): snapshot, stream, retractions, several
tables, commits, and the definite errors."""

from __future__ import annotations

from slatepy.persist import PersistClient
from slatepy.sources import Ingest
from slatepy.sources.postgres import PostgresSource
from tests.sources.pgkit import caught_up, expected, setup_orders, snapshot, sql, step_until


def make(client: PersistClient, url: str, shard: str = "orders", pub: str = "pub") -> Ingest:
    source = PostgresSource(url, pub, slot=f"slot_{shard}")
    shards = [shard] if len(source.outputs) == 1 else [f"{shard}.{n}" for n in source.outputs]
    return Ingest(client, source, data_shards=shards, remap_shard=f"{shard}.remap", tick=0)


def test_snapshot_then_inserts_updates_deletes(client: PersistClient, pg_url: str) -> None:
    setup_orders(pg_url, rows=5)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    assert snapshot(client, "orders", ingest.resumption - 1) == expected(pg_url)["public.orders"]
    sql(
        pg_url,
        "INSERT INTO orders VALUES (6, 'six', 6)",
        "UPDATE orders SET qty = qty + 10 WHERE id <= 2",
        "DELETE FROM orders WHERE id = 3",
        "UPDATE orders SET id = 30 WHERE id = 4",
    )
    step_until(ingest, caught_up(ingest, pg_url))
    assert snapshot(client, "orders", ingest.resumption - 1) == expected(pg_url)["public.orders"]
    ingest.close()
