"""slatepy vs SlateDB (``slatedb`` 0.17 on PyPI), same workloads, same run, same stores.

    pip install -e ".[bench]"
    python -m bench --keys 20000 --stores memory s3 --name compare

and against RocksDB (``rocksdict``, default options) on a local directory (issue 16):

    python -m bench --keys 200000 --stores file --engines slatepy slatedb rocksdict --repeat 3

(``--repeat N`` runs every engine N times, interleaved, and reports each workload's median:
the machine may be busy.)

Workloads (16-byte keys, 100-byte values): puts without awaiting durability; batches of 1,000
awaited (each durable before the next: RocksDB's ``sync``) and not awaited (RocksDB's default
write options; one flush at the end); sequential durable puts (p50/p99); random gets of
recent writes (slatepy's memtable keeps them, ``memtable_retain_bytes``); random gets from
SSTs with warm caches, one a call and 1,000 a call (``Db.get_many``, RocksDB's multi-get);
gets from a freshly opened reader; a full scan; 80/20 get/put with 4 workers. Stores:
``memory``, ``file``, ``s3`` (moto in its own process on 127.0.0.1) and ``minio`` (the MinIO
of ``compose.yaml``, given ``SLATEPY_TEST_S3_ENDPOINT``). Next to each time: slatepy's
object-store requests and bytes moved per 1,000 operations (SlateDB's requests happen inside
its Rust core: only the latency proxy below counts them), and the store's raw conditional
PUT and GET latency from the same run. Writes ``bench/results/<name>.json``, a Markdown
table ``<name>.md``, and ``<name>.png`` when matplotlib is installed.

Against a store as slow as real S3 (issue 15):

    python -m bench --latency-ms 30 --name latency30-requests     # a few minutes

puts moto behind :class:`bench.proxy.LatencyProxy` (30 ± 10 ms a request; ``--jitter-ms``)
and runs only ``s3`` unless ``--stores`` says otherwise. It adds durable puts from 8 and 64
concurrent writers (p50/p99; 1 writer is "durable puts"), the lag until a reader in the same
process sees a durable write (p50/p99, ``--lag-writes``), and, for every workload, the
requests the proxy saw per 1,000 operations by kind (GET, PUT, POST, LIST, HEAD, DELETE):
SlateDB's included, and an independent count of slatepy's. Cold gets are "gets, fresh
reader" (a new reader, nothing cached in memory or on disk), warm gets "gets, SSTs warm".
The extra chart is ``<name>-latency.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from bench.engines import ENGINES, median_ms, p99_ms
from bench.proxy import LatencyProxy
from bench.reopen_read import run_reopen
from slatepy import Settings
from slatepy.store import ObjectStore, open_store
from slatepy.testing.moto import S3Endpoint, create_bucket, moto_server

RESULTS = Path(__file__).parent / "results"
VALUE = b"v" * 100


def key(i: int) -> bytes:
    return b"key%013d" % i


class Locations:
    """``locations(engine) -> (url, settings)``: a new empty location per engine, and the
    latency proxy in front of the store (None without one), which counts every request."""

    def __init__(
        self, fresh: Callable[[str], tuple[str, Settings]], proxy: LatencyProxy | None = None
    ) -> None:
        self.fresh, self.proxy = fresh, proxy

    def __call__(self, engine: str) -> tuple[str, Settings]:
        return self.fresh(engine)


@contextmanager
def store_location(
    name: str,
    latency_ms: float = 0.0,
    disk_cache: Literal["auto", "on", "off"] = "auto",
    jitter_ms: float | None = None,
    *,
    count: bool = False,
) -> Iterator[Locations]:
    """A new empty location per engine (see :class:`Locations`).

    With ``latency_ms`` (or ``count``) an S3 store is reached through
    :class:`bench.proxy.LatencyProxy` (that many ms ± ``jitter_ms``, default a third of it,
    per request), for both engines alike."""
    if name == "memory":
        yield Locations(lambda _: ("memory:///", Settings()))
    elif name == "file":
        with tempfile.TemporaryDirectory() as tmp:
            yield Locations(
                lambda engine: (f"file://{tmp}/{engine}-{uuid.uuid4().hex[:6]}", Settings())
            )
    elif name in ("s3", "minio"):
        with (
            _s3_endpoint(name, latency_ms, jitter_ms, count=count) as (endpoint, bucket, proxy),
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
            yield Locations(
                lambda engine: (f"s3://{bucket}/{engine}-{uuid.uuid4().hex[:6]}", settings), proxy
            )
    else:
        raise SystemExit(f"unknown store {name!r}")


@contextmanager
def _s3_endpoint(
    name: str, latency_ms: float = 0.0, jitter_ms: float | None = None, *, count: bool = False
) -> Iterator[tuple[S3Endpoint, str, LatencyProxy | None]]:
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
            None,
        )
        return
    with moto_server(separate_process=True) as endpoint:
        create_bucket(endpoint, "bench")
        if not latency_ms and not count:
            yield endpoint, "bench", None
            return
        target = urlsplit(endpoint.url)
        assert target.hostname is not None and target.port is not None
        delay = latency_ms / 1000
        jitter = delay / 3 if jitter_ms is None else jitter_ms / 1000
        with LatencyProxy(target.hostname, target.port, delay=delay, jitter=jitter) as proxy:
            yield (
                S3Endpoint(
                    proxy.url,
                    access_key_id=endpoint.access_key_id,
                    secret_access_key=endpoint.secret_access_key,
                ),
                "bench",
                proxy,
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


def run_engine(
    engine_name: str,
    url: str,
    settings: Settings,
    keys: int,
    *,
    proxy: LatencyProxy | None = None,
    lag_writes: int = 20,
) -> dict[str, Any]:
    """Every workload on one engine; with a ``proxy``, also the requests it saw per 1,000
    operations by kind, durable puts from 8 and 64 writers, and a reader's lag."""
    rng = random.Random(1)
    all_keys = [key(i) for i in range(keys)]
    shuffled = all_keys[:]
    rng.shuffle(shuffled)
    results: dict[str, Any] = {}

    def measure(name: str, ops: int, fn: Callable[[], Any], unit: str = "ops/s") -> Any:
        before = requests(engine)
        seen = proxy.counts() if proxy else {}
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        results[name] = {
            "rate": ops / elapsed,
            "unit": unit,
            "seconds": elapsed,
            "requests_per_1000": per_1000(before, requests(engine), ops),
        }
        if proxy:
            results[name]["proxy_requests_per_1000"] = per_1000(seen, proxy.counts(), ops)
        return out

    engine = ENGINES[engine_name](url, settings)
    try:
        measure("puts (not awaited)", keys, lambda: engine.put_many(all_keys, VALUE))
        batch_keys = [b"b" + k[1:] for k in all_keys]
        measure(
            "batches of 1000, awaited",
            keys,
            lambda: engine.batches(batch_keys, VALUE, 1000, True),
            "rows/s",
        )
        loose_keys = [b"c" + k[1:] for k in all_keys]
        measure(
            "batches of 1000, not awaited",
            keys,
            lambda: engine.batches(loose_keys, VALUE, 1000, False),
            "rows/s",
        )
        durable = [b"d" + k[1:] for k in all_keys[: min(200, keys)]]
        latencies = measure(
            "durable puts", len(durable), lambda: engine.durable_puts(durable, VALUE)
        )
        results["durable puts"].update(p50_ms=median_ms(latencies), p99_ms=p99_ms(latencies))
        total = keys * 3 + len(durable)  # rows written so far
        if proxy:
            for writers in (8, 64):
                # Each writer puts at least 3; together about as many as the one writer did.
                share = max(3, len(durable) // writers)
                concurrent = [b"w%02d" % writers + k[3:] for k in all_keys[: share * writers]]
                total += len(concurrent)
                name = f"durable puts, {writers} writers"
                latencies = measure(
                    name,
                    len(concurrent),
                    partial(engine.concurrent_durable_puts, concurrent, VALUE, writers),
                )
                results[name].update(p50_ms=median_ms(latencies), p99_ms=p99_ms(latencies))
        sample = shuffled[: min(keys, 10_000)]
        found = measure("gets, memtable", len(sample), lambda: engine.get_many(sample))
        assert found == len(sample), (engine_name, found)
        engine.to_ssts()
        engine.get_many(sample)  # warm the caches
        measure("gets, SSTs warm", len(sample), lambda: engine.get_many(sample))
        if hasattr(engine, "get_batches"):  # SlateDB's Python package has no batched get
            found = measure(
                "gets, SSTs warm, batches of 1,000",
                len(sample),
                lambda: engine.get_batches(sample, 1000),
            )
            assert found == len(sample), (engine_name, found)
        rows = measure("full scan", total, engine.scan_all, "rows/s")
        assert rows == total, (engine_name, rows)
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
        assert rows == total, (engine_name, rows)
        results["full scan, fresh reader"] = {
            "rate": rows / seconds,
            "unit": "rows/s",
            "seconds": seconds,
            "requests_per_1000": {},
        }
        if scanned:
            results["full scan, fresh reader"]["mb_per_s"] = scanned / 2**20 / seconds
        if proxy and lag_writes:
            lags = measure(
                "reader lag", lag_writes, lambda: engine.reader_lag(lag_writes), "writes/s"
            )
            lag = results["reader lag"]
            # It may stop early: scale to the writes made (rate, requests per 1,000).
            lag["rate"] *= len(lags) / lag_writes
            for counts in ("requests_per_1000", "proxy_requests_per_1000"):
                lag[counts] = {k: v * lag_writes / len(lags) for k, v in lag[counts].items()}
            seen = [x for x in lags if not math.isnan(x)]
            lag.update(
                p50_ms=median_ms(seen) if seen else float("nan"),
                p99_ms=p99_ms(seen) if seen else float("nan"),
                seen=f"{len(seen)}/{len(lags)}",
            )
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
    """One row per workload: slatepy, then every other engine run and slatepy's ratio to it."""
    others = list(dict.fromkeys(e for d in run["stores"].values() for e in d["engines"]))
    others = [e for e in others if e != "slatepy"] or ["slatedb"]
    head = "".join(f" {e} | {'ratio' if len(others) == 1 else f'slatepy / {e}'} |" for e in others)
    repeats = run.get("repeat", 1)
    lines = [
        f"Run `{run['command']}` on {run['machine']}, {run['date']}."
        + (
            f" Each time is the median of {repeats} runs (engines interleaved), [the lowest"
            " and highest]; each ratio the ratio of medians, then (per run) the ratio of"
            " each run's rates, in run order."
            if repeats > 1
            else ""
        ),
        "",
        f"| store | workload | slatepy |{head} slatepy requests and bytes / 1,000 ops |",
        "|---|---|---|" + "---|---|" * len(others) + "---|",
    ]
    for store, data in run["stores"].items():
        ours = data["engines"].get("slatepy", {})
        for workload, mine in ours.items():
            rate = f"{mine['rate']:,.0f} {mine['unit']}"
            if "p50_ms" in mine:
                rate += f" (p50 {mine['p50_ms']:.2f} ms, p99 {mine['p99_ms']:.2f} ms)"
            if "state" in mine:
                rate += f" ({mine['state']})"
            if len(mine.get("rates", ())) > 1:
                rate += f" [{min(mine['rates']):,.0f}-{max(mine['rates']):,.0f}]"
            if "mb_per_s" in mine:
                share = mine["mb_per_s"] / data["floor"].get("get_mb_per_s", float("nan"))
                rate += f" ({mine['mb_per_s']:,.1f} MB/s, {share:.0%} of one large GET)"
            cells = ""
            for engine in others:
                other = data["engines"].get(engine, {}).get(workload)
                # Reader lag is compared by its p50 (proxy table), not by its pace of writes.
                ratio = (
                    f"{mine['rate'] / other['rate']:.2f}x" if other and "seen" not in mine else "-"
                )
                their = (
                    "-"
                    if not other
                    else f"{other['rate']:,.0f} {other['unit']}"
                    + (f" (p50 {other['p50_ms']:.2f} ms)" if "p50_ms" in other else "")
                )
                mine_rates, their_rates = mine.get("rates", []), (other or {}).get("rates", [])
                if ratio != "-" and len(mine_rates) > 1 and len(mine_rates) == len(their_rates):
                    ratio += (
                        " ("
                        + ", ".join(
                            f"{a / b:.2f}" for a, b in zip(mine_rates, their_rates, strict=True)
                        )
                        + ")"
                    )
                if other and len(other.get("rates", ())) > 1:
                    their += f" [{min(other['rates']):,.0f}-{max(other['rates']):,.0f}]"
                cells += f" {their} | {ratio} |"
            counted = mine.get("reader_requests_per_1000") or mine["requests_per_1000"]
            reqs = ", ".join(f"{k} {v:g}" for k, v in sorted(counted.items()))
            lines.append(f"| {store} | {workload} | {rate} |{cells} {reqs or '-'} |")
        floor = data["floor"]
        lines.append(
            f"| {store} | raw conditional PUT / GET; one 32 MB GET | {floor['put_ms']:.3f} ms / "
            f"{floor['get_ms']:.3f} ms; {floor.get('get_mb_per_s', 0):,.1f} MB/s |"
            + " |"
            * (2 * len(others) + 1)
        )
    return "\n".join(lines) + "\n"


def median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's results over repeated runs: each workload's run of median rate (an
    odd count; the lower middle otherwise), with every run's rate under ``rates``."""
    merged: dict[str, Any] = {}
    for workload in runs[0]:
        results = sorted((r[workload] for r in runs if workload in r), key=lambda r: r["rate"])
        middle = dict(results[(len(results) - 1) // 2])
        middle["rates"] = [r[workload]["rate"] for r in runs if workload in r]
        merged[workload] = middle
    return merged


def _kinds(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items())) or "0"


def _timing(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    if "p50_ms" in result:
        text = f"p50 {result['p50_ms']:,.1f} ms, p99 {result['p99_ms']:,.1f} ms"
        return text + (f" ({result['seen']} seen)" if "seen" in result else "")
    return f"{result['rate']:,.0f} {result['unit']}"


def proxy_markdown(run: dict[str, Any]) -> str:
    """Per store behind a proxy: each workload's speed and the requests the proxy saw per
    1,000 operations, by kind, for both engines."""
    lines = []
    for store, data in run["stores"].items():
        ours, theirs = data["engines"].get("slatepy", {}), data["engines"].get("slatedb", {})
        if not any("proxy_requests_per_1000" in r for r in ours.values()):
            continue
        lines += [
            "",
            f"{store} through the latency proxy: requests it saw per 1,000 operations "
            "(per 1,000 writes for reader lag, the reader's polling included).",
            "",
            "| workload | slatepy | slatedb | slatepy requests / 1,000 | "
            "slatedb requests / 1,000 |",
            "|---|---|---|---|---|",
        ]
        for workload in dict.fromkeys([*ours, *theirs]):
            mine, other = ours.get(workload), theirs.get(workload)
            if "proxy_requests_per_1000" not in (mine or other or {}):
                continue
            reqs = [
                _kinds(r["proxy_requests_per_1000"])
                if r and "proxy_requests_per_1000" in r
                else "-"
                for r in (mine, other)
            ]
            lines.append(
                f"| {workload} | {_timing(mine)} | {_timing(other)} | {reqs[0]} | {reqs[1]} |"
            )
    return "\n".join(lines) + "\n" if lines else ""


def latency_chart(run: dict[str, Any], path: Path) -> bool:
    """Durable put and reader lag p50/p99, and requests per 1,000 operations, both engines."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    store = next(
        (
            s
            for s, d in run["stores"].items()
            if any("proxy_requests_per_1000" in r for r in d["engines"].get("slatepy", {}).values())
        ),
        None,
    )
    if store is None:
        return False
    engines = run["stores"][store]["engines"]
    timed = ["durable puts", "durable puts, 8 writers", "durable puts, 64 writers", "reader lag"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    width = 0.2
    for i, (engine, results) in enumerate(engines.items()):
        for j, pct in enumerate(("p50_ms", "p99_ms")):
            xs = [t + (2 * i + j - 1.5) * width for t in range(len(timed))]
            ys = [results.get(w, {}).get(pct, 0) for w in timed]
            left.bar(xs, ys, width, label=f"{engine} {pct[:3]}")
    left.set_xticks(range(len(timed)), ["1 writer", "8 writers", "64 writers", "reader lag"])
    left.set_ylabel("ms (log)")
    left.set_yscale("log")
    left.set_title(f"{store}: durable put latency and reader lag (lower is better)")
    left.legend()
    workloads = [w for w, r in engines.get("slatepy", {}).items() if "proxy_requests_per_1000" in r]
    for i, (engine, results) in enumerate(engines.items()):
        totals = [
            sum(results[w]["proxy_requests_per_1000"].values()) if w in results else 0
            for w in workloads
        ]
        right.barh([y + (i - 0.5) * 0.4 for y in range(len(workloads))], totals, 0.4, label=engine)
    right.set_yticks(range(len(workloads)), workloads)
    right.set_xscale("symlog")
    right.set_xlabel("requests per 1,000 operations, all kinds (counted at the proxy)")
    right.set_title(f"{store}: store requests (lower is cheaper)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


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
    parser.add_argument(
        "--stores", nargs="+", help="default memory file s3; only s3 with --latency-ms"
    )
    parser.add_argument("--engines", nargs="+", default=["slatepy", "slatedb"])
    parser.add_argument("--name", default="latest")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every engine this many times (interleaved) and report each workload's median",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="per-request delay added to s3 by a proxy on the wire (bench/proxy.py)",
    )
    parser.add_argument(
        "--jitter-ms",
        type=float,
        default=None,
        help="± per-request jitter with --latency-ms (default a third of it: 10 at 30)",
    )
    parser.add_argument(
        "--lag-writes",
        type=int,
        default=20,
        help="with --latency-ms: writes whose reader lag is measured (0: skip)",
    )
    parser.add_argument(
        "--workload",
        choices=["all", "reopen"],
        default="all",
        help="reopen: only write, close, reopen, then random gets and a full scan (issue 33)",
    )
    parser.add_argument(
        "--disk-cache",
        choices=["auto", "on", "off"],
        default="auto",
        help="slatepy's local disk cache for s3 (auto = on; in a fresh directory per run)",
    )
    args = parser.parse_args()
    if args.stores is None:
        args.stores = ["s3"] if args.latency_ms else ["memory", "file", "s3"]
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
                *([f"--jitter-ms {args.jitter_ms:g}"] if args.jitter_ms is not None else []),
                *([f"--lag-writes {args.lag_writes}"] if args.lag_writes != 20 else []),
                *([f"--disk-cache {args.disk_cache}"] if args.disk_cache != "auto" else []),
                *([f"--repeat {args.repeat}"] if args.repeat != 1 else []),
                *([f"--workload {args.workload}"] if args.workload != "all" else []),
            ]
        ),
        "machine": f"{platform.machine()}, {platform.python_version()}, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
        "stores": {},
        "repeat": args.repeat,
    }
    for store_name in args.stores:
        with store_location(store_name, args.latency_ms, args.disk_cache, args.jitter_ms) as fresh:
            url, settings = fresh("floor")
            data: dict[str, Any] = {
                "floor": floor_ms(open_store(url, settings, create=True)),
                "engines": {},
            }
            # RocksDB needs a local directory: rocksdict runs on the file store only.
            engines = [e for e in args.engines if e != "rocksdict" or store_name == "file"]
            runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
            for repeat in range(args.repeat):
                for engine_name in engines:
                    url, settings = fresh(engine_name)
                    print(f"{store_name} / {engine_name} ({repeat + 1}) ...", flush=True)
                    runs[engine_name].append(
                        run_reopen(
                            engine_name,
                            url,
                            settings,
                            args.keys,
                            key=key,
                            requests=requests,
                            per_1000=per_1000,
                            proxy=fresh.proxy,
                        )
                        if args.workload == "reopen"
                        else run_engine(
                            engine_name,
                            url,
                            settings,
                            args.keys,
                            proxy=fresh.proxy,
                            lag_writes=args.lag_writes,
                        )
                    )
            for engine_name, results in runs.items():
                data["engines"][engine_name] = (
                    results[0] if args.repeat == 1 else median_runs(results)
                )
            run["stores"][store_name] = data
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(run, indent=1))
    table = markdown(run) + proxy_markdown(run)
    (RESULTS / f"{args.name}.md").write_text(table)
    charted = chart(run, RESULTS / f"{args.name}.png")
    if latency_chart(run, RESULTS / f"{args.name}-latency.png"):
        print(f"wrote bench/results/{args.name}-latency.png")
    print(table)
    print(f"wrote bench/results/{args.name}.json, .md" + (", .png" if charted else ""))


if __name__ == "__main__":
    main()
