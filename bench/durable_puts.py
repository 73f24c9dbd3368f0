"""Sequential durable puts (default settings, compactor off): latency and store requests.

    python -m bench.durable_puts --count 10000 --backends memory file s3
    python -m bench.durable_puts --count 2000 --backends file --file-sync fsync off

``s3`` runs against a moto server this script starts on 127.0.0.1. Besides the puts it
measures one raw conditional PUT on the same store (the physical floor for a durable put).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import location
from slatepy import Db
from slatepy.store import ObjectStore, open_store


def raw_put_ms(store: ObjectStore, samples: int = 200) -> float:
    times = []
    for i in range(samples):
        t = time.perf_counter()
        store.put(f"floor/{i}", b"x" * 200, mode="create")
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def run(name: str, count: int, file_sync: str = "fsync") -> str:
    with location(name, file_sync=file_sync) as (url, settings):
        store = open_store(url, settings, create=True)
        floor = raw_put_ms(store)
        with Db.open(store, settings=settings) as db:
            db.metrics.reset()
            latencies = []
            start = time.perf_counter()
            for i in range(count):
                t = time.perf_counter()
                db.put(b"key%013d" % i, b"v" * 100)
                latencies.append(time.perf_counter() - t)
            elapsed = time.perf_counter() - start
            ops = db.metrics.snapshot()
        p50 = statistics.median(latencies) * 1e3
        p99 = sorted(latencies)[int(count * 0.99) - 1] * 1e3
        requests = ", ".join(f"{k}={v.requests}" for k, v in sorted(ops.items()))
        put_bytes = ops["put"].bytes_out if "put" in ops else 0
        label = f"{name} (file_sync={file_sync})" if name == "file" else name
        return (
            f"| {label} | {count} | {count / elapsed:,.0f} | {p50:.3f} | {p99:.3f} | {floor:.3f} "
            f"| {p50 / floor:.2f} | {requests} | {put_bytes / count:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--backends", nargs="+", default=["memory", "file", "s3"])
    parser.add_argument(
        "--file-sync",
        nargs="+",
        choices=["fsync", "off"],
        default=["fsync"],
        help="Settings.file_sync values to run the file backend with (one row each)",
    )
    args = parser.parse_args()
    print(
        "| store | puts | puts/s | p50 ms | p99 ms | raw create PUT p50 ms | p50 / PUT "
        "| requests | PUT bytes/put |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.backends:
        for file_sync in args.file_sync if name == "file" else ["fsync"]:
            print(run(name, args.count, file_sync), flush=True)


if __name__ == "__main__":
    main()
