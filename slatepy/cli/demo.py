"""``slatepy demo``: a realistic run on a local-directory store (or ``--url``), with its cost.

The workload is an order-event log: an ingest of orders in awaited batches, single durable
updates (the latency a service sees), concurrent writers sharing WAL PUTs, deletes, a range
scan, then a reopen that replays the WAL and checks every acknowledged write.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from slatepy.config import resolve_settings
from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader


def order_key(i: int) -> bytes:
    return b"order/%08d" % i


def order_value(i: int, status: str) -> bytes:
    return b'{"id":%d,"status":"%s","amount_cents":%d}' % (i, status.encode(), (i * 7919) % 100_000)


def run_demo(
    directory: Path, *, orders: int = 20_000, out: object = print, url: str | None = None
) -> dict[str, float]:
    """Run the demo against ``file://{directory}`` (or ``url`` when given: any store, such as
    MinIO in the compose loop); return the figures it printed."""
    say = out if callable(out) else print
    url = url or f"file://{directory.resolve()}"
    settings = resolve_settings()
    figures: dict[str, float] = {}
    # What every acknowledged write says the database holds; the reopen is checked against it.
    expected: dict[bytes, bytes | None] = {}
    say(f"slatepy demo on {url}")

    with Db.open(url, settings=settings) as db:
        say(f"  opened as writer epoch {db.epoch}, replayed {db.replayed_ssts} WAL SSTs")
        start = time.perf_counter()
        for first in range(0, orders, 1000):
            batch = WriteBatch()
            rows = {
                order_key(i): order_value(i, "placed")
                for i in range(first, min(first + 1000, orders))
            }
            for key, value in rows.items():
                batch.put(key, value)
            db.write(batch)
            expected.update(rows)
        elapsed = time.perf_counter() - start
        figures["ingest_rows_per_s"] = orders / elapsed
        say(f"  ingest: {orders} orders in awaited batches of 1000: {orders / elapsed:,.0f} rows/s")

        latencies = []
        for i in range(200):
            t = time.perf_counter()
            db.put(order_key(i), order_value(i, "paid"))
            latencies.append(time.perf_counter() - t)
            expected[order_key(i)] = order_value(i, "paid")
        figures["durable_put_p50_ms"] = statistics.median(latencies) * 1e3
        p99 = sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1e3
        say(f"  200 durable updates: p50 {figures['durable_put_p50_ms']:.2f} ms, p99 {p99:.2f} ms")

        puts_before = db.metrics.requests("put")
        threads, per_thread = 8, 50

        def ship(t: int) -> None:
            for j in range(per_thread):
                i = 200 + t * per_thread + j
                db.put(order_key(i), order_value(i, "shipped"))

        workers = [threading.Thread(target=ship, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for i in range(200, 200 + threads * per_thread):
            expected[order_key(i)] = order_value(i, "shipped")
        shared = db.metrics.requests("put") - puts_before
        say(
            f"  {threads} threads x {per_thread} durable updates: {shared} WAL PUTs "
            f"for {threads * per_thread} writes (group commit)"
        )

        cancelled = range(max(orders - 100, 0), orders)
        for i in cancelled:
            db.delete(order_key(i), await_durable=False)
            expected[order_key(i)] = None
        db.flush()
        say(f"  cancelled {len(cancelled)} orders (unawaited deletes, then one flush)")
        shipped = sum(1 for _, v in db.scan(order_key(200), order_key(600)) if b"shipped" in v)
        say(f"  scan order/00000200..order/00000600: {shipped} shipped orders")
        say("  object-store requests while writing:")
        for line in db.metrics.format_table().splitlines():
            say("    " + line)

        start = time.perf_counter()
        tail = db.next_wal_id - 1
        while db.wal_id_last_compacted < tail and time.perf_counter() - start < 60:
            time.sleep(0.05)
        say(
            f"  in-process compactor: WAL compacted through id {db.wal_id_last_compacted} "
            f"{time.perf_counter() - start:.2f} s after the last write"
        )

        with DbReader.open(url, settings=settings) as reader:
            same = dict(reader.scan(b"order/")) == dict(db.scan(b"order/"))
            lags = []
            for i in range(20):
                value = order_value(i, f"refunded-{i}")
                db.put(order_key(i), value)
                expected[order_key(i)] = value
                t = time.perf_counter()
                while reader.get(order_key(i)) != value and time.perf_counter() - t < 10:
                    time.sleep(0.001)
                lags.append(time.perf_counter() - t)
            figures["reader_lag_p50_ms"] = statistics.median(lags) * 1e3
            say(
                f"  snapshot reader: same {len(dict(reader.scan(b'order/')))} orders as the "
                f"writer: {'yes' if same else 'NO'}; sees a durable write after p50 "
                f"{figures['reader_lag_p50_ms']:.0f} ms (poll every "
                f"{settings.reader_poll_interval * 1e3:.0f} ms)"
            )

    start = time.perf_counter()
    with Db.open(url, settings=settings) as db:
        reopen = time.perf_counter() - start
        stored = dict(db.scan(b"order/"))
        live = len(stored)
        ok = stored == {k: v for k, v in expected.items() if v is not None} and all(
            db.get(key) == value for key, value in expected.items()
        )
        say(
            f"  reopened in {reopen:.2f} s (epoch {db.epoch}, replayed {db.replayed_ssts} WAL "
            f"SSTs): {live} live orders, every acknowledged write {'verified' if ok else 'MISSING'}"
        )
        if not ok:
            raise SystemExit("demo: acknowledged writes are missing after reopen")
    figures["reopen_s"] = reopen
    return figures
