"""What persist shards cost, beside the raw location they run on (issue 13's benchmarks).

    python -m bench.persist [--stores memory file s3 postgresql] [--name persist] [--quick]

For each location (``postgresql`` = the file store for blobs, a throwaway PostgreSQL server
started from the machine's binaries for consensus):

* **small**: sequential ``compare_and_append`` of one update (an inline part), p50/p95 ms and
  store requests per call, beside one raw ``Consensus.compare_and_set`` of a 300-byte entry
  (p50) in the same run; the target is at most 1.5x the raw CAS.
* **large**: one ``compare_and_append`` of a 64 MiB batch (1 KiB values; also 100-byte
  values, reported) in MB/s, beside one raw ``put`` of 64 MiB of random bytes to the same
  store; the target is at least 70%. On ``memory`` the raw put is a dictionary insert, so
  its ratio means nothing.

On ``memory`` only (bytes do not depend on the store):

* **state bytes**: bytes written per state change (consensus entries plus rollups) over 100
  appends with 10 and with 10,000 batches in the trace (merges are not run); target within 2x.
* **snapshot**: ``snapshot`` of 1,000,000 updates in 10 batches, a fifth of batches 2-10
  retracting updates of the batch before, in rows/s.
* **listen lag**: a writer in another process appends one update every 20 ms for 4 s; the
  time from the start of each append to its delivery by ``listen`` here, p50/p95 ms.

Writes ``bench/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import location
from slatepy.persist import PersistClient, Progress, Updates
from slatepy.persist.config import PersistSettings
from slatepy.persist.location.consensus import Committed, Consensus
from slatepy.store import MetricsStore

RESULTS = Path(__file__).parent / "results"
MIB = 1024 * 1024


@contextmanager
def persist_location(name: str) -> Iterator[tuple[str, Any, str | None]]:
    """``(blob url, store settings, consensus url)`` of an empty persist location."""
    if name == "postgresql":
        from slatepy.testing.postgres import missing_reason, postgres_server

        reason = missing_reason()
        if reason:
            raise SystemExit(f"postgresql: {reason}")
        with postgres_server() as server, location("file") as (url, settings):
            Path(url.removeprefix("file://")).mkdir()
            yield url, settings, server.url()
        return
    with location(name) as (url, settings):
        if url.startswith("file://"):
            Path(url.removeprefix("file://")).mkdir()
        yield url, settings, None


def _p(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(len(samples) * q))] * 1e3


def _requests(blob: MetricsStore) -> int:
    return sum(op.requests for op in blob.metrics.snapshot().values())


def raw_cas_ms(consensus: Consensus, samples: int) -> float:
    """p50 of a raw compare-and-set of a 300-byte entry on a fresh key."""
    times = []
    expected = None
    for i in range(samples):
        t = time.perf_counter()
        result = consensus.compare_and_set("bench-raw", expected, b"%08d" % i * 37)
        times.append(time.perf_counter() - t)
        assert isinstance(result, Committed)
        expected = i + 1
    return statistics.median(times) * 1e3


def small(client: PersistClient, samples: int) -> dict[str, Any]:
    write = client.open_writer("small")
    write.compare_and_append([], expected_upper=0, new_upper=1)  # registers the writer
    blob = client.blob
    assert isinstance(blob, MetricsStore)
    before = _requests(blob)
    times = []
    for t in range(1, samples + 1):
        start = time.perf_counter()
        write.compare_and_append([((b"key%d" % t, b"v" * 16), t, 1)], t, t + 1)
        times.append(time.perf_counter() - start)
    requests = (_requests(blob) - before) / samples
    raw = raw_cas_ms(client.consensus, samples)
    p50 = statistics.median(times) * 1e3
    return {
        "p50_ms": p50,
        "p95_ms": _p(times, 0.95),
        "raw_cas_p50_ms": raw,
        "ratio": p50 / raw,
        "store_requests_per_call": requests,
    }


def large(client: PersistClient, mib: int, value_bytes: int = 1000) -> dict[str, Any]:
    """One ``compare_and_append`` of ``mib`` MiB of updates (``value_bytes`` values, 15-byte
    keys), beside one raw put of ``mib`` MiB of random bytes. The raw payload is real,
    touched memory: ``bytes(n)`` would be untouched zero pages, which the kernel serves
    without faults, and measures a put about 40% faster than of any real data here."""
    count = mib * MIB // (value_bytes + 24)
    updates = [((b"key%012d" % i, os.urandom(value_bytes)), 0, 1) for i in range(count)]
    shard = f"large-{value_bytes}"
    write = client.open_writer(shard)
    os.sync()  # both puts start with no dirty pages waiting (file store: the kernel's writeback)
    start = time.perf_counter()
    write.compare_and_append(updates, expected_upper=0, new_upper=1)
    elapsed = time.perf_counter() - start
    del updates
    parts = client.machine(shard).fetch().trace[0].runs[0]
    payload = os.urandom(mib * MIB)
    os.sync()
    start = time.perf_counter()
    client.blob.put(f"bench-raw-put-{value_bytes}", payload)
    raw = time.perf_counter() - start
    return {
        "value_bytes": value_bytes,
        "updates": count,
        "parts": len(parts),
        "mb_per_s": mib / elapsed,
        "raw_put_mb_per_s": mib / raw,
        "ratio": raw / elapsed,
    }


def state_bytes(trace: int, appends: int = 100) -> dict[str, Any]:
    """Bytes written per state change with ``trace`` batches in the trace (no merges run)."""
    settings = PersistSettings(max_trace_batches=trace + appends + 10, compaction="off")
    with PersistClient.open("memory://", settings=settings) as client:
        write = client.open_writer("bytes")
        for t in range(trace):
            write.compare_and_append([((b"k%d" % t, b"v"), t, 1)], t, t + 1)
        blob = client.blob
        assert isinstance(blob, MetricsStore)
        put = blob.metrics.snapshot().get("put")
        before = put.bytes_out if put else 0
        for t in range(trace, trace + appends):
            write.compare_and_append([((b"k%d" % t, b"v"), t, 1)], t, t + 1)
        after = blob.metrics.snapshot()["put"].bytes_out
        return {
            "trace_batches": len(client.machine("bytes").fetch().trace),
            "bytes_per_change": (after - before) / appends,
        }


def snapshot(updates: int = 1_000_000, batches: int = 10) -> dict[str, Any]:
    per = updates // batches
    with PersistClient.open("memory://") as client:
        write = client.open_writer("snap")
        for b in range(batches):
            batch = [((b"key%09d" % (b * per + i), b"v" * 20), b, 1) for i in range(per)]
            if b:  # a fifth of this batch retracts updates of the one before
                retract = per // 5
                batch[:retract] = [
                    ((b"key%09d" % ((b - 1) * per + i), b"v" * 20), b, -1) for i in range(retract)
                ]
            write.compare_and_append(batch, expected_upper=b, new_upper=b + 1)
        read = client.open_leased_reader("snap")
        start = time.perf_counter()
        rows = read.snapshot(batches - 1)
        elapsed = time.perf_counter() - start
        return {"updates": updates, "rows": len(rows), "rows_per_s": updates / elapsed}


def _writer(url: str, seconds: float) -> None:
    with PersistClient.open(url) as client:
        write = client.open_writer("lag")
        t = 1
        end = time.time() + seconds
        while time.time() < end:
            sent = b"%.6f" % time.time()
            write.compare_and_append([((b"tick", sent), t, 1)], t, t + 1)
            t += 1
            time.sleep(0.02)
        write.compare_and_append([], t, None)


def listen_lag(seconds: float = 4.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}"
        with PersistClient.open(url) as client:
            client.open_writer("lag").compare_and_append([], expected_upper=0, new_upper=1)
        child = multiprocessing.get_context("spawn").Process(target=_writer, args=(url, seconds))
        lags: list[float] = []
        with PersistClient.open(url) as client:
            listen = client.open_leased_reader("lag").listen(0)
            child.start()
            done = False
            deadline = time.time() + seconds + 30
            while not done and time.time() < deadline:
                for event in listen.fetch_next(timeout=1.0):
                    now = time.time()
                    if isinstance(event, Updates):
                        lags += [now - float(v) for (_, v), _, _ in event.updates]
                    elif isinstance(event, Progress) and event.upper is None:
                        done = True
            child.join(30)
        return {"deliveries": len(lags), "p50_ms": _p(lags, 0.5), "p95_ms": _p(lags, 0.95)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stores", nargs="+", default=["memory", "file", "s3", "postgresql"])
    parser.add_argument("--name", default="persist")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = parser.parse_args()
    samples, mib, big_trace, snap = (
        (50, 8, 500, 100_000) if args.quick else (300, 64, 10_000, 1_000_000)
    )
    results: dict[str, Any] = {"stores": {}}
    for name in args.stores:
        with (
            persist_location(name) as (url, settings, consensus),
            PersistClient.open(url, consensus=consensus, settings=settings) as client,
        ):
            results["stores"][name] = {
                "small": small(client, samples),
                "large": large(client, mib),
                "large_100": large(client, mib, value_bytes=100),
            }
        print(name, json.dumps(results["stores"][name]), flush=True)
    results["state_bytes"] = [state_bytes(10), state_bytes(big_trace)]
    results["snapshot"] = snapshot(snap)
    results["listen_lag"] = listen_lag()
    print(json.dumps(results, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=2))
    (RESULTS / f"{args.name}.md").write_text(render(results, args))


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    quick = " --quick" if args.quick else ""
    lines = [
        f"Run `python -m bench.persist --stores {' '.join(args.stores)} --name {args.name}"
        f"{quick}`.",
        "",
        "| store | small caa p50 ms | p95 ms | raw CAS p50 ms | ratio (target <= 1.5) "
        "| store requests / call | large batch MB/s | raw PUT MB/s | ratio (target >= 0.7) "
        "| 100 B values MB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["stores"].items():
        s, g, h = r["small"], r["large"], r["large_100"]
        ratio = "n/a" if name == "memory" else f"{g['ratio']:.2f}"
        lines.append(
            f"| {name} | {s['p50_ms']:.2f} | {s['p95_ms']:.2f} | {s['raw_cas_p50_ms']:.3f} "
            f"| {s['ratio']:.2f} | {s['store_requests_per_call']:.2f} | {g['mb_per_s']:.0f} "
            f"| {g['raw_put_mb_per_s']:.0f} | {ratio} | {h['mb_per_s']:.0f} |"
        )
    few, many = results["state_bytes"]
    snap, lag = results["snapshot"], results["listen_lag"]
    lines += [
        "",
        f"Bytes written per state change: {few['bytes_per_change']:.0f} with "
        f"{few['trace_batches']} batches in the trace, {many['bytes_per_change']:.0f} with "
        f"{many['trace_batches']} ({many['bytes_per_change'] / few['bytes_per_change']:.2f}x; "
        "target within 2x).",
        f"Snapshot of {snap['updates']:,} updates ({snap['rows']:,} rows after consolidation): "
        f"{snap['rows_per_s']:,.0f} updates/s.",
        f"Listen lag, a writer in another process (file store): p50 {lag['p50_ms']:.1f} ms, "
        f"p95 {lag['p95_ms']:.1f} ms over {lag['deliveries']} deliveries.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
