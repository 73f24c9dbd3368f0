"""``spark.readStream.format("slatepy.postgres")`` into ``slatepy.persist`` (RFC 0027 §9):
the snapshot and later changes land at the times the remap shard binds, a second run resumes
from the checkpoint, and the slot is committed at the shards' resumption frontier."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from slatepy.persist import PersistClient
from slatepy.sources import Ingest, SourceUnavailable, remap
from slatepy.sources.postgres import PostgresSource, format_lsn, slot_name_of
from slatepy.spark.postgres_source import PostgresStreamReader, postgres_config
from slatepy.spark.reclocked import offsets_of
from tests.sources.conftest import logical_postgres, pg_url  # noqa: F401 - fixtures
from tests.sources.pgkit import caught_up, expected, setup_orders, snapshot, sql, step_until
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


def slot_active(url: str, slot: str) -> bool:
    """Whether a walsender streams ``slot`` now."""
    rows = sql(url, f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'")
    return bool(rows and rows[0][0])


def ingested(url: str, options: dict[str, str]) -> None:
    """Table ``orders`` (3 rows) ingested in-process into ``options``' shards, the ingest
    closed and its walsender gone (a restarted Spark stream's state)."""
    setup_orders(url, rows=3)
    ingest_in_process(url, options)


def ingest_in_process(url: str, options: dict[str, str]) -> None:
    """Run an in-process ingest of ``options``' source and shards until it committed what the
    server has written; close it and wait for its walsender to end."""
    slot = slot_name_of(options["shard"])
    with PersistClient.open(options["url"]) as client:
        ingest = Ingest(
            client,
            PostgresSource(url, "pub", slot=slot),
            data_shards=[options["shard"]],
            remap_shard=f"{options['shard']}.remap",
            tick=0,
        )
        ingest.start()
        step_until(ingest, caught_up(ingest, url))
        ingest.close()
    deadline = time.monotonic() + 30
    while slot_active(url, slot):
        assert time.monotonic() < deadline, "the ingest's walsender did not end"
        time.sleep(0.05)


def test_an_empty_batch_does_not_open_the_slot(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A batch with no offsets in it (batch 0 of a ``Trigger.AvailableNow`` run with nothing
    new: from the initial offset to itself) is planned without opening the slot (it cost a
    replication connection and up to 5 s waiting for a walsender); the next batch reads
    what came after it."""
    options = reader_options(pg_url, tmp_path)
    ingested(pg_url, options)
    reader = PostgresStreamReader(postgres_config(options))
    try:
        start = reader.initialOffset()
        assert offsets_of(start)[0] > 0
        assert reader.partitions(start, start) == []
        assert not slot_active(pg_url, reader.config.slot)
        reader.commit(start)
        sql(pg_url, "INSERT INTO orders VALUES (20, 'x', 1)")
        end = reader.latestOffset(start)
        while end == start:
            end = reader.latestOffset(start)
        assert [len(p.rows) for p in reader.partitions(start, end)] == [1]
    finally:
        reader.stop()


def test_an_available_now_run_reads_past_a_poll_without_progress(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Under ``Trigger.AvailableNow`` Spark ends the query at the first batch whose
    ``latestOffset`` is its start. A poll that brought nothing while the server had written
    more (under load, the first polls of a stream whose walsender is still decoding; here a
    5,000-row transaction and a 1 ms poll) is not that end: ``latestOffset`` reads on."""
    options = reader_options(pg_url, tmp_path) | {"pollSeconds": "0.001"}
    ingested(pg_url, options)
    sql(pg_url, "INSERT INTO orders SELECT g, 'n', g FROM generate_series(1000, 5999) g")
    reader = PostgresStreamReader(postgres_config(options))
    try:
        assert len(available_now(reader, reader.initialOffset())) == 5000
    finally:
        reader.stop()


def available_now(reader: PostgresStreamReader, start: dict[str, Any]) -> list[Any]:
    """The rows of the batches a ``Trigger.AvailableNow`` run of ``reader`` plans from
    ``start``, as Spark runs them: until a batch would end where it starts."""
    reader.prepareForTriggerAvailableNow()
    rows: list[Any] = []
    for _ in range(1000):
        end = reader.latestOffset(start)
        if end == start:
            return rows
        rows += [r for p in reader.partitions(start, end) for r in p.rows]
        reader.commit(end)
        start = end
    raise AssertionError("more than 1000 batches")


def test_a_batch_replayed_after_another_ingest_wrote_beyond_it_is_not_read_again(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Spark planned a batch and died before it landed; an in-process ingest then wrote the
    shards (that batch included, at the times Spark bound) and committed the slot beyond it.
    Spark restarted replays the batch: the shards hold it, so it is not read again, and the
    slot, confirmed beyond its start, is not opened there (it stopped with ``SlotLost``:
    "that WAL may be gone"); the next batches read on from the shards' resumption LSN."""
    options = reader_options(pg_url, tmp_path)
    setup_orders(pg_url, rows=3)
    first = PostgresStreamReader(postgres_config(options))
    try:
        snapshot_end = first.latestOffset(first.initialOffset())
        while offsets_of(snapshot_end) == (0,):
            snapshot_end = first.latestOffset({"offsets": [0]})
        sql(pg_url, "INSERT INTO orders VALUES (20, 'x', 1)")
        end = first.latestOffset(snapshot_end)
        while end == snapshot_end:
            end = first.latestOffset(snapshot_end)
        assert [len(p.rows) for p in first.partitions(snapshot_end, end)] == [1]
    finally:
        first.stop()  # no sink wrote the batch
    sql(pg_url, "INSERT INTO orders VALUES (21, 'y', 2)")
    ingest_in_process(pg_url, options)
    sql(pg_url, "INSERT INTO orders VALUES (22, 'z', 3)")
    replay = PostgresStreamReader(postgres_config(options))
    try:
        assert replay.partitions(snapshot_end, end) == []
        assert not slot_active(pg_url, replay.config.slot)
        rows = available_now(replay, end)
    finally:
        replay.stop()
    assert [(json.loads(k)[0], d) for k, _, _, d in rows] == [("22", 1)]


def test_an_available_now_run_that_reads_nothing_in_time_names_its_lsns(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A ``Trigger.AvailableNow`` batch the stream does not get beyond its start in time stops
    with ``SourceUnavailable`` naming the slot, the batch's start, where the stream got and
    what the server had written (here a start ahead of every WAL written during the test)."""
    options = reader_options(pg_url, tmp_path)
    ingested(pg_url, options)
    reader = PostgresStreamReader(postgres_config(options))
    reader.replay_timeout = 1.0
    written = int(sql(pg_url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
    start, until = written + (1 << 24), written + (1 << 25)
    reader.initialOffset()
    reader._until = until  # as prepareForTriggerAvailableNow found it
    try:
        with pytest.raises(SourceUnavailable) as caught:
            reader.latestOffset({"offsets": [start]})
    finally:
        reader.stop()
    assert str(caught.value) == (
        f"slot 'slatepy_orders': no batch from {format_lsn(start)} within 1 s (the stream at "
        f"{format_lsn(start)}), though the server had written up to {format_lsn(until)} when "
        "this Trigger.AvailableNow run began"
    )
