"""slatepy vs SlateDB (``slatedb`` 0.17 on PyPI), same workloads, same run, same stores.

    pip install -e ".[bench]"
    python -m bench --keys 20000 --stores memory s3 --name compare

Workloads (16-byte keys, 100-byte values): puts without awaiting durability; batches of 1,000
awaited; sequential durable puts (p50/p99); random gets from the memtable; random gets from
SSTs with warm caches; gets from a freshly opened reader; a full scan; 80/20 get/put with 4
workers. Stores: ``memory``, ``file``, ``s3`` (moto in its own process on 127.0.0.1) and
``minio`` (the MinIO of ``compose.yaml``, given ``SLATEPY_TEST_S3_ENDPOINT``). Next to each
time: slatepy's object-store requests and bytes moved per 1,000 operations (SlateDB's
requests happen inside its Rust core and are not observable here), and the store's raw
conditional PUT and GET latency from the same run. Writes ``bench/results/<name>.json``, a
Markdown table ``<name>.md``, and ``<name>.png`` when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from bench.engines import ENGINES, median_ms, p99_ms
from bench.proxy import LatencyProxy
from slatepy import Settings
from slatepy.store import ObjectStore, open_store
from slatepy.testing.moto import S3Endpoint, create_bucket, moto_server

RESULTS = Path(__file__).parent / "results"
VALUE = b"v" * 100


def key(i: int) -> bytes:
    return b"key%013d" % i


@contextmanager
def store_location(
    name: str, latency_ms: float = 0.0, disk_cache: Literal["auto", "on", "off"] = "auto"
) -> Iterator[Callable[[str], tuple[str, Settings]]]:
    """Yields ``fresh(engine) -> (url, settings)``: a new empty location per engine.

    With ``latency_ms`` an S3 store is reached through :class:`bench.proxy.LatencyProxy`
    (that many ms ± a third of it per request), for both engines alike."""
    if name == "memory":
        yield lambda _: ("memory:///", Settings())
    elif name == "file":
        with tempfile.TemporaryDirectory() as tmp:
            yield lambda engine: (f"file://{tmp}/{engine}-{uuid.uuid4().hex[:6]}", Settings())
    elif name in ("s3", "minio"):
        with (
            _s3_endpoint(name, latency_ms) as (endpoint, bucket),
            tempfile.TemporaryDirectory() as cache_dir,  # every run starts with a cold cache
        ):
            os.environ.update(
                {
                    "AWS_ENDPOINT_URL": endpoint.url,
                    "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
                    "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
                    "AWS_REGION": endpoint.region,
                    "AWS_ALLOW_HTTP": "true",
                }
            )
            settings = Settings(
                s3_endpoint=endpoint.url,
                s3_access_key_id=endpoint.access_key_id,
                s3_secret_access_key=endpoint.secret_access_key,
                disk_cache=disk_cache,
                disk_cache_dir=cache_dir,
            )
            yield lambda engine: (f"s3://{bucket}/{engine}-{uuid.uuid4().hex[:6]}", settings)
    else:
        raise SystemExit(f"unknown store {name!r}")


@contextmanager
def _s3_endpoint(name: str, latency_ms: float = 0.0) -> Iterator[tuple[S3Endpoint, str]]:
    """moto in its own process (``s3``), or the MinIO of ``compose.yaml`` (``minio``: set
    ``SLATEPY_TEST_S3_ENDPOINT``, and ``SLATEPY_TEST_S3_ACCESS_KEY``/``_SECRET_KEY`` if they
    are not minioadmin; the bucket ``slatepy`` must exist)."""
    if name == "minio":
        url = os.environ.get("SLATEPY_TEST_S3_ENDPOINT")
        if not url:
            raise SystemExit("--stores minio needs SLATEPY_TEST_S3_ENDPOINT (see compose.yaml)")
        yield (
            S3Endpoint(
                url,
                access_key_id=os.environ.get("SLATEPY_TEST_S3_ACCESS_KEY", "minioadmin"),
                secret_access_key=os.environ.get("SLATEPY_TEST_S3_SECRET_KEY", "minioadmin"),
            ),
            "slatepy",
        )
        return
    with moto_server(separate_process=True) as endpoint:
        create_bucket(endpoint, "bench")
        if not latency_ms:
            yield endpoint, "bench"
            return
        target = urlsplit(endpoint.url)
        assert target.hostname is not None and target.port is not None
        delay = latency_ms / 1000
        with LatencyProxy(target.hostname, target.port, delay=delay, jitter=delay / 3) as proxy:
            yield (
                S3Endpoint(
                    proxy.url,
                    access_key_id=endpoint.access_key_id,
                    secret_access_key=endpoint.secret_access_key,
                ),
                "bench",
            )


def floor_ms(store: ObjectStore, samples: int = 50) -> dict[str, float]:
    """The raw cost of one conditional PUT and one GET on this store, now."""
    puts, gets = [], []
    for i in range(samples):
        start = time.perf_counter()
        store.put(f"floor/{i}", b"x" * 200, mode="create")
        puts.append(time.perf_counter() - start)
        start = time.perf_counter()
        store.get(f"floor/{i}")
        gets.append(time.perf_counter() - start)
    # The store's bandwidth for one large GET (through the latency proxy, if any): what a
    # cold scan streaming at "the store's bandwidth" would reach.
    big = os.urandom(32 * 2**20)
    store.put("floor/big", big)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        assert len(store.get("floor/big")) == len(big)
        times.append(time.perf_counter() - start)
    return {
        "put_ms": median_ms(puts),
        "get_ms": median_ms(gets),
        "get_mb_per_s": len(big) / 2**20 / statistics.median(times),
    }


def per_1000(before: dict[str, int], after: dict[str, int], ops: int) -> dict[str, float]:
    return {
        k: round((after[k] - before.get(k, 0)) * 1000 / ops, 2)
        for k in after
        if after[k] != before.get(k, 0)
    }


def requests(engine: Any) -> dict[str, int]:
    """Requests by kind, plus ``bytes`` moved (sent + received), so far."""
    metrics = engine.metrics
    if metrics is None:
        return {}
    ops = metrics.snapshot()
    counts = {k: v.requests for k, v in ops.items()}
    counts["bytes"] = sum(v.bytes_in + v.bytes_out for v in ops.values())
    return counts


def run_engine(engine_name: str, url: str, settings: Settings, keys: int) -> dict[str, Any]:
    rng = random.Random(1)
    all_keys = [key(i) for i in range(keys)]
    shuffled = all_keys[:]
    rng.shuffle(shuffled)
    results: dict[str, Any] = {}

    def measure(name: str, ops: int, fn: Callable[[], Any], unit: str = "ops/s") -> Any:
        before = requests(engine)
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        results[name] = {
            "rate": ops / elapsed,
            "unit": unit,
            "seconds": elapsed,
            "requests_per_1000": per_1000(before, requests(engine), ops),
        }
        return out

    engine = ENGINES[engine_name](url, settings)
    try:
        measure("puts (not awaited)", keys, lambda: engine.put_many(all_keys, VALUE))
        batch_keys = [b"b" + k[1:] for k in all_keys]
        measure(
            "batches of 1000, awaited",
            keys,
            lambda: engine.batches(batch_keys, VALUE, 1000),
            "rows/s",
        )
        durable = [b"d" + k[1:] for k in all_keys[: min(200, keys)]]
        latencies = measure(
            "durable puts", len(durable), lambda: engine.durable_puts(durable, VALUE)
        )
        results["durable puts"].update(p50_ms=median_ms(latencies), p99_ms=p99_ms(latencies))
        sample = shuffled[: min(keys, 10_000)]
        found = measure("gets, memtable", len(sample), lambda: engine.get_many(sample))
        assert found == len(sample), (engine_name, found)
        engine.to_ssts()
        engine.get_many(sample)  # warm the caches
        measure("gets, SSTs warm", len(sample), lambda: engine.get_many(sample))
        rows = measure("full scan", keys * 2 + len(durable), engine.scan_all, "rows/s")
        assert rows == keys * 2 + len(durable), (engine_name, rows)
        ops = min(keys, 20_000)
        measure("mixed 80/20, 4 workers", ops, lambda: engine.mixed(shuffled, VALUE, ops, 4))
        reader_sample = shuffled[:200]
        found, reader_requests = measure(
            "gets, fresh reader",
            len(reader_sample),
            lambda: engine.fresh_reader_gets(reader_sample),
        )
        results["gets, fresh reader"]["reader_requests_per_1000"] = {
            k: v * 1000 / len(reader_sample) for k, v in reader_requests.items()
        }
        rows, scanned, seconds = engine.fresh_reader_scan()
        assert rows == keys * 2 + len(durable), (engine_name, rows)
        results["full scan, fresh reader"] = {
            "rate": rows / seconds,
            "unit": "rows/s",
            "seconds": seconds,
            "requests_per_1000": {},
        }
        if scanned:
            results["full scan, fresh reader"]["mb_per_s"] = scanned / 2**20 / seconds
        if engine_name == "slatepy":
            batched = shuffled[: min(keys, 5000)]
            found, batched_requests = measure(
                "batched gets (1,000), fresh reader",
                len(batched),
                lambda: engine.fresh_reader_batched_gets(batched),
            )
            assert found == len(batched), found
            results["batched gets (1,000), fresh reader"]["reader_requests_per_1000"] = {
                k: v * 1000 / len(batched) for k, v in batched_requests.items()
            }
            with tempfile.TemporaryDirectory() as cache_dir:
                first, second = engine.restarted_reader_gets(reader_sample, cache_dir)
            results["restarted reader, disk cache"] = {
                "rate": second,
                "unit": f"gets/s (first pass {first:,.0f}: {second / first:.1f}x)",
                "seconds": 0.0,
                "requests_per_1000": {},
            }
    finally:
        engine.close()
    return results


def markdown(run: dict[str, Any]) -> str:
    lines = [
        f"Run `{run['command']}` on {run['machine']}, {run['date']}.",
        "",
        "| store | workload | slatepy | slatedb | ratio | slatepy requests and bytes / 1,000 ops |",
        "|---|---|---|---|---|---|",
    ]
    for store, data in run["stores"].items():
        ours, theirs = data["engines"].get("slatepy", {}), data["engines"].get("slatedb", {})
        for workload, mine in ours.items():
            other = theirs.get(workload)
            ratio = f"{mine['rate'] / other['rate']:.1f}x" if other else "-"
            rate = f"{mine['rate']:,.0f} {mine['unit']}"
            if "p50_ms" in mine:
                rate += f" (p50 {mine['p50_ms']:.2f} ms, p99 {mine['p99_ms']:.2f} ms)"
            if "mb_per_s" in mine:
                share = mine["mb_per_s"] / data["floor"].get("get_mb_per_s", float("nan"))
                rate += f" ({mine['mb_per_s']:,.1f} MB/s, {share:.0%} of one large GET)"
            their = (
                "-"
                if not other
                else f"{other['rate']:,.0f} {other['unit']}"
                + (f" (p50 {other['p50_ms']:.2f} ms)" if "p50_ms" in other else "")
            )
            counted = mine.get("reader_requests_per_1000") or mine["requests_per_1000"]
            reqs = ", ".join(f"{k} {v:g}" for k, v in sorted(counted.items()))
            lines.append(f"| {store} | {workload} | {rate} | {their} | {ratio} | {reqs or '-'} |")
        floor = data["floor"]
        lines.append(
            f"| {store} | raw conditional PUT / GET; one 32 MB GET | {floor['put_ms']:.3f} ms / "
            f"{floor['get_ms']:.3f} ms; {floor.get('get_mb_per_s', 0):,.1f} MB/s | | | |"
        )
    return "\n".join(lines) + "\n"


def chart(run: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stores = list(run["stores"])
    fig, axes = plt.subplots(1, len(stores), figsize=(7 * len(stores), 5), squeeze=False)
    for ax, store in zip(axes[0], stores, strict=True):
        engines = run["stores"][store]["engines"]
        workloads = list(engines.get("slatepy", {}))
        ratios = [
            engines["slatepy"][w]["rate"] / engines["slatedb"][w]["rate"]
            if "slatedb" in engines and w in engines["slatedb"]
            else 0
            for w in workloads
        ]
        ax.barh(workloads, ratios)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{store}: slatepy / slatedb (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--stores", nargs="+", default=["memory", "file", "s3"])
    parser.add_argument("--engines", nargs="+", default=["slatepy", "slatedb"])
    parser.add_argument("--name", default="latest")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="per-request delay added to s3 by a proxy on the wire (bench/proxy.py)",
    )
    parser.add_argument(
        "--disk-cache",
        choices=["auto", "on", "off"],
        default="auto",
        help="slatepy's local disk cache for s3 (auto = on; in a fresh directory per run)",
    )
    args = parser.parse_args()
    run: dict[str, Any] = {
        "command": "python -m bench "
        + " ".join(
            [
                f"--keys {args.keys}",
                "--stores",
                *args.stores,
                "--engines",
                *args.engines,
                "--name",
                args.name,
                *([f"--latency-ms {args.latency_ms:g}"] if args.latency_ms else []),
                *([f"--disk-cache {args.disk_cache}"] if args.disk_cache != "auto" else []),
            ]
        ),
        "machine": f"{platform.machine()}, {platform.python_version()}, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
        "stores": {},
    }
    for store_name in args.stores:
        with store_location(store_name, args.latency_ms, args.disk_cache) as fresh:
            url, settings = fresh("floor")
            data: dict[str, Any] = {
                "floor": floor_ms(open_store(url, settings, create=True)),
                "engines": {},
            }
            for engine_name in args.engines:
                url, settings = fresh(engine_name)
                print(f"{store_name} / {engine_name} ...", flush=True)
                data["engines"][engine_name] = run_engine(engine_name, url, settings, args.keys)
            run["stores"][store_name] = data
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(run, indent=1))
    table = markdown(run)
    (RESULTS / f"{args.name}.md").write_text(table)
    charted = chart(run, RESULTS / f"{args.name}.png")
    print(table)
    print(f"wrote bench/results/{args.name}.json, .md" + (", .png" if charted else ""))


if __name__ == "__main__":
    main()
