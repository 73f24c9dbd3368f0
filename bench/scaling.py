"""How reads, memory and close behave as the database grows (issue 18's table).

    python -m bench.scaling --keys 100000 1000000 4000000 [--store file] [--name scaling]

For each N, in a fresh process (so peak RSS is per size): write N keys (16-byte keys,
100-byte values) in awaited batches of 1,000 with default settings (in-process compactor on),
close, compact until idle, read the files once (see :func:`warm_page_cache`), reopen, then
20,000 random gets, the same keys as ``get_many`` in batches of 1,000, and a full scan.
Reports writes rows/s, the time ``close()`` took, random gets/s, batched gets/s, scan rows/s,
peak RSS, and the store requests the gets made.

With ``rocksdict`` installed (``pip install rocksdict``; RocksDB behind a Python binding), the
same keys are written to it (batches of 1,000, default options), it is reopened, and the same
20,000 gets (one ``get`` per key, then its multi-get in batches of 1,000) are timed, in a
separate process after slatepy's so neither's memory counts for the other.
Writes ``bench/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import location
from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.store import open_store

RESULTS = Path(__file__).parent / "results"
GETS = 20_000
VALUE = b"v" * 100


def key(i: int) -> bytes:
    return b"key%013d" % i


def measure(keys: int, store: str) -> dict[str, Any]:
    """One size, in this process."""
    with location(store, compactor="in-process") as (url, settings):
        start = time.perf_counter()
        db = Db.open(url, settings=settings)
        for first in range(0, keys, 1000):
            batch = WriteBatch()
            for i in range(first, min(first + 1000, keys)):
                batch.put(key(i), VALUE)
            db.write(batch)
        written = time.perf_counter() - start
        start = time.perf_counter()
        db.close()
        closed = time.perf_counter() - start
        quiet = Settings.from_dict({**_fields(settings), "compactor": "off"})
        Compactor(open_store(url, quiet), settings=quiet).run_until_idle()
        warm_page_cache(url)
        with Db.open(url, settings=quiet) as db:
            rng = random.Random(7)
            probes = [key(rng.randrange(keys)) for _ in range(GETS)]
            before = {k: v.requests for k, v in db.metrics.snapshot().items()}
            start = time.perf_counter()
            found = sum(db.get(k) is not None for k in probes)
            gets = time.perf_counter() - start
            requests = _requests_since(db, before)
        warm_page_cache(url)
        with Db.open(url, settings=quiet) as db:  # cold again, for the batched gets
            before = {k: v.requests for k, v in db.metrics.snapshot().items()}
            start = time.perf_counter()
            batched = sum(
                v is not None
                for first in range(0, GETS, 1000)
                for v in db.get_many(probes[first : first + 1000])
            )
            many = time.perf_counter() - start
            many_requests = _requests_since(db, before)
            start = time.perf_counter()
            rows = sum(1 for _ in db.scan())
            scanned = time.perf_counter() - start
        assert found == batched == GETS and rows == keys, (found, batched, rows)
    return {
        "keys": keys,
        "writes_rows_per_s": keys / written,
        "close_s": closed,
        "gets_per_s": GETS / gets,
        "get_requests_per_1000": {k: v * 1000 / GETS for k, v in requests.items()},
        "batched_gets_per_s": GETS / many,
        "batched_requests_per_1000": {k: v * 1000 / GETS for k, v in many_requests.items()},
        "scan_rows_per_s": rows / scanned,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def warm_page_cache(url: str) -> None:
    """Read every file of a ``file://`` database once, so the gets measure the engine, not
    this VM's disk: its kernel reclaims the page cache within seconds (DAMON), and a 4 KB
    ``pread`` that misses it costs ~1.1 ms here against ~4 µs when it hits. Both engines get
    the same treatment."""
    if not url.startswith("file://"):
        return
    for root, _, files in os.walk(url.removeprefix("file://")):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def measure_rocksdict(keys: int) -> dict[str, Any] | None:
    """The same writes and gets on RocksDB (``rocksdict``), or None if it is not installed."""
    try:
        import rocksdict
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        db = rocksdict.Rdict(tmp)
        start = time.perf_counter()
        for first in range(0, keys, 1000):
            batch = rocksdict.WriteBatch()
            for i in range(first, min(first + 1000, keys)):
                batch.put(key(i), VALUE)
            db.write(batch)
        written = time.perf_counter() - start
        db.close()
        warm_page_cache(f"file://{tmp}")
        db = rocksdict.Rdict(tmp)
        rng = random.Random(7)
        probes = [key(rng.randrange(keys)) for _ in range(GETS)]
        start = time.perf_counter()
        found = sum(db.get(k) is not None for k in probes)
        gets = time.perf_counter() - start
        start = time.perf_counter()
        batched = sum(
            v is not None
            for first in range(0, GETS, 1000)
            for v in db.get(probes[first : first + 1000])
        )
        many = time.perf_counter() - start
        db.close()
    assert found == batched == GETS, (found, batched)
    return {
        "writes_rows_per_s": keys / written,
        "gets_per_s": GETS / gets,
        "batched_gets_per_s": GETS / many,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _fields(settings: Settings) -> dict[str, Any]:
    return {f: getattr(settings, f) for f in settings.__struct_fields__}


def _requests_since(db: Db, before: dict[str, int]) -> dict[str, int]:
    now = {k: v.requests for k, v in db.metrics.snapshot().items()}
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--store", default="file", choices=["memory", "file", "s3"])
    parser.add_argument("--name", default="scaling")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rocksdict", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.store)))
        return
    if args.rocksdict is not None:
        print(json.dumps(measure_rocksdict(args.rocksdict)))
        return
    rows = []
    for keys in args.keys:
        row = _child(["--one", str(keys), "--store", args.store])
        if args.store == "file":
            row["rocksdict"] = _child(["--rocksdict", str(keys)])
        rows.append(row)
        print(_line(rows[-1]), flush=True)
    command = "python -m bench.scaling " + " ".join(sys.argv[1:])
    table = [
        f"Run `{command}`.",
        "",
        "| keys | random gets/s | batched gets/s | full scan rows/s | peak RSS | writes rows/s "
        "| close | requests / 1,000 gets (one by one; batched) |",
        "|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in rows),
    ]
    if any(r.get("rocksdict") for r in rows):
        table += [
            "",
            "The same data in RocksDB (`rocksdict`, default options), reopened:",
            "",
            "| keys | rocksdict gets/s | slatepy / rocksdict | rocksdict multi-get/s | "
            "slatepy get_many / rocksdict multi-get | rocksdict writes rows/s | "
            "rocksdict peak RSS |",
            "|---|---|---|---|---|---|---|",
            *(_rocks_line(r) for r in rows if r.get("rocksdict")),
        ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"command": command, "rows": rows}))
    (RESULTS / f"{args.name}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def _child(args: list[str]) -> dict[str, Any]:
    child = subprocess.run(
        [sys.executable, "-m", "bench.scaling", *args], capture_output=True, text=True, check=False
    )
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{child.stderr}")
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def _line(r: dict[str, Any]) -> str:
    def reqs(counts: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.1f}" for k, v in sorted(counts.items())) or "-"

    return (
        f"| {r['keys']:,} | {r['gets_per_s']:,.0f} | {r['batched_gets_per_s']:,.0f} | "
        f"{r['scan_rows_per_s']:,.0f} | {r['peak_rss_mb']:.0f} MB | "
        f"{r['writes_rows_per_s']:,.0f} | {r['close_s']:.1f} s | "
        f"{reqs(r['get_requests_per_1000'])}; {reqs(r['batched_requests_per_1000'])} |"
    )


def _rocks_line(r: dict[str, Any]) -> str:
    rocks = r["rocksdict"]
    return (
        f"| {r['keys']:,} | {rocks['gets_per_s']:,.0f} | "
        f"{r['gets_per_s'] / rocks['gets_per_s']:.2f}x | {rocks['batched_gets_per_s']:,.0f} | "
        f"{r['batched_gets_per_s'] / rocks['batched_gets_per_s']:.2f}x | "
        f"{rocks['writes_rows_per_s']:,.0f} | {rocks['peak_rss_mb']:.0f} MB |"
    )


if __name__ == "__main__":
    main()
