"""Object-store requests per hour, and their monthly price on S3, for steady workloads.

    python -m bench.cost                                  # 5 workloads x 2 engines, 30 s each
    python -m bench.cost --window 60 --workloads idle-writer durable-100
    python -m bench.cost --url file:///tmp/scratch --workloads idle-writer   # slatepy only

Workloads (100-byte values, both engines with default settings: slatepy's in-process
compactor on, SlateDB's builder defaults):

* ``idle-reader``: a reader open on a database of 1,000 keys, doing nothing.
* ``idle-writer``: a writer open (after one durable put), doing nothing.
* ``puts-1000``: 1,000 puts a second, durability not awaited.
* ``durable-100``: 100 durable puts a second, each from its own thread (slatepy) or task
  (SlateDB), so a slow store does not slow the schedule down.
* ``reader-polling``: a writer doing ``puts-1000`` while a reader in the same process reads
  the latest key every 100 ms.

Each workload is set up first (database seeded, engines open), then measured for
``--window`` seconds; the requests of that window are scaled to one hour (x 3600 / the
window's actual length), so short windows of periodic work (a compaction every few minutes,
garbage collection every hour) are caught or missed by chance: lengthen ``--window`` for
those. Closing is outside the window.

By default the store is S3 over HTTP: a moto server in its own process behind
:class:`bench.proxy.LatencyProxy` (``--latency-ms``, default 30 ± 10 ms, as real S3), which
counts every request of either engine by kind. slatepy's own store metrics are shown beside
it as a check. With ``--url`` the workloads run on that location (it must be a scratch one:
they write to it) with slatepy alone, its settings from ``SLATEPY_*`` variables (defaults
otherwise), counted by its store metrics.

Writes ``bench/results/<name>.json``, ``.md`` and, with matplotlib, ``.png`` (``--name``,
default ``cost``).

Prices: S3 Standard, us-east-1, as published by AWS: PUT, COPY, POST and LIST $0.005 per
1,000 requests; GET, HEAD and other requests $0.0004 per 1,000; DELETE free. A month is 730
hours. Storage ($0.023 per GB-month) and data transfer are not included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.__main__ import RESULTS, VALUE, key, store_location
from bench.proxy import LatencyProxy
from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.store import StoreMetrics

WORKLOADS = ["idle-reader", "idle-writer", "puts-1000", "durable-100", "reader-polling"]
KINDS = ["GET", "PUT", "POST", "LIST", "HEAD", "DELETE"]
# US dollars per 1,000 requests, S3 Standard in us-east-1.
PRICE_PER_1000 = {
    "PUT": 0.005,
    "POST": 0.005,
    "LIST": 0.005,
    "GET": 0.0004,
    "HEAD": 0.0004,
    "DELETE": 0.0,
}
HOURS_PER_MONTH = 730
# slatepy's metric kinds by S3 billing kind (a COPY is billed as a PUT).
METRIC_KINDS = {
    "get": "GET",
    "get_range": "GET",
    "head": "HEAD",
    "put": "PUT",
    "copy": "PUT",
    "list": "LIST",
    "delete": "DELETE",
}
SEED_KEYS = 1000


def monthly_usd(per_hour: dict[str, float]) -> float:
    """The monthly request bill for ``per_hour`` requests by kind."""
    return sum(PRICE_PER_1000.get(k, 0.0004) * n / 1000 for k, n in per_hour.items()) * (
        HOURS_PER_MONTH
    )


def metric_counts(metrics: list[StoreMetrics]) -> dict[str, int]:
    """slatepy's store requests so far by billing kind, summed over ``metrics``."""
    counts: dict[str, int] = {}
    for m in metrics:
        for kind, stats in m.snapshot().items():
            if kind in METRIC_KINDS:
                billed = METRIC_KINDS[kind]
                counts[billed] = counts.get(billed, 0) + stats.requests
    return counts


