"""SIGKILL at each step of the ingest (RFC 0027 §5, the crash-point table): after the remap
append (the first one: before the snapshot is durable, so the restart re-snapshots and
rewinds), after a data append and after an upstream commit, while transactions commit
concurrently. Then, at every time the remap shard binds, the data shard holds exactly the
table's contents at the bound LSN: no row twice, none missing."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import psycopg2

from slatepy.persist import PersistClient
from slatepy.persist.consolidation import consolidate
from slatepy.sources import remap
from slatepy.sources.postgres import connect, describe
from tests.processes import spawn
from tests.sources.pgkit import Collection, contents, setup_orders, snapshot, sql

Txn = tuple[int, int, Collection]  # LSN inside before the commit, LSN after it, contents after


def workload(url: str, count: int, log: list[Txn], stop: threading.Event) -> None:
    """``count`` small transactions of inserts, updates and deletes, each recorded with the
    LSN bounds of its commit record and the table's contents once it committed."""
    conn = psycopg2.connect(url)
    table = describe(connect(url), "pub", url)[0]
    try:
        with conn.cursor() as cur:
            for i in range(count):
                if stop.is_set():
                    return
                cur.execute("INSERT INTO orders VALUES (%s, %s, %s)", (100 + i, f"n{i}", i))
                cur.execute("UPDATE orders SET qty = qty + 1 WHERE id %% 7 = %s", (i % 7,))
                if i % 3 == 2:
                    cur.execute("DELETE FROM orders WHERE id = %s", (100 + i - 2,))
                state = contents(conn, table)
                cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                before = int(cur.fetchone()[0])
                conn.commit()
                cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                after = int(cur.fetchone()[0])
                conn.commit()
                log.append((before, after, state))
                stop.wait(0.01)
    finally:
        conn.close()


def candidates(log: list[Txn], initial: Collection, offset: int) -> list[Collection]:
    """The contents the bound offset allows: a prefix of the transactions whose commit
    records (known within the recorded bounds) lie below ``offset``."""
    states = [initial] + [state for _, _, state in log]
    out = []
    for k in range(len(states)):
        last_in = k == 0 or log[k - 1][0] < offset  # the k-th may be included
        next_out = k == len(log) or log[k][1] > offset  # the (k+1)-th may be excluded
        if last_in and next_out:
            out.append(states[k])
    return out


def test_sigkill_at_every_step_loses_and_duplicates_nothing(pg_url: str, tmp_path: Path) -> None:
    setup_orders(pg_url, rows=20)
    store = f"file://{tmp_path}"
    with PersistClient.open(store) as client:
        # Keep the whole remap history readable for the check below.
        hold = client.open_critical_since("orders.remap", "test")
        initial = contents(connect(pg_url), describe(connect(pg_url), "pub", pg_url)[0])
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

        reader = client.open_leased_reader("orders.remap")
        upper = client.open_writer("orders.remap").fetch_recent_upper()
        assert upper is not None
        bindings = remap.load(reader, 1, upper)
        reader.expire()
        assert hold.since == 0 and bindings.times[0] == 0
        data_upper = client.open_writer("orders").fetch_recent_upper()
        assert data_upper is not None
        data = client.open_leased_reader("orders")
        checked = 0
        for ts, (offset,) in zip(bindings.times, bindings.frontiers, strict=True):
            if ts >= data_upper:
                continue
            got = {kv: d for kv, _, d in consolidate(data.snapshot(ts), since=ts)}
            assert all(d == 1 for d in got.values()), f"a row twice at {ts}"
            if offset == 0:
                assert got == {}
                continue
            assert got in candidates(log, initial, offset), f"time {ts} offset {offset}"
            checked += 1
        data.expire()
        assert checked >= 5
        final = snapshot(client, "orders", data_upper - 1)
        assert final == contents(connect(pg_url), describe(connect(pg_url), "pub", pg_url)[0])
