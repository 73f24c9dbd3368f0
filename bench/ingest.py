"""What the sources sustain (issue 30's benchmarks; RFC 0027).

    python -m bench.ingest [--seconds 10] [--name ingest] [--quick]

A throwaway PostgreSQL 15 (``wal_level=logical``) on 127.0.0.1 and a persist location on the
file store, the in-process ingest (the embedded default: ``tick`` 0.1 s, commits every 1 s):

* **bulk**: 100 transactions of 2,000 inserted rows each, committed as fast as one
  connection can, while the ingest runs: updates/s from the first commit until every row is
  durable in the data shard.
* **lag**: pgbench-style transactions (an insert into ``history``, updates of an account
  and a teller) at about 200 a second for ``--seconds``: the time from each ``COMMIT``
  returning to the transaction's history row being delivered by a persist ``listen`` on the
  data shard (same process), p50/p99 ms.
* **WAL retained**: ``pg_current_wal_lsn() - restart_lsn`` of the slot each second of the lag
  run (max, last) and how far ``confirmed_flush_lsn`` advanced.
* **loadgen**: the load generator (4 partitions, no rate limit) into a data shard: updates/s.
* with ``--spark``, on Spark ``local[2]``: the **lag** as above, with ``slatepy.postgres``
  (a publication of ``history`` alone) into ``slatepy.persist`` as a running stream
  (a micro-batch every 0.2 s); ``slatepy.loadgen`` into ``slatepy.persist``
  (4 partitions x 25,000 offsets, ``trigger(availableNow=True)``, 5,000 offsets a partition
  per batch) and ``slatepy.postgres`` (the bulk table's rows read again, through a new
  slot's snapshot): updates/s.

Writes ``bench/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

from slatepy.persist import PersistClient, Updates
from slatepy.sources import Ingest, LoadGen
from slatepy.sources.postgres import PostgresSource
from slatepy.testing.postgres import postgres_server

RESULTS = Path(__file__).parent / "results"

SCHEMA = (
    "CREATE TABLE accounts (aid int PRIMARY KEY, abalance int)",
    "CREATE TABLE tellers (tid int PRIMARY KEY, tbalance int)",
    "CREATE TABLE history (hid bigint PRIMARY KEY, aid int, tid int, delta int, at float8)",
    "INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 10000) g",
    "INSERT INTO tellers SELECT g, 0 FROM generate_series(1, 10) g",
    "ALTER TABLE accounts REPLICA IDENTITY FULL",
    "ALTER TABLE tellers REPLICA IDENTITY FULL",
    "ALTER TABLE history REPLICA IDENTITY FULL",
    "CREATE PUBLICATION bench FOR TABLE accounts, tellers, history",
    "CREATE TABLE bulk (id bigint PRIMARY KEY, v text)",
    "ALTER TABLE bulk REPLICA IDENTITY FULL",
    "CREATE PUBLICATION bulkpub FOR TABLE bulk",
)


def _sql(url: str, *statements: str) -> list[Any]:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for s in statements:
                cur.execute(s)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _running(ingest: Ingest) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,))
    thread.start()
    return stop, thread


def bulk(url: str, client: PersistClient, txns: int, rows: int) -> dict[str, Any]:
    source = PostgresSource(url, "bulkpub", slot="bench_bulk")
    ingest = Ingest(client, source, data_shards=["bulk"], remap_shard="bulk.remap")
    stop, thread = _running(ingest)
    time.sleep(1.0)  # the (empty) snapshot
    conn = psycopg2.connect(url)
    start = time.monotonic()
    with conn.cursor() as cur:
        for i in range(txns):
            cur.execute(
                "INSERT INTO bulk SELECT g, repeat('v', 100) FROM generate_series(%s, %s) g",
                (i * rows, (i + 1) * rows - 1),
            )
            conn.commit()
    conn.close()
    committed = time.monotonic() - start
    while ingest.rows < txns * rows:
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    stop.set()
    thread.join()
    return {
        "updates": txns * rows,
        "committing_s": committed,
        "seconds": elapsed,
        "updates_per_s": txns * rows / elapsed,
    }


def lag(url: str, client: PersistClient, seconds: float) -> dict[str, Any]:
    source = PostgresSource(url, "bench", slot="bench_lag")
    shards = [f"pgbench.{name}" for name in source.outputs]
    ingest = Ingest(client, source, data_shards=shards, remap_shard="pgbench.remap")
    stop, thread = _running(ingest)
    time.sleep(1.0)
    try:
        return pgbench_lag(url, client, "pgbench.public.history", "bench_lag", seconds)
    finally:
        stop.set()
        thread.join()


def pgbench_lag(
    url: str, client: PersistClient, shard: str, slot: str, seconds: float
) -> dict[str, Any]:
    """The pgbench-style load for ``seconds`` while an ingest (of any kind) writes the
    ``history`` table into ``shard``: COMMIT to persist listen lag, WAL retained by ``slot``."""
    commits: dict[bytes, float] = {}
    lags: list[float] = []
    reader = client.open_leased_reader(shard)
    listen = reader.listen(0)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for event in listen.fetch_next(timeout=0.2):
                if isinstance(event, Updates):
                    now = time.monotonic()
                    for (key, _), _, diff in event.updates:
                        if diff > 0 and key in commits:
                            lags.append(now - commits[key])

    watcher = threading.Thread(target=watch)
    watcher.start()
    retained: list[int] = []
    slot_sql = (
        "SELECT pg_current_wal_lsn() - restart_lsn, confirmed_flush_lsn - '0/0'::pg_lsn "
        f"FROM pg_replication_slots WHERE slot_name = '{slot}'"
    )
    first_flush = int(_sql(url, slot_sql)[0][1])
    hid = first = int(_sql(url, "SELECT coalesce(max(hid), 0) FROM history")[0][0])
    conn = psycopg2.connect(url)
    start = last_sample = time.monotonic()
    with conn.cursor() as cur:
        while time.monotonic() - start < seconds:
            hid += 1
            aid, tid = 1 + hid * 7919 % 10000, 1 + hid % 10
            cur.execute("UPDATE accounts SET abalance = abalance + 1 WHERE aid = %s", (aid,))
            cur.execute("UPDATE tellers SET tbalance = tbalance + 1 WHERE tid = %s", (tid,))
            cur.execute("INSERT INTO history VALUES (%s, %s, %s, 1, 0)", (hid, aid, tid))
            conn.commit()
            commits[json.dumps([str(hid)], separators=(",", ":")).encode()] = time.monotonic()
            if time.monotonic() - last_sample >= 1.0:
                retained.append(int(_sql(url, slot_sql)[0][0]))
                last_sample = time.monotonic()
            time.sleep(0.004)
    conn.close()
    count = hid - first
    deadline = time.monotonic() + 30
    while len(lags) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)  # one more commit upstream
    last_flush = int(_sql(url, slot_sql)[0][1])
    done.set()
    watcher.join()
    listen.close()
    reader.expire()
    ms = sorted(x * 1000 for x in lags)
    return {
        "transactions": count,
        "transactions_per_s": count / seconds,
        "delivered": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[int(0.99 * (len(ms) - 1))],
        "wal_retained_max_bytes": max(retained, default=0),
        "wal_retained_last_bytes": retained[-1] if retained else 0,
        "slot_advanced_bytes": last_flush - first_flush,
    }


def spark_lag(spark: Any, url: str, tmp: str, seconds: float) -> dict[str, Any]:
    """``slatepy.postgres`` (a one-table publication of ``history``) into ``slatepy.persist``
    as a running stream (a micro-batch every 0.2 s) under the pgbench-style load: the lag from
    COMMIT to a persist listen in this process."""
    _sql(url, "CREATE PUBLICATION historypub FOR TABLE history")
    store = f"file://{tmp}/spark-store"
    query = (
        spark.readStream.format("slatepy.postgres")
        .option("connection", url)
        .option("publication", "historypub")
        .option("slot", "bench_spark_lag")
        .option("pollSeconds", "0.1")
        .option("url", store)
        .option("shard", "history")
        .load()
        .writeStream.format("slatepy.persist")
        .option("url", store)
        .option("shard", "history")
        .option("timeColumn", "time")
        .option("checkpointLocation", f"{tmp}/ckpt-history")
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        with PersistClient.open(store) as client:
            deadline = time.monotonic() + 120
            while (client.machine("history").fetch().upper or 0) == 0:  # the snapshot
                assert query.exception() is None and time.monotonic() < deadline
                time.sleep(0.2)
            return pgbench_lag(url, client, "history", "bench_spark_lag", seconds)
    finally:
        query.stop()


def loadgen(client: PersistClient, seconds: float) -> dict[str, Any]:
    ingest = Ingest(client, LoadGen(4, batch=5000), data_shards=["gen"], remap_shard="gen.remap")
    stop, thread = _running(ingest)
    time.sleep(seconds)
    stop.set()
    thread.join()
    return {"updates": ingest.rows, "seconds": seconds, "updates_per_s": ingest.rows / seconds}


def spark_runs(url: str, tmp: str, seconds: float) -> dict[str, Any]:
    from slatepy.spark.session import local_session

    spark = local_session("bench-ingest")
    out: dict[str, Any] = {}
    try:
        store = f"file://{tmp}/spark-store"
        Path(f"{tmp}/spark-store").mkdir()
        out["lag"] = spark_lag(spark, url, tmp, seconds)
        print("spark lag", out["lag"], flush=True)
        for name, reader, events in (
            (
                "loadgen",
                spark.readStream.format("slatepy.loadgen")
                .option("partitions", "4")
                .option("end", "25000")
                .option("maxOffsetsPerTrigger", "5000"),
                100_000,  # one update an event (a fifth are deletes of earlier inserts)
            ),
            (
                "postgres",
                spark.readStream.format("slatepy.postgres")
                .option("connection", url)
                .option("publication", "bulkpub"),
                0,
            ),
        ):
            updates = events or int(_sql(url, "SELECT count(*) FROM bulk")[0][0])
            df = reader.option("url", store).option("shard", name).load()
            start = time.monotonic()
            query = (
                df.writeStream.format("slatepy.persist")
                .option("url", store)
                .option("shard", name)
                .option("timeColumn", "time")
                .option("checkpointLocation", f"{tmp}/ckpt-{name}")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            seconds = time.monotonic() - start
            out[name] = {
                "updates": updates,
                "seconds": seconds,
                "updates_per_s": updates / seconds,
            }
            print("spark", name, out[name], flush=True)
    finally:
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--name", default="ingest")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--spark", action="store_true", help="also on Spark local[2]")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    txns = 10 if args.quick else 100
    results: dict[str, Any] = {}
    with postgres_server(logical=True) as server, tempfile.TemporaryDirectory() as tmp:
        url = server.url()
        _sql(url, *SCHEMA)
        with PersistClient.open(f"file://{tmp}") as client:
            results["bulk"] = bulk(url, client, txns, 2000)
            print("bulk", results["bulk"], flush=True)
            results["lag"] = lag(url, client, seconds)
            print("lag", results["lag"], flush=True)
            results["loadgen"] = loadgen(client, seconds)
            print("loadgen", results["loadgen"], flush=True)
        if args.spark:
            results["spark"] = spark_runs(url, tmp, seconds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=2))
    (RESULTS / f"{args.name}.md").write_text(render(results, args))
    print(render(results, args))


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    b, g, lg = results["bulk"], results["lag"], results["loadgen"]
    quick = (" --quick" if args.quick else "") + (" --spark" if args.spark else "")
    return "\n".join(
        [
            f"Run `python -m bench.ingest --seconds {args.seconds:g} --name {args.name}{quick}`"
            " (PostgreSQL 15 on 127.0.0.1, file store, in-process ingest).",
            "",
            "| measure | value |",
            "|---|---|",
            f"| bulk ingest ({b['updates']:,} inserted rows) | {b['updates_per_s']:,.0f} "
            f"updates/s (PostgreSQL committed them in {b['committing_s']:.1f} s) |",
            f"| pgbench-style load | {g['transactions_per_s']:.0f} transactions/s, "
            f"{g['delivered']:,} delivered |",
            f"| lag, COMMIT to persist listen | p50 {g['p50_ms']:.0f} ms, p99 "
            f"{g['p99_ms']:.0f} ms |",
            f"| WAL retained by the slot | max {g['wal_retained_max_bytes'] / 1024:,.0f} KiB, "
            f"last {g['wal_retained_last_bytes'] / 1024:,.0f} KiB |",
            f"| slot confirmed_flush_lsn advanced | {g['slot_advanced_bytes'] / 1024:,.0f} KiB |",
            f"| loadgen (4 partitions) | {lg['updates_per_s']:,.0f} updates/s |",
            *(
                f"| Spark local[2]: slatepy.{name} into slatepy.persist ({r['updates']:,} "
                f"updates) | {r['updates_per_s']:,.0f} updates/s |"
                for name, r in results.get("spark", {}).items()
                if name != "lag"
            ),
            *(
                f"| Spark local[2]: lag, COMMIT to persist listen ({r['transactions']:,} "
                f"transactions, 0.2 s trigger) | p50 {r['p50_ms']:.0f} ms, p99 "
                f"{r['p99_ms']:.0f} ms |"
                for r in [results.get("spark", {}).get("lag")]
                if r is not None
            ),
            "",
        ]
    )


if __name__ == "__main__":
    main()
