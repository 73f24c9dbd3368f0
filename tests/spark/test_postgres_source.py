"""``spark.readStream.format("slatepy.postgres")`` into ``slatepy.persist`` (RFC 0027 §9):
the snapshot and later changes land at the times the remap shard binds, a second run resumes
from the checkpoint, and the slot is committed at the shards' resumption frontier."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from slatepy.persist import PersistClient
from slatepy.sources import SourceUnavailable, remap
from slatepy.sources.postgres import format_lsn
from slatepy.spark.postgres_source import PostgresStreamReader, postgres_config
from slatepy.spark.reclocked import offsets_of
from tests.sources.conftest import logical_postgres, pg_url  # noqa: F401 - fixtures
from tests.sources.pgkit import expected, setup_orders, snapshot, sql
from tests.spark.held_sources import stream


def run_once(spark: Any, pg: str, store: str, checkpoint: Path) -> None:
    query = stream(spark, pg, store, checkpoint, hold=None)
    query.awaitTermination(180)
    assert query.exception() is None


def test_postgres_stream_into_persist(spark: Any, pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "store").mkdir()
    store = f"file://{tmp_path / 'store'}"
    setup_orders(pg_url, rows=8)
    sql(pg_url, "UPDATE orders SET qty = 0 WHERE id < 3")
    run_once(spark, pg_url, store, tmp_path / "ckpt")
    sql(pg_url, "INSERT INTO orders VALUES (20, 'x', 1)", "DELETE FROM orders WHERE id = 5")
    run_once(spark, pg_url, store, tmp_path / "ckpt")
    with PersistClient.open(store) as client:
        data_upper = client.open_writer("orders").fetch_recent_upper()
        assert data_upper is not None
        got = snapshot(client, "orders", data_upper - 1)
        assert got == expected(pg_url)["public.orders"]
        reader = client.open_leased_reader("orders.remap")
        bindings = remap.load(reader, 1, client.open_writer("orders.remap").fetch_recent_upper())
        reader.expire()
        t = min(data_upper, bindings.upper)
        flush = sql(
            pg_url,
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = 'slatepy_orders'",
        )[0][0]
        assert 0 < int(flush) <= bindings.before(t)[0]


def reader_options(url: str, tmp_path: Path) -> dict[str, str]:
    """The options of a driver-side reader of ``pub`` at ``url`` into shard ``orders`` (a
    new store)."""
    (tmp_path / "store").mkdir()
    return {
        "url": f"file://{tmp_path / 'store'}",
        "shard": "orders",
        "connection": url,
        "publication": "pub",
        "pollSeconds": "0.2",
    }


def test_a_replayed_batch_survives_a_dropped_stream(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A batch planned again after a restart (``partitions`` with no ``latestOffset`` first)
    reads the slot from the batch's start; a stream the server drops meanwhile (an idle
    walsender past ``wal_sender_timeout``, a server restart) is opened again from there, as
    ``latestOffset`` does, and the batch holds the same rows. The driver-side reader is
    driven directly: no Spark session is needed."""
    options = reader_options(pg_url, tmp_path)
    setup_orders(pg_url, rows=8)
    first = PostgresStreamReader(postgres_config(options))

    def next_batch(start: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        end = first.latestOffset(start)
        while end == start:
            assert time.monotonic() < deadline, "no new offset"
            end = first.latestOffset(start)
        return end

    snapshot_end = next_batch(first.initialOffset())
    sql(pg_url, "INSERT INTO orders VALUES (20, 'x', 1), (21, 'y', 2)")  # one transaction
    end = next_batch(snapshot_end)
    planned = [p.rows for p in first.partitions(snapshot_end, end)]
    first.stop()
    assert planned and len(planned[0]) == 2

    replay = PostgresStreamReader(postgres_config(options))
    replay._open()
    replay._read_from(offsets_of(snapshot_end))  # a restarted driver's stream, then dropped
    slot = replay.config.slot
    where = f"FROM pg_replication_slots WHERE slot_name = '{slot}'"
    sql(pg_url, f"SELECT pg_terminate_backend(active_pid) {where}")
    deadline = time.monotonic() + 30
    while sql(pg_url, f"SELECT active {where}")[0][0]:
        assert time.monotonic() < deadline, "the walsender did not end"
        time.sleep(0.05)
    try:
        assert [p.rows for p in replay.partitions(snapshot_end, end)] == planned
    finally:
        replay.stop()


def test_a_replay_not_read_in_time_names_its_lsns(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A replayed batch the stream does not read to its end in time stops with
    ``SourceUnavailable`` naming the slot, the batch and where the stream got, as LSNs
    written as PostgreSQL writes them (``0/1A2B3C4D``, as every other message of the
    source), not raw integers."""
    options = reader_options(pg_url, tmp_path)
    setup_orders(pg_url, rows=2)
    reader = PostgresStreamReader(postgres_config(options))
    reader.replay_timeout = 1.0
    start = reader.initialOffset()
    written = int(sql(pg_url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
    end = written + (1 << 32)  # never written during the test
    try:
        with pytest.raises(SourceUnavailable) as caught:
            reader.partitions(start, {"offsets": [end]})
    finally:
        reader.stop()
    assert re.fullmatch(
        re.escape(
            f"slot 'slatepy_orders': the batch [0/0, {format_lsn(end)}) was not read again "
            "within 1 s (at "
        )
        + r"[0-9A-F]+/[0-9A-F]+\)",
        str(caught.value),
    ), caught.value
