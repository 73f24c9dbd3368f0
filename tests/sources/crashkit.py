"""What the SIGKILL tests of the ingest share, in-process (``test_crash.py``) and on Spark
(``tests/spark/test_source_crash.py``): a concurrent workload that records each commit's
LSN bounds and the table's contents after it, and the check that, at every time the remap
shard binds, the data shard holds one of the contents the bound LSN allows."""

from __future__ import annotations

import threading

import psycopg2

from slatepy.persist import PersistClient
from slatepy.persist.consolidation import consolidate
from slatepy.sources import remap
from slatepy.sources.postgres import connect, describe
from tests.sources.pgkit import Collection, contents, snapshot, sql

Txn = tuple[int, int, Collection]  # LSN inside before the commit, LSN after it, contents after


def table_contents(url: str) -> Collection:
    """The published table's contents now."""
    conn = connect(url)
    try:
        return contents(conn, describe(conn, "pub", url)[0])
    finally:
        conn.close()


def workload(
    url: str,
    count: int,
    log: list[Txn],
    stop: threading.Event,
    *,
    pause: float = 0.01,
    updated: int | None = None,
    base: int = 100,
) -> None:
    """At most ``count`` small transactions of inserts, updates and deletes (until ``stop``),
    each recorded with the LSN bounds of its commit record and the table's contents once it
    committed. Each updates a seventh of the table (of its rows with ``id <= updated`` when
    given: a long run stays small); the ``i``-th inserts the id ``base + i``."""
    bound = "" if updated is None else f" AND id <= {int(updated)}"
    conn = psycopg2.connect(url)
    table = describe(connect(url), "pub", url)[0]
    try:
        with conn.cursor() as cur:
            for i in range(count):
                if stop.is_set():
                    return
                cur.execute("INSERT INTO orders VALUES (%s, %s, %s)", (base + i, f"n{i}", i))
                cur.execute(f"UPDATE orders SET qty = qty + 1 WHERE id %% 7 = %s{bound}", (i % 7,))
                if i % 3 == 2:
                    cur.execute("DELETE FROM orders WHERE id = %s", (base + i - 2,))
                state = contents(conn, table)
                cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                before = int(cur.fetchone()[0])
                conn.commit()
                cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                after = int(cur.fetchone()[0])
                conn.commit()
                log.append((before, after, state))
                stop.wait(pause)
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


def flushed(url: str, slot: str) -> int:
    """The slot's ``confirmed_flush_lsn`` (0 when unset)."""
    rows = sql(
        url,
        "SELECT coalesce(confirmed_flush_lsn - '0/0'::pg_lsn, 0) FROM pg_replication_slots "
        f"WHERE slot_name = '{slot}'",
    )
    return int(rows[0][0]) if rows else 0


def resumption_offset(client: PersistClient, shard: str) -> int:
    """The offset resumption frontier the shards' uppers give now: ``O(T - 1)`` for ``T``
    the meet of the data and remap shards' uppers (0 before anything is durable)."""
    remap_upper = client.open_writer(f"{shard}.remap").fetch_recent_upper() or 0
    data_upper = client.open_writer(shard).fetch_recent_upper() or 0
    t = min(remap_upper, data_upper)
    if t == 0:
        return 0
    reader = client.open_leased_reader(f"{shard}.remap")
    try:
        return remap.load(reader, 1, remap_upper).before(t)[0]
    finally:
        reader.expire()


def check_bound_times(
    client: PersistClient, shard: str, url: str, log: list[Txn], initial: Collection
) -> int:
    """Assert that at every time the remap shard binds (below the data upper) the data shard
    holds no row twice and one of the contents its bound LSN allows, and that it ends at the
    contents of the table at ``url`` now; the number of times checked. The remap shard's
    history must still be readable (a test holds its since at 0)."""
    remap_upper = client.open_writer(f"{shard}.remap").fetch_recent_upper()
    data_upper = client.open_writer(shard).fetch_recent_upper()
    assert remap_upper is not None and data_upper is not None
    reader = client.open_leased_reader(f"{shard}.remap")
    bindings = remap.load(reader, 1, remap_upper)
    reader.expire()
    assert bindings.times[0] == 0
    data = client.open_leased_reader(shard)
    checked = 0
    try:
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
    finally:
        data.expire()
    assert snapshot(client, shard, data_upper - 1) == table_contents(url)
    return checked


def assert_bounded_reliance(client: PersistClient, shard: str, url: str, slot: str) -> None:
    """The slot confirmed nothing beyond the shards' offset resumption frontier (before
    anything is durable, that frontier is the snapshot's, and the slot's creation point
    may be anywhere: a restart takes the snapshot again). The slot is read first: the shards
    only move on, so a running ingest that commits between the two reads cannot fail it
    (read the other way round, it did, now and then, with an ingest under load)."""
    confirmed = flushed(url, slot)
    offset = resumption_offset(client, shard)
    assert offset == 0 or confirmed <= offset, f"slot {slot} at {confirmed}, shards at {offset}"
