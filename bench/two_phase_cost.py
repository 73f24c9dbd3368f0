"""Object-store and DynamoDB requests per WAL SST write and per manifest write, by CAS mode.

    python -m bench.two_phase_cost --writes 200

Runs against a moto server on 127.0.0.1 (S3 and DynamoDB). S3 requests are counted on the
store *under* the two-phase layer, DynamoDB calls by the records client, so the table shows
what each logical write costs on the wire, with latency medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from slatepy import Db, Settings
from slatepy.manifest.store import ManifestStore
from slatepy.store import MetricsStore, StoreMetrics, open_store
from slatepy.store.base import ObjectStore
from slatepy.store.dynamodb import create_table
from slatepy.store.twophase import TwoPhaseStore
from slatepy.testing.moto import create_bucket, moto_server


def per_op(metrics: StoreMetrics, before: dict[str, int], n: int) -> str:
    now = {k: v.requests for k, v in metrics.snapshot().items()}
    deltas = {k: (now[k] - before.get(k, 0)) / n for k in now if now[k] != before.get(k, 0)}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(deltas.items())) or "-"


def counts(metrics: StoreMetrics) -> dict[str, int]:
    return {k: v.requests for k, v in metrics.snapshot().items()}


def run(mode: str, settings: Settings, url: str, writes: int) -> list[str]:
    base = open_store(url, settings, create=True)
    s3 = MetricsStore(base.inner if isinstance(base, TwoPhaseStore) else base)
    ddb = base.records.metrics if isinstance(base, TwoPhaseStore) else StoreMetrics()
    store: ObjectStore = TwoPhaseStore(s3, base.records) if isinstance(base, TwoPhaseStore) else s3
    rows = []
    with Db.open(store, settings=settings) as db:
        s3_before, ddb_before = counts(s3.metrics), counts(ddb)
        latencies = []
        for i in range(writes):
            t = time.perf_counter()
            db.put(b"key%06d" % i, b"v" * 100)
            latencies.append(time.perf_counter() - t)
        rows.append(
            f"| {mode} | WAL SST (durable put) | {per_op(s3.metrics, s3_before, writes)} "
            f"| {per_op(ddb, ddb_before, writes)} | {statistics.median(latencies) * 1e3:.2f} |"
        )
    manifests = ManifestStore(store)
    manifests.load()
    s3_before, ddb_before = counts(s3.metrics), counts(ddb)
    latencies = []
    for _ in range(writes // 4):
        t = time.perf_counter()
        manifests.update(lambda m, _: m)
        latencies.append(time.perf_counter() - t)
    n = writes // 4
    rows.append(
        f"| {mode} | manifest update | {per_op(s3.metrics, s3_before, n)} "
        f"| {per_op(ddb, ddb_before, n)} | {statistics.median(latencies) * 1e3:.2f} |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=200)
    args = parser.parse_args()
    with moto_server() as endpoint:
        create_bucket(endpoint, "bench")
        common = {
            "s3_endpoint": endpoint.url,
            "s3_access_key_id": endpoint.access_key_id,
            "s3_secret_access_key": endpoint.secret_access_key,
            "compactor": "off",
        }
        two_phase = Settings.from_dict(
            {
                **common,
                "cas": "dynamodb",
                "dynamodb_table": "bench",
                "dynamodb_endpoint": endpoint.url,
            }
        )
        create_table(two_phase)
        print("| CAS | write | S3 requests per write | DynamoDB calls per write | p50 ms |")
        print("|---|---|---|---|---|")
        for mode, settings in (
            ("conditional", Settings.from_dict(common)),
            ("dynamodb", two_phase),
        ):
            for row in run(mode, settings, f"s3://bench/{uuid.uuid4().hex[:8]}", args.writes):
                print(row, flush=True)


if __name__ == "__main__":
    main()
