"""A Spark stream (``slatepy.postgres``) started while an in-process ingest of the same
shards runs (RFC 0027, Addendum D): a switch to ``slatepy ingest --spark`` overlapping the
old process. The stream reads the shards' uppers, waits 5 s for the slot the running ingest
holds, and the running one commits further upstream meanwhile: the stream must stop with
``IngestConflict`` naming the shard and the other writer (not ``SlotLost``, "that WAL may
be gone"); nothing is lost or duplicated, the slot never confirms beyond the shards, the
running ingest resumes, and a later Spark run resumes from the shards."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from slatepy.persist import PersistClient
from slatepy.sources import Ingest, SourceUnavailable
from slatepy.sources.postgres import PostgresSource, slot_name_of
from tests.sources.conftest import logical_postgres, pg_url  # noqa: F401 - fixtures
from tests.sources.crashkit import (
    Txn,
    assert_bounded_reliance,
    check_bound_times,
    table_contents,
    workload,
)
from tests.sources.pgkit import caught_up, setup_orders, step_until
from tests.spark import held_sources

SLOT = slot_name_of("orders")


def test_a_spark_stream_that_waited_for_the_slot_stops_with_ingest_conflict(
    spark: Any,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    held_sources.register(spark)
    setup_orders(pg_url, rows=5)
    (tmp_path / "store").mkdir()
    store, checkpoint = f"file://{tmp_path / 'store'}", tmp_path / "ckpt"
    log: list[Txn] = []
    never = threading.Event()
    with PersistClient.open(store) as client:
        hold = client.open_critical_since("orders.remap", "test")  # the history stays readable
        initial = table_contents(pg_url)
        first = Ingest(
            client,
            PostgresSource(pg_url, "pub", slot=SLOT),
            data_shards=["orders"],
            remap_shard="orders.remap",
            tick=0,
        )
        first.start()
        step_until(first, caught_up(first, pg_url))
        # Something for the query to read (an empty batch does not open the slot).
        workload(pg_url, 1, log, never, pause=0, base=50)
        query = held_sources.stream(spark, pg_url, store, checkpoint, hold=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "opening").exists():
                assert time.monotonic() < deadline, "the stream never opened the slot"
                assert query.exception() is None, query.exception()
                time.sleep(0.05)
            resume = int((tmp_path / "opening").read_text())
            workload(pg_url, 4, log, never, pause=0)
            step_until(first, caught_up(first, pg_url))
            assert first.committed[0] > resume
        finally:
            (tmp_path / "proceed").touch()
        with pytest.raises(StreamingQueryException) as stopped:
            query.awaitTermination(60)
        message = str(stopped.value)  # what a user sees: Spark's text with the traceback
        assert re.search(
            r"IngestConflict: remap shard 'orders.remap' moved to \d+ while this stream opened "
            r"the source \(expected \d+\): another ingest of the same shards is running "
            rf"\(writers: .*{socket.gethostname()}:\d+ ingest remap.*\); this one stops",
            message,
        ), message[-3000:]
        # ... and not, above it, the source's "that WAL may be gone" as its cause.
        assert "SlotLost" not in message and "may be gone" not in message, message[-3000:]
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        # The stream terminated the ingest's walsender: it resumes (as Ingest.run does).
        with pytest.raises(SourceUnavailable):
            step_until(first, lambda: False, timeout=10)
        first.start()
        workload(pg_url, 3, log, never, pause=0, base=200)
        step_until(first, caught_up(first, pg_url))
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        first.close()
        # Later, on Spark alone: it resumes from the shards and catches up.
        workload(pg_url, 3, log, never, pause=0, base=300)
        query = held_sources.stream(spark, pg_url, store, checkpoint, hold=None)
        assert query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        assert hold.since == 0
        assert check_bound_times(client, "orders", pg_url, log, initial) >= 3