class Meter:
    """Counts the requests of one window: at the proxy and in slatepy's store metrics."""

    def __init__(self, proxy: LatencyProxy | None) -> None:
        self.proxy = proxy
        self.metrics: list[StoreMetrics] = []
        self.ops = 0
        self.result: dict[str, Any] = {}

    def start(self, *metrics: StoreMetrics) -> None:
        self.metrics = list(metrics)
        self._proxy0 = self.proxy.counts() if self.proxy else {}
        self._metrics0 = metric_counts(self.metrics)
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self._t0
        per_hour = 3600 / seconds
        result: dict[str, Any] = {"seconds": round(seconds, 2), "ops_per_s": self.ops / seconds}
        if self.proxy:
            after = self.proxy.counts()
            result["proxy_per_hour"] = _scaled(self._proxy0, after, per_hour)
        if self.metrics:
            result["metrics_per_hour"] = _scaled(
                self._metrics0, metric_counts(self.metrics), per_hour
            )
        return result


def _scaled(before: dict[str, int], after: dict[str, int], factor: float) -> dict[str, float]:
    return {
        k: (after[k] - before.get(k, 0)) * factor for k in after if after[k] != before.get(k, 0)
    }


def paced(rate: float, seconds: float, op: Callable[[int], None]) -> int:
    """Call ``op(i)`` ``rate`` times a second for ``seconds``; how many calls were made."""
    start = time.perf_counter()
    i = 0
    while (now := time.perf_counter() - start) < seconds:
        due = int(now * rate) + 1
        while i < due:
            op(i)
            i += 1
        time.sleep(max(0.0, i / rate - (time.perf_counter() - start)))
    return i


# slatepy ------------------------------------------------------------------------------------


def seed_slatepy(url: str, settings: Settings) -> None:
    with Db.open(url, settings=settings) as db:
        batch = WriteBatch()
        for i in range(SEED_KEYS):
            batch.put(key(i), VALUE)
        db.write(batch)


def run_slatepy(workload: str, url: str, settings: Settings, window: float, meter: Meter) -> None:
    """One workload on slatepy, opened by URL (each Db and reader with its own metrics)."""
    if workload == "idle-reader":
        with DbReader.open(url, settings=settings) as reader:
            reader.get(key(0))
            meter.start(reader.metrics)
            time.sleep(window)
            meter.result = meter.stop()
        return
    with Db.open(url, settings=settings) as db:
        db.put(b"opened", VALUE)
        if workload == "idle-writer":
            meter.start(db.metrics)
            time.sleep(window)
        elif workload == "puts-1000":
            meter.start(db.metrics)
            meter.ops = paced(1000, window, lambda i: db.put(key(i), VALUE, await_durable=False))
        elif workload == "durable-100":
            futures: list[Future[None]] = []
            with ThreadPoolExecutor(max_workers=64) as pool:
                meter.start(db.metrics)
                meter.ops = paced(
                    100, window, lambda i: futures.append(pool.submit(db.put, key(i), VALUE))
                )
            for future in futures:
                future.result()  # a failed put fails the run
        elif workload == "reader-polling":
            with DbReader.open(url, settings=settings) as reader:
                stop = threading.Event()

                def poll() -> None:
                    while not stop.wait(0.1):
                        reader.get(key(SEED_KEYS - 1))

                poller = threading.Thread(target=poll, daemon=True)
                meter.start(db.metrics, reader.metrics)
                poller.start()
                meter.ops = paced(
                    1000, window, lambda i: db.put(key(i), VALUE, await_durable=False)
                )
                stop.set()
                poller.join(10)
                meter.result = meter.stop()
            return
        else:
            raise SystemExit(f"unknown workload {workload!r} ({', '.join(WORKLOADS)})")
        meter.result = meter.stop()


# SlateDB ------------------------------------------------------------------------------------


