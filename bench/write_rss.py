"""A writer's peak RSS under several write patterns, one fresh process each (issue 33 item 4).

    python -m bench.write_rss                          # every pattern, default settings
    python -m bench.write_rss --patterns large-values --mb 512
    python -m bench.write_rss --trees /tmp/old /work/wt/mine --repeat 3   # A/B, interleaved

Each pattern writes about ``--mb`` MiB of keys and values (16-byte keys; distinct values, so
that every value is an object of its own as in a service, not one shared constant) to a
fresh ``file://`` database with default settings and the in-process compactor, then closes.
Reported per pattern: peak RSS (``VmHWM`` of the child, from just before the open to after
the close), CPU seconds (``time.process_time``, all threads), wall seconds, and the peak
over the RSS at start (what the writer added). Patterns:

- ``batches``: unawaited batches of 1,000 100-byte values (bench.growth's write phase).
- ``puts``: unawaited single puts of 100-byte values.
- ``awaited``: awaited batches of 1,000 100-byte values (a fsync pair each; fewer bytes).
- ``large-values``: unawaited single puts of 64 KiB values.
- ``huge-batch``: one batch of ``--mb`` / 4 MiB of 100-byte values (a batch is admitted
  whole, so the memtable may pass its budget by the batch: the caller holds it anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from slatepy import Db, WriteBatch

PATTERNS = ("batches", "puts", "awaited", "large-values", "huge-batch")
MB = 1024 * 1024


def status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def value_of(i: int, size: int) -> bytes:
    """A distinct value of ``size`` bytes for key ``i``."""
    stamp = b"%016d" % i
    return stamp + b"v" * (size - len(stamp))


def write_pattern(db: Db, pattern: str, total: int) -> int:
    """Write ``pattern`` into ``db``: about ``total`` bytes of keys and values; the count."""
    small = 16 + 100
    if pattern == "large-values":
        count = total // (64 * 1024 + 16)
        for i in range(count):
            db.put(b"key%013d" % i, value_of(i, 64 * 1024), await_durable=False)
        return count
    if pattern == "puts":
        count = total // small
        for i in range(count):
            db.put(b"key%013d" % i, value_of(i, 100), await_durable=False)
        return count
    if pattern == "huge-batch":
        count = total // 4 // small
        batch = WriteBatch()
        for i in range(count):
            batch.put(b"key%013d" % i, value_of(i, 100))
        db.write(batch, await_durable=False)
        return count
    awaited = pattern == "awaited"
    count = total // small // (8 if awaited else 1) // 1000 * 1000
    for first in range(0, count, 1000):
        batch = WriteBatch()
        for i in range(first, first + 1000):
            batch.put(b"key%013d" % i, value_of(i, 100))
        db.write(batch, await_durable=awaited)
    return count


def child(pattern: str, total: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="write-rss-")
    try:
        return measure(pattern, total, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(pattern: str, total: int, root: str) -> dict[str, Any]:
    start_rss = status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset VmHWM: the peak from here on
    cpu, wall = time.process_time(), time.perf_counter()
    with Db.open(f"file://{root}/db") as db:
        count = write_pattern(db, pattern, total)
        db.flush()
    return {
        "pattern": pattern,
        "entries": count,
        "start_mb": start_rss,
        "peak_mb": status_mb("VmHWM"),
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
    }


def run(tree: str | None, pattern: str, total: int) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    command = [sys.executable, "-m", "bench.write_rss", "--child", pattern, "--bytes", str(total)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    parser.add_argument("--mb", type=int, default=256, help="MiB of keys and values a pattern")
    parser.add_argument("--trees", nargs="*", default=[], help="source trees, A/B interleaved")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.bytes)))
        return
    trees: list[str | None] = list(args.trees) or [None]
    results: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    print(f"{args.mb} MiB a pattern, load {os.getloadavg()[0]:.1f}", flush=True)
    for _ in range(args.repeat):
        for pattern in args.patterns:
            for tree in trees:  # interleaved, repetition by repetition
                r = run(tree, pattern, args.mb * MB)
                results.setdefault((pattern, tree), []).append(r)
                print(f"  {pattern} {tree or '.'}: {json.dumps(r)}", flush=True)
    print("| pattern | tree | entries | peak RSS MB | added MB | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|")
    for (pattern, tree), rows in results.items():
        print(
            f"| {pattern} | {tree or '.'} | {rows[0]['entries']:,} "
            f"| {spread([r['peak_mb'] for r in rows], lambda v: f'{v:.0f}')} "
            f"| {spread([r['peak_mb'] - r['start_mb'] for r in rows], lambda v: f'{v:.0f}')} "
            f"| {spread([r['cpu_s'] for r in rows], lambda v: f'{v:.1f}')} "
            f"| {spread([r['wall_s'] for r in rows], lambda v: f'{v:.1f}')} |"
        )


if __name__ == "__main__":
    main()
