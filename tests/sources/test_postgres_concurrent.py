"""Two PostgreSQL ingests of the same publication into the same shards at once (RFC 0027,
Addendum C and D): a redeploy that overlaps the old process. Exactly one stops with
``IngestConflict`` naming the shard and the other writer, the other carries on; nothing is
lost or duplicated, the slot never confirms beyond the shards, and a later restart resumes."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from pathlib import Path

from slatepy.persist import PersistClient
from slatepy.sources.postgres import slot_name_of
from tests.sources.crashkit import (
    Txn,
    assert_bounded_reliance,
    check_bound_times,
    resumption_offset,
    table_contents,
    workload,
)
from tests.sources.pgkit import setup_orders, snapshot, sql
from tests.sources.test_cli import Running

SLOT = slot_name_of("orders")


def ingest(pg_url: str, store: str) -> Running:
    """``slatepy ingest`` of ``pub`` into shard ``orders``, as a user runs it."""
    return Running("ingest", pg_url, "--publication", "pub", "--into", store, "--shard", "orders")


def lsn_now(url: str) -> int:
    return int(sql(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def wait_resumption(client: PersistClient, url: str, target: int, timeout: float) -> None:
    """Until the shards' offset resumption frontier reached ``target``, checking on the way
    that the slot never confirmed beyond it."""
    deadline = time.monotonic() + timeout
    while resumption_offset(client, "orders") < target:
        assert_bounded_reliance(client, "orders", url, SLOT)
        assert time.monotonic() < deadline, f"not at {target} after {timeout} s"
        time.sleep(0.2)


def test_two_concurrent_ingests_one_stops_nothing_lost(pg_url: str, tmp_path: Path) -> None:
    setup_orders(pg_url, rows=20)
    store = f"file://{tmp_path}"
    with PersistClient.open(store) as client:
        hold = client.open_critical_since("orders.remap", "test")  # the history stays readable
        initial = table_contents(pg_url)
        log: list[Txn] = []
        stop = threading.Event()
        writer = threading.Thread(target=workload, args=(pg_url, 2000, log, stop))
        first = ingest(pg_url, store)
        second: Running | None = None
        try:
            wait_resumption(client, pg_url, 1, timeout=30)
            writer.start()
            second = ingest(pg_url, store)
            started = time.monotonic()
            deadline = started + 30
            while first.proc.poll() is None and second.proc.poll() is None:
                assert_bounded_reliance(client, "orders", pg_url, SLOT)
                assert time.monotonic() < deadline, "neither ingest stopped after 30 s"
                time.sleep(0.1)
            took = time.monotonic() - started
            loser, survivor = (first, second) if first.proc.poll() is not None else (second, first)
            _, err = loser.proc.communicate(timeout=30)
            assert loser.proc.returncode == 1, err
            assert err.strip().count("\n") == 0, err
            host = socket.gethostname()
            assert re.search(
                rf"IngestConflict: (remap|data) shard 'orders(\.remap)?' moved .* another "
                rf"ingest of the same shards is running \(writers: .*{host}:"
                rf"{survivor.proc.pid} ingest",
                err,
            ), err
            print(f"one stopped after {took:.1f} s: {err.strip()}")
            # The survivor carries on: it catches up with the workload's end.
            stop.set()
            writer.join(timeout=30)
            assert survivor.proc.poll() is None
            wait_resumption(client, pg_url, lsn_now(pg_url), timeout=30)
            status, err = survivor.stop()
            assert status == 0, err
        finally:
            stop.set()
            for running in (first, second):
                if running is not None and running.proc.poll() is None:
                    running.stop(signal.SIGKILL)
        assert len(log) >= 10
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        assert check_bound_times(client, "orders", pg_url, log, initial) >= 3
        # A restart after both stopped resumes and catches up with what came meanwhile.
        sql(
            pg_url, "INSERT INTO orders VALUES (5000, 'late', 1)", "DELETE FROM orders WHERE id = 1"
        )
        again = ingest(pg_url, store)
        try:
            wait_resumption(client, pg_url, lsn_now(pg_url), timeout=30)
        finally:
            status, err = again.stop()
        assert status == 0, err
        assert_bounded_reliance(client, "orders", pg_url, SLOT)
        upper = client.open_writer("orders").fetch_recent_upper()
        assert upper is not None
        assert snapshot(client, "orders", upper - 1) == table_contents(pg_url)
        assert hold.since == 0