def run_slatedb(workload: str, url: str, window: float, meter: Meter) -> None:
    """One workload on SlateDB's Python package (same calls as :mod:`bench.engines`)."""
    from slatedb.uniffi import DbBuilder, DbReaderBuilder, ObjectStore
    from slatedb.uniffi import WriteBatch as SdbBatch

    parts = urlsplit(url)
    path = parts.path.strip("/") or "db"
    store = ObjectStore.resolve(f"{parts.scheme}://{parts.netloc}/")

    async def seed() -> None:
        db = await DbBuilder(path, store).build()
        batch = SdbBatch()
        for i in range(SEED_KEYS):
            batch.put(key(i), VALUE)
        handle = await db.write(batch)
        await handle.await_durable()
        await db.shutdown()

    async def apaced(rate: float, op: Callable[[int], Any]) -> int:
        start = time.perf_counter()
        i = 0
        while (now := time.perf_counter() - start) < window:
            due = int(now * rate) + 1
            while i < due:
                await op(i)
                i += 1
            await asyncio.sleep(max(0.0, i / rate - (time.perf_counter() - start)))
        return i

    async def go() -> None:
        await seed()
        if workload == "idle-reader":
            reader = await DbReaderBuilder(path, store).build()
            await reader.get(key(0))
            meter.start()
            await asyncio.sleep(window)
            meter.result = meter.stop()
            await reader.shutdown()
            return
        db = await DbBuilder(path, store).build()
        await (await db.put(b"opened", VALUE)).await_durable()

        async def put(i: int) -> None:
            await db.put(key(i), VALUE)

        if workload == "idle-writer":
            meter.start()
            await asyncio.sleep(window)
        elif workload == "puts-1000":
            meter.start()
            meter.ops = await apaced(1000, put)
        elif workload == "durable-100":
            tasks: list[asyncio.Task[None]] = []

            async def durable(i: int) -> None:
                await (await db.put(key(i), VALUE)).await_durable()

            async def spawn(i: int) -> None:
                tasks.append(asyncio.create_task(durable(i)))

            meter.start()
            meter.ops = await apaced(100, spawn)
            await asyncio.gather(*tasks)
        elif workload == "reader-polling":
            reader = await DbReaderBuilder(path, store).build()

            async def poll() -> None:
                while True:
                    await asyncio.sleep(0.1)
                    await reader.get(key(SEED_KEYS - 1))

            meter.start()
            poller = asyncio.create_task(poll())
            meter.ops = await apaced(1000, put)
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
            meter.result = meter.stop()
            await reader.shutdown()
            await db.shutdown()
            return
        else:
            raise SystemExit(f"unknown workload {workload!r} ({', '.join(WORKLOADS)})")
        meter.result = meter.stop()
        await db.shutdown()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(go())
    finally:
        loop.close()


# Running and reporting ----------------------------------------------------------------------


@contextmanager
def s3_locations(latency_ms: float, jitter_ms: float | None) -> Iterator[Any]:
    """Fresh S3 locations behind a counting proxy (moto in its own process)."""
    with store_location("s3", latency_ms, "auto", jitter_ms, count=True) as fresh:
        assert fresh.proxy is not None
        yield fresh


def measure(
    engine: str,
    workload: str,
    url: str,
    settings: Settings,
    window: float,
    *,
    proxy: LatencyProxy | None,
) -> dict[str, Any]:
    """Seed a database at ``url``, run ``workload`` on ``engine`` for ``window`` seconds:
    the window's requests per hour by kind and their monthly price."""
    meter = Meter(proxy)
    if engine == "slatepy":
        seed_slatepy(url, settings)
        run_slatepy(workload, url, settings, window, meter)
    else:
        run_slatedb(workload, url, window, meter)
    result: dict[str, Any] = meter.result
    counted = result.get("proxy_per_hour") or result.get("metrics_per_hour", {})
    result["usd_per_month"] = monthly_usd(counted)
    return result


def _per_hour(counts: dict[str, float] | None) -> list[str]:
    if counts is None:
        return ["-"] * len(KINDS)
    return [f"{counts.get(k, 0):,.0f}" for k in KINDS]


