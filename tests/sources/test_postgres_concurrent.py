"""Two PostgreSQL ingests of the same publication into the same shards at once (RFC 0027,
Addendum C and D): a redeploy that overlaps the old process. Exactly one stops with
``IngestConflict`` naming the shard and the other writer, the other carries on; nothing is
lost or duplicated, the slot never confirms beyond the shards, and a later restart resumes."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slatepy.persist import PersistClient
from slatepy.sources import Ingest, IngestConflict, SlotLost, SourceUnavailable
from slatepy.sources.base import OffsetFrontier, SourceReader
from slatepy.sources.postgres import PostgresSource, slot_name_of
from tests.sources.crashkit import (
    Txn,
    assert_bounded_reliance,
    check_bound_times,
    resumption_offset,
    table_contents,
    workload,
)
from tests.sources.pgkit import caught_up, expected, setup_orders, snapshot, sql, step_until
from tests.sources.test_cli import Running

SLOT = slot_name_of("orders")
SHARDS: dict[str, Any] = {"data_shards": ["orders"], "remap_shard": "orders.remap", "tick": 0}


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


class HeldOpen:
    """``source``, whose :meth:`open` says it was called (with which offsets) and then
    waits for ``proceed``: the ingest has read the shards' uppers and not yet the slot."""

    def __init__(self, source: PostgresSource) -> None:
        self.source = source
        self.opening = threading.Event()
        self.proceed = threading.Event()
        self.resume: OffsetFrontier = ()

    @property
    def outputs(self) -> Sequence[str]:
        return self.source.outputs

    @property
    def partitions(self) -> int:
        return self.source.partitions

    def shapes(self) -> Sequence[bytes]:
        return self.source.shapes()

    def open(self, resume: OffsetFrontier) -> SourceReader:
        self.resume = resume
        self.opening.set()
        assert self.proceed.wait(30)
        return self.source.open(resume)


def test_a_newcomer_that_waited_for_the_slot_stops_with_ingest_conflict(
    client: PersistClient, pg_url: str
) -> None:
    """The second ingest reads the uppers, the first commits further upstream, the second
    takes the slot (after 5 s) and finds it confirmed beyond what it read: that is the other
    ingest's progress, not lost WAL, so it stops with IngestConflict (it said SlotLost, "that
    WAL may be gone"); the first loses its stream, resumes from the shards and carries on."""
    setup_orders(pg_url, rows=5)
    first = Ingest(client, PostgresSource(pg_url, "pub", slot="s"), **SHARDS)
    first.start()
    step_until(first, caught_up(first, pg_url))
    held = HeldOpen(PostgresSource(pg_url, "pub", slot="s"))
    second = Ingest(client, held, **SHARDS)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            second.start()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    try:
        assert held.opening.wait(30)
        sql(pg_url, "INSERT INTO orders VALUES (6, 'six', 6)", "DELETE FROM orders WHERE id = 2")
        step_until(first, caught_up(first, pg_url))
        assert first.committed[0] > held.resume[0]
    finally:
        held.proceed.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and len(errors) == 1
    error = errors[0]
    assert isinstance(error, IngestConflict) and isinstance(error.__cause__, SlotLost)
    assert re.match(
        r"remap shard 'orders.remap' moved to \d+ while this ingest opened the source "
        rf"\(expected \d+\): another ingest .* \(writers: {socket.gethostname()}:{os.getpid()} "
        r"ingest remap\); this one stops",
        str(error),
    ), error
    second.close()
    # The newcomer terminated the first's walsender: the first resumes, as run() does.
    with pytest.raises(SourceUnavailable):
        step_until(first, lambda: False, timeout=10)
    first.start()
    sql(pg_url, "UPDATE orders SET qty = 0 WHERE id = 1")
    step_until(first, caught_up(first, pg_url))
    assert snapshot(client, "orders", first.resumption - 1) == expected(pg_url)["public.orders"]
    assert_bounded_reliance(client, "orders", pg_url, "s")
    first.close()
