"""A fresh reader's full scan through a slow store, against one raw GET stream (issue 33).

    python -m bench.slow_scan --keys 200000 --latency-ms 30 --in-flight 2 4 8 --repeat 3

moto in its own process behind :class:`bench.proxy.LatencyProxy` (``--latency-ms`` ± a third
a request). Writes ``--keys`` keys (16 + 100 bytes) and compacts them to one sorted run, then
measures the store's bandwidth for one large GET (``bench.__main__.floor_ms``: one 32 MB
object) and, interleaved ``--repeat`` times, a full scan by a new reader (nothing cached, disk
cache off) with each ``Settings.scan_requests_in_flight`` of ``--in-flight``: MB/s of SST
bytes read, its share of the raw GET's, rows/s and the ranged GETs it made (the reader's
store metrics). Prints the median and the spread of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.__main__ import _s3_endpoint, floor_ms
from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with _s3_endpoint("s3", args.latency_ms) as (endpoint, bucket, _):
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint.url,
                "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
                "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
                "AWS_REGION": endpoint.region,
                "AWS_ALLOW_HTTP": "true",
            }
        )
        base = {
            "s3_endpoint": endpoint.url,
            "s3_access_key_id": endpoint.access_key_id,
            "s3_secret_access_key": endpoint.secret_access_key,
            "disk_cache": "off",
            "compactor": "off",
        }
        url = f"s3://{bucket}/slow-scan"
        settings = Settings.from_dict(base)
        store = open_store(url, settings, create=True)
        with Db.open(store, settings=settings) as db:
            for first in range(0, args.keys, 1000):
                batch = WriteBatch()
                for i in range(first, min(first + 1000, args.keys)):
                    batch.put(b"key%013d" % i, b"v" * 100)
                db.write(batch, await_durable=False)
        Compactor(store, settings=settings).run_until_idle()
        raw = floor_ms(open_store(f"s3://{bucket}/floor", settings, create=True), samples=3)
        raw_mb = raw["get_mb_per_s"]
        print(f"one raw GET stream: {raw_mb:,.1f} MB/s (one 32 MB object)")
        results: dict[int, list[tuple[float, float, int]]] = {n: [] for n in args.in_flight}
        for _ in range(args.repeat):
            for n in args.in_flight:
                cold = Settings.from_dict({**base, "scan_requests_in_flight": n})
                with DbReader.open(store, settings=cold) as reader:
                    reader.metrics.reset()
                    start = time.perf_counter()
                    rows = sum(1 for _ in reader.scan())
                    elapsed = time.perf_counter() - start
                    ops = reader.metrics.snapshot()
                assert rows == args.keys, rows
                got = sum(v.bytes_in for v in ops.values())
                gets = sum(v.requests for k, v in ops.items() if k.startswith("get"))
                results[n].append((got / 2**20 / elapsed, rows / elapsed, gets))
                print(
                    f"  in flight {n}: {got / 2**20 / elapsed:,.1f} MB/s, {gets} GETs", flush=True
                )
        print(
            "| requests in flight | MB/s median [spread] | share of one raw GET | rows/s | GETs |"
        )
        print("|---|---|---|---|---|")
        for n, runs in results.items():
            mbs = [r[0] for r in runs]
            rate = statistics.median(r[1] for r in runs)
            mid = statistics.median(mbs)
            print(
                f"| {n} | {mid:,.1f} [{min(mbs):,.1f}-{max(mbs):,.1f}] | {mid / raw_mb:.0%} "
                f"[{min(mbs) / raw_mb:.0%}-{max(mbs) / raw_mb:.0%}] | {rate:,.0f} | "
                f"{statistics.median(r[2] for r in runs):,.0f} |"
            )


if __name__ == "__main__":
    main()