def markdown(run: dict[str, Any]) -> str:
    lines = [
        f"Run `{run['command']}` on {run['machine']}, {run['date']}: each workload measured "
        f"for {run['window']:g} s and scaled to one hour. Requests counted "
        + (
            "at the latency proxy (every request of either engine); slatepy's own store "
            "metrics in the last column as a check."
            if run["proxy"]
            else "by slatepy's store metrics."
        ),
        "Prices: S3 Standard us-east-1, PUT/COPY/POST/LIST $0.005 per 1,000, GET/HEAD "
        "$0.0004 per 1,000, DELETE free; 730 h a month; storage and transfer not included.",
        "",
        "| workload | engine | ops/s | " + " | ".join(f"{k}/h" for k in KINDS) + " | $/month "
        "| slatepy metrics, requests/h |",
        "|---|---|---|" + "---|" * len(KINDS) + "---|---|",
    ]
    for row in run["rows"]:
        counted = row.get("proxy_per_hour") or row.get("metrics_per_hour")
        check = row.get("metrics_per_hour") if row.get("proxy_per_hour") else None
        check_text = (
            ", ".join(f"{k} {v:,.0f}" for k, v in sorted(check.items())) or "0"
            if check is not None
            else "-"
        )
        lines.append(
            f"| {row['workload']} | {row['engine']} | {row['ops_per_s']:,.0f} | "
            + " | ".join(_per_hour(counted))
            + f" | ${row['usd_per_month']:,.2f} | {check_text} |"
        )
    return "\n".join(lines) + "\n"


def chart(run: dict[str, Any], path: Path) -> bool:
    """Monthly request price per workload, one bar per engine, split by request kind."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = run["rows"]
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, ax = plt.subplots(figsize=(11, 1 + 0.9 * len(workloads)))
    height = 0.8 / len(engines)
    colors = dict(zip(KINDS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    labelled: set[str] = set()
    for row in rows:
        y = workloads.index(row["workload"]) + (engines.index(row["engine"]) - 0.5) * height
        counted = row.get("proxy_per_hour") or row.get("metrics_per_hour") or {}
        left = 0.0
        for kind in KINDS:
            usd = PRICE_PER_1000[kind] * counted.get(kind, 0) / 1000 * HOURS_PER_MONTH
            if usd:
                label = kind if kind not in labelled else None
                labelled.add(kind)
                ax.barh(y, usd, height, left=left, color=colors[kind], label=label)
                left += usd
        ax.text(left, y, f" {row['engine']} ${left:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(workloads)), workloads)
    ax.invert_yaxis()
    ax.set_xlabel("US$ a month in requests (S3 Standard us-east-1; storage not included)")
    ax.set_title(f"Request cost, {run['window']:g} s per workload scaled to a month")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.15)  # room for the labels
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main() -> None:
    import platform

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--engines", nargs="+", default=["slatepy", "slatedb"])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured each")
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--jitter-ms", type=float, default=None, help="default latency / 3")
    parser.add_argument("--url", help="run slatepy alone on this scratch location")
    parser.add_argument("--name", default="cost", help="bench/results/<name>.json and .md")
    args = parser.parse_args()
    window = args.window
    command = f"python -m bench.cost --window {window:g} --workloads {' '.join(args.workloads)}"
    if args.url:
        command += f" --url {args.url}"
    else:
        command += f" --engines {' '.join(args.engines)} --latency-ms {args.latency_ms:g}"
    run: dict[str, Any] = {
        "command": command,
        "machine": f"{platform.machine()}, {platform.python_version()}, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
        "window": window,
        "proxy": not args.url,
        "prices_per_1000_usd": PRICE_PER_1000,
        "rows": [],
    }
    if args.url:
        settings = Settings.from_env()
        for workload in args.workloads:
            print(f"{workload} / slatepy ...", flush=True)
            row = measure("slatepy", workload, args.url, settings, window, proxy=None)
            run["rows"].append({"workload": workload, "engine": "slatepy", **row})
    else:
        with s3_locations(args.latency_ms, args.jitter_ms) as fresh:
            for workload in args.workloads:
                for engine in args.engines:
                    print(f"{workload} / {engine} ...", flush=True)
                    url, settings = fresh(engine)
                    row = measure(engine, workload, url, settings, window, proxy=fresh.proxy)
                    run["rows"].append({"workload": workload, "engine": engine, **row})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(run, indent=1))
    table = markdown(run)
    (RESULTS / f"{args.name}.md").write_text(table)
    charted = chart(run, RESULTS / f"{args.name}.png")
    print(table)
    print(f"wrote bench/results/{args.name}.json, .md" + (", .png" if charted else ""))


if __name__ == "__main__":
    main()
