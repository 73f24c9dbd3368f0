"""Warm SST gets and full scans of one compacted database against rocksdict (issue 16's read
path), timed with ``time.perf_counter`` (the best of ``--repeat``, no profiler).

    python -m bench.read_path --keys 200000

16-byte keys, 100-byte values on ``file://``, loaded in batches of 1,000 and compacted
into one sorted run (as ``bench.scan_batches`` does); rocksdict loaded the same way,
flushed and compacted. Prints: microseconds per warm get (a random 20,000 keys, each
block already cached), per row of ``Db.scan`` with blocks decoded as the scan goes
("decoding"), and again once gets have left every block decoded in the block cache
("cached blocks"), with rocksdict's ``get`` and ``items()``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scan_batches import VALUE, keys_of, load
from slatepy import Db, Settings


def best(fn: Callable[[], Any], ops: int, repeat: int) -> float:
    """Microseconds per operation of the fastest of ``repeat`` runs of ``fn``."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) / ops * 1e6)
    return min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    import rocksdict

    n, rep = args.keys, args.repeat
    keys = keys_of(n)
    sample = random.Random(1).sample(keys, min(n, 20_000))
    settings = Settings(compactor="off")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/db"
        load(url, settings, keys)
        with Db.open(url, settings=settings) as db:
            scan_decoding = best(lambda: sum(1 for _ in db.scan()), n, rep)
            get = db.get
            for _ in range(3):  # every sampled block cached, and hot enough to be decoded
                for k in sample:
                    get(k)
            gets = best(lambda: [get(k) for k in sample], len(sample), rep)
            scan_cached = best(lambda: sum(1 for _ in db.scan()), n, rep)
        rdb = rocksdict.Rdict(str(Path(tmp) / "rocks"), rocksdict.Options(raw_mode=True))
        for first in range(0, n, 1000):
            batch = rocksdict.WriteBatch(raw_mode=True)
            for k in keys[first : first + 1000]:
                batch.put(k, VALUE)
            rdb.write(batch)
        rdb.flush()
        rdb.compact_range(None, None)
        rget = rdb.get
        for k in sample:
            rget(k)
        rocks_gets = best(lambda: [rget(k) for k in sample], len(sample), rep)
        rocks_scan = best(lambda: sum(1 for _ in rdb.items()), n, rep)
        rdb.close()
    print(f"{'workload':34} {'slatepy':>12} {'rocksdict':>12} {'slatepy/rocksdict':>18}")
    for name, ours, theirs in (
        ("warm SST get, us", gets, rocks_gets),
        ("full scan (decoding), us/row", scan_decoding, rocks_scan),
        ("full scan (cached blocks), us/row", scan_cached, rocks_scan),
    ):
        print(f"{name:34} {ours:12.3f} {theirs:12.3f} {theirs / ours:17.2f}x")


if __name__ == "__main__":
    main()
