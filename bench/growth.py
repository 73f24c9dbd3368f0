"""Growth without surprises (issue 33, item 4): the same workload at two sizes, one process each.

    python -m bench.growth                        # 100k and 2M keys, default settings
    python -m bench.growth --sizes 100000 2000000 --order sequential
    python -m bench.growth --set max_unflushed_bytes=536870912   # the old default
    python -m bench.growth --rocksdict            # RocksDB's own ratio on the same keys

Per size, in a fresh process (so peak RSS is that size's alone): write the keys (16-byte
keys, 100-byte values) in unawaited batches of 1,000 with default settings (the in-process
compactor on), close, compact fully (``slatepy compact --full``, as RocksDB's side calls
``compact_range``; and collect garbage), reopen, then 20,000 random
gets of written keys and a full scan. Reports peak RSS (``VmHWM``, reset between phases) of the
write phase, the compaction and the reads, and of the whole process (the largest), the
write rate, gets/s and scanned rows/s (and their CPU: wall rates move 2x on a shared machine),
the layout read (L0 SSTs, sorted runs), and the ratios of the
largest size to the smallest. Targets: gets and scan keep >= 0.5x of their rate, peak RSS
<= 2x and under 256 MB at default settings.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

from bench.memory_trace import Sampler
from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import open_store

GETS = 20_000
STRIDE = 1_000_003
VALUE = b"v" * 100


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    """Peak RSS of the process so far: the largest ``VmHWM`` of its phases (``ru_maxrss``
    would include the forking parent's, which Linux carries over ``execve``)."""
    return max(PEAKS, default=0.0)


PEAKS: list[float] = []


def keys_in(order: str, count: int) -> Iterator[int]:
    """``0 .. count - 1`` in order, or permuted (``i * STRIDE mod count``, a bijection since
    the stride is a prime not dividing ``count``): no list of the keys in memory, whose
    2M ints (72 MB) would be the benchmark's memory, not the engine's."""
    if order == "sequential":
        return iter(range(count))
    assert math.gcd(STRIDE, count) == 1, count
    return (i * STRIDE % count for i in range(count))


def reset_peak() -> None:
    """Start a new high-water mark of RSS (Linux: ``clear_refs`` 5 resets ``VmHWM``)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def hwm_mb() -> float:
    """RSS high-water mark since the last :func:`reset_peak` (also kept for :func:`peak_mb`)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                PEAKS.append(int(line.split()[1]) / 1024)
                return PEAKS[-1]
    return 0.0


def engine_gauges(sampler: Sampler | None, db: Db) -> None:
    """Register ``db``'s memory gauges with ``sampler`` (its accounted budgets)."""
    if sampler is None:
        return
    sampler.gauges["memtable_mb"] = lambda: db._memtable.size_bytes
    sampler.gauges["block_cache_mb"] = lambda: db._tables._blocks.size
    sampler.gauges["meta_cache_mb"] = lambda: db._tables._metas.size
    sampler.gauges["pinned_tops_mb"] = lambda: db._tables._pinned_bytes


def slatepy_child(
    count: int, order: str, overrides: dict[str, Any], root: str, trace: str | None = None
) -> dict[str, Any]:
    settings = Settings.from_dict(overrides)
    url = f"file://{root}/db"
    if trace == "tracemalloc":
        tracemalloc.start(1)
    sampler = Sampler(snapshots=trace == "tracemalloc").start() if trace else None
    started = rss_mb()
    reset_peak()
    start = time.perf_counter()
    if sampler:
        sampler.enter("write")
    with Db.open(url, settings=settings) as db:
        engine_gauges(sampler, db)
        numbers = keys_in(order, count)
        for _ in range(0, count, 1000):
            batch = WriteBatch()
            for i in itertools.islice(numbers, 1000):
                batch.put(b"key%013d" % i, VALUE)
            db.write(batch, await_durable=False)
        db.flush()
    write_s = time.perf_counter() - start
    write_peak = hwm_mb()
    if sampler:
        sampler.gauges.clear()
        sampler.enter("compact")
    reset_peak()
    store = open_store(url, settings)
    start = time.perf_counter()
    # Into one sorted run, as RocksDB's side does with compact_range(None, None).
    Compactor(store, settings=settings).run_until_idle(full=True)
    GarbageCollector(store, settings=settings, min_age=0).collect()
    compact_s = time.perf_counter() - start
    compact_peak = hwm_mb()
    if sampler:
        sampler.enter("reopen")
    reset_peak()
    rng = random.Random(7)
    probes = [b"key%013d" % rng.randrange(count) for _ in range(GETS)]
    with Db.open(url, settings=Settings.from_dict({**overrides, "compactor": "off"})) as db:
        engine_gauges(sampler, db)
        view = db._view
        layout = f"L0 {len(view.l0)}, runs " + (
            "+".join(f"{sum(h.object_size for h in r.ssts) / 2**20:.0f}" for r in view.sorted_runs)
            or "0"
        )
        if sampler:
            sampler.enter("gets")
        start, cpu = time.perf_counter(), time.process_time()
        found = sum(db.get(key) is not None for key in probes)
        get_s, get_cpu = time.perf_counter() - start, time.process_time() - cpu
        if sampler:
            sampler.enter("scan")
        start, cpu = time.perf_counter(), time.process_time()
        rows = sum(1 for _ in db.scan())
        scan_s, scan_cpu = time.perf_counter() - start, time.process_time() - cpu
    assert found == GETS and rows == count, (found, rows)
    traced: dict[str, Any] = {}
    if sampler:
        sampler.stop()
        traced = {"trace": sampler.report()}
    return {
        **traced,
        "keys": count,
        "layout": layout,
        "rss_start_mb": started,
        "write_peak_mb": write_peak,
        "compact_peak_mb": compact_peak,
        "read_peak_mb": hwm_mb(),
        "peak_mb": peak_mb(),
        "write_rows_s": count / write_s,
        "compact_s": compact_s,
        "gets_s": GETS / get_s,
        "scan_rows_s": rows / scan_s,
        "gets_cpu_us": get_cpu / GETS * 1e6,
        "scan_cpu_s": scan_cpu,
    }


def rocksdict_child(count: int, order: str, root: str) -> dict[str, Any]:
    from rocksdict import Rdict
    from rocksdict import WriteBatch as RocksBatch

    start = time.perf_counter()
    db = Rdict(f"{root}/rocks")
    numbers = keys_in(order, count)
    for _ in range(0, count, 1000):
        batch = RocksBatch()
        for i in itertools.islice(numbers, 1000):
            batch.put(b"key%013d" % i, VALUE)
        db.write(batch)
    db.close()
    write_s = time.perf_counter() - start
    write_peak = hwm_mb()
    reset_peak()
    db = Rdict(f"{root}/rocks")
    db.compact_range(None, None)
    rng = random.Random(7)
    probes = [b"key%013d" % rng.randrange(count) for _ in range(GETS)]
    start = time.perf_counter()
    found = sum(db.get(key) is not None for key in probes)
    get_s = time.perf_counter() - start
    start = time.perf_counter()
    rows = sum(1 for _ in db.items())
    scan_s = time.perf_counter() - start
    db.close()
    assert found == GETS and rows == count, (found, rows)
    return {
        "keys": count,
        "write_peak_mb": write_peak,
        "compact_peak_mb": 0.0,
        "read_peak_mb": hwm_mb(),
        "peak_mb": peak_mb(),
        "write_rows_s": count / write_s,
        "gets_s": GETS / get_s,
        "scan_rows_s": rows / scan_s,
    }


def run_child(args: argparse.Namespace, engine: str, count: int) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.growth",
        "--child",
        str(count),
        "--engine",
        engine,
        "--order",
        args.order,
        *(["--trace", args.trace] if args.trace else []),
        *[item for pair in args.set for item in ("--set", pair)],
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        try:
            overrides[name] = json.loads(text)
        except json.JSONDecodeError:
            overrides[name] = text
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 2_000_000])
    parser.add_argument("--order", choices=["random", "sequential"], default="random")
    parser.add_argument("--set", action="append", default=[], help="a setting, name=json")
    parser.add_argument("--rocksdict", action="store_true", help="also run rocksdict")
    parser.add_argument(
        "--trace",
        choices=["rss", "tracemalloc"],
        help="sample memory by owner (bench.memory_trace); tracemalloc also names the "
        "allocation sites at each phase's peak (slow: rates are then not comparable)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="slatepy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        root = tempfile.mkdtemp(prefix="growth-")
        try:
            if args.engine == "rocksdict":
                result = rocksdict_child(args.child, args.order, root)
            else:
                result = slatepy_child(
                    args.child, args.order, parse_overrides(args.set), root, args.trace
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(result))
        return
    engines = ["slatepy", "rocksdict"] if args.rocksdict else ["slatepy"]
    print(f"order={args.order} settings={args.set or 'default'} load={os.getloadavg()[0]:.1f}")
    print(
        "| engine | keys | write rows/s | peak MB: write / compact / read / process "
        "| gets/s | scan rows/s | read layout (MiB a run) | CPU: µs a get / s a scan |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    for count in args.sizes:
        for engine in engines:  # interleaved, so load changes hit both alike
            r = run_child(args, engine, count)
            results[engine].append(r)
            print(
                f"| {engine} | {count:,} | {r['write_rows_s']:,.0f} | {r['write_peak_mb']:.0f} / "
                f"{r['compact_peak_mb']:.0f} / {r['read_peak_mb']:.0f} / {r['peak_mb']:.0f} "
                f"| {r['gets_s']:,.0f} | {r['scan_rows_s']:,.0f} | {r.get('layout', '')} "
                f"| {r.get('gets_cpu_us', 0):.0f} / {r.get('scan_cpu_s', 0):.2f} |",
                flush=True,
            )
            for phase, row in r.get("trace", {}).get("peaks", {}).items():
                print(f"  {phase}: {json.dumps(row)}")
            for phase, lines in r.get("trace", {}).get("top", {}).items():
                print(f"  {phase} top allocation sites at its peak:")
                print("\n".join(f"    {line}" for line in lines))
    for engine, rows in results.items():
        small, large = rows[0], rows[-1]
        print(
            f"{engine} {large['keys']:,} / {small['keys']:,}: peak RSS "
            f"{large['peak_mb'] / small['peak_mb']:.2f}x, gets "
            f"{large['gets_s'] / small['gets_s']:.2f}x, scan "
            f"{large['scan_rows_s'] / small['scan_rows_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
