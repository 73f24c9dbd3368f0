"""SIGKILL at each step of the ingest (RFC 0027 §5, the crash-point table): after the remap
append (the first one: before the snapshot is durable, so the restart re-snapshots and
rewinds), after a data append and after an upstream commit, while transactions commit
concurrently. Then, at every time the remap shard binds, the data shard holds exactly the
table's contents at the bound LSN: no row twice, none missing; and the slot never confirmed
beyond the offset resumption frontier of the shards. (The same on Spark:
``tests/spark/test_source_crash.py``.)"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from slatepy.persist import PersistClient
from tests.processes import spawn
from tests.sources.crashkit import (
    Txn,
    assert_bounded_reliance,
    check_bound_times,
    table_contents,
    workload,
)
from tests.sources.pgkit import setup_orders, sql


def test_sigkill_at_every_step_loses_and_duplicates_nothing(pg_url: str, tmp_path: Path) -> None:
    setup_orders(pg_url, rows=20)
    store = f"file://{tmp_path}"
    with PersistClient.open(store) as client:
        # Keep the whole remap history readable for the check below.
        hold = client.open_critical_since("orders.remap", "test")
        initial = table_contents(pg_url)
        log: list[Txn] = []
        stop = threading.Event()
        writer = threading.Thread(target=workload, args=(pg_url, 1000, log, stop))
        writer.start()
        try:
            for point, n in (("remap-appended", 1), ("data-appended", 2), ("committed", 2)):
                child = spawn(
                    "tests.sources.ingest_child",
                    store,
                    pg_url,
                    point,
                    str(n),
                    "0",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                _, err = child.communicate(timeout=60)
                assert child.returncode == -9, f"{point}: {child.returncode} {err[-2000:]}"
                assert_bounded_reliance(client, "orders", pg_url, "slot_orders")
        finally:
            stop.set()
            writer.join(timeout=60)
        assert len(log) >= 10
        target = int(sql(pg_url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        child = spawn(
            "tests.sources.ingest_child",
            store,
            pg_url,
            "none",
            "0",
            str(target),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-2000:]
        assert_bounded_reliance(client, "orders", pg_url, "slot_orders")
        assert hold.since == 0
        assert check_bound_times(client, "orders", pg_url, log, initial) >= 5
