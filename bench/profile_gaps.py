"""Where slatepy's time goes in the workloads compared with rocksdict (issue 16).

    python -m bench.profile_gaps --keys 200000 --top 15

Runs the workloads of ``python -m bench`` on the file store with slatepy alone, first timed
plainly, then again on a fresh database under ``cProfile``, and prints each workload's top
functions by own time and by cumulative time (``--out DIR`` also keeps the ``.pstats``).
The profiler slows pure-Python code more than C calls, so read its shares, not its seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.engines import SlatepyEngine
from slatepy import Settings

VALUE = b"v" * 100


def key(i: int) -> bytes:
    return b"key%013d" % i


def workloads(engine: SlatepyEngine, keys: int) -> list[tuple[str, int, Callable[[], Any]]]:
    """``(name, operations, run)`` in the order ``python -m bench`` runs them."""
    all_keys = [key(i) for i in range(keys)]
    batch_keys = [b"b" + k[1:] for k in all_keys]
    sample = all_keys[:]
    random.Random(1).shuffle(sample)
    sample = sample[: min(keys, 10_000)]
    return [
        ("puts (not awaited)", keys, lambda: engine.put_many(all_keys, VALUE)),
        ("batches of 1000, awaited", keys, lambda: engine.batches(batch_keys, VALUE, 1000, True)),
        ("gets, memtable", len(sample), lambda: engine.get_many(sample)),
        ("to_ssts (not compared)", 1, engine.to_ssts),
        ("warming the caches (not compared)", len(sample), lambda: engine.get_many(sample)),
        ("gets, SSTs warm", len(sample), lambda: engine.get_many(sample)),
        ("full scan", 2 * keys, engine.scan_all),
    ]


def report(stats: pstats.Stats, sort: str, top: int) -> str:
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    return "\n".join(lines[start - 2 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None, help="keep <workload>.pstats here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = SlatepyEngine(f"file://{tmp}/plain", Settings())
        try:
            for name, ops, run in workloads(plain, args.keys):
                start = time.perf_counter()
                run()
                elapsed = time.perf_counter() - start
                print(f"{name}: {ops / elapsed:,.0f}/s ({elapsed:.2f} s, no profiler)")
        finally:
            plain.close()
        profiled = SlatepyEngine(f"file://{tmp}/profiled", Settings())
        try:
            for name, _, run in workloads(profiled, args.keys):
                profiler = cProfile.Profile()
                profiler.runcall(run)
                stats = pstats.Stats(profiler)
                if args.out:
                    args.out.mkdir(parents=True, exist_ok=True)
                    stats.dump_stats(args.out / f"{name.split(' (')[0].replace(' ', '_')}.pstats")
                print(f"\n=== {name}: by own time")
                print(report(stats, "tottime", args.top))
                print(f"\n=== {name}: by cumulative time")
                print(report(stats, "cumulative", args.top))
        finally:
            profiled.close()


if __name__ == "__main__":
    main()
