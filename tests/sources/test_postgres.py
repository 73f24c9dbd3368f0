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


def test_several_tables_each_to_its_shard(client: PersistClient, pg_url: str) -> None:
    sql(
        pg_url,
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (v text, n int)",  # no primary key: the whole row is the key
        "ALTER TABLE a REPLICA IDENTITY FULL",
        "ALTER TABLE b REPLICA IDENTITY FULL",
        "INSERT INTO a VALUES (1, 'x'), (2, NULL)",
        "INSERT INTO b VALUES ('dup', 1), ('dup', 1)",
        "CREATE PUBLICATION pub FOR TABLE a, b",
    )
    ingest = make(client, pg_url, shard="two")
    assert ingest.data_shards == ["two.public.a", "two.public.b"]
    ingest.start()
    sql(pg_url, "UPDATE b SET n = 2 WHERE ctid = (SELECT min(ctid) FROM b)", "DELETE FROM a")
    step_until(ingest, caught_up(ingest, pg_url))
    want = expected(pg_url)
    as_of = ingest.resumption - 1
    assert snapshot(client, "two.public.a", as_of) == want["public.a"] == {}
    assert snapshot(client, "two.public.b", as_of) == want["public.b"]
    assert sorted(want["public.b"].values()) == [1, 1]
    ingest.close()


def test_a_slot_made_before_writes_rewinds_them(client: PersistClient, pg_url: str) -> None:
    """The slot exists from an attempt that crashed before anything was durable, and rows
    changed since: the snapshot (taken later) must not count those changes twice."""
    setup_orders(pg_url, rows=3)
    sql(pg_url, "SELECT pg_create_logical_replication_slot('slot_orders', 'pgoutput')")
    sql(pg_url, "INSERT INTO orders VALUES (4, 'four', 4)", "DELETE FROM orders WHERE id = 1")
    sql(pg_url, "UPDATE orders SET qty = 0")
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    got = snapshot(client, "orders", ingest.resumption - 1)
    assert got == expected(pg_url)["public.orders"] and set(got.values()) == {1}
    ingest.close()


def test_confirmed_flush_follows_the_resumption_frontier(
    client: PersistClient, pg_url: str
) -> None:
    """Bounded reliance: the slot's confirmed_flush_lsn advances while ingesting, is never
    beyond the offset resumption frontier the shards give, and restart_lsn moves too."""
    setup_orders(pg_url, rows=1)
    ingest = make(client, pg_url)
    ingest.start()
    step_until(ingest, caught_up(ingest, pg_url))
    flushes, restarts = [], []
    for i in range(12):
        sql(
            pg_url,
            f"INSERT INTO orders SELECT g, 'r', {i} FROM generate_series({i * 100 + 10}, "
            f"{i * 100 + 99}) g",
            "CHECKPOINT" if i % 4 == 3 else "SELECT 1",
        )
        step_until(ingest, caught_up(ingest, pg_url))
        flush, restart = sql(
            pg_url,
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn, restart_lsn - '0/0'::pg_lsn "
            "FROM pg_replication_slots WHERE slot_name = 'slot_orders'",
        )[0]
        # The frontier as the shards say now (what a restart would resume at).
        uppers = [client.open_writer(s).fetch_recent_upper() for s in ("orders", "orders.remap")]
        t = min(u for u in uppers if u is not None)
        assert int(flush) <= ingest.bindings.before(t)[0]
        flushes.append(int(flush))
        restarts.append(int(restart))
    assert flushes == sorted(flushes) and flushes[-1] > flushes[0]
    assert restarts[-1] > restarts[0]
    remap_state = client.machine("orders.remap").fetch()
    assert remap_state.since == ingest.resumption - 1
    ingest.close()
