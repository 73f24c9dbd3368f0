"""Full-scan throughput: ``Db.scan`` (a Python call per row) against ``Db.scan_batches``
(a call per batch; rows and Arrow), reverse scans, and RocksDB's ``rocksdict`` (RFC 0020).

    python -m bench.scan_batches --keys 200000

16-byte keys, 100-byte values, on a ``file://`` store: loaded in batches of 1,000 and
compacted into one sorted run. rocksdict (RocksDB's Python binding, in the
same process) is loaded with the same keys, flushed and compacted, and scanned with its
iterator (``db.items()``). Prints rows/s per way (cold: a freshly opened database; warm: the
best of ``--repeat`` interleaved rounds) and the warm ratio to rocksdict.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store import open_store

VALUE = b"v" * 100


def keys_of(n: int) -> list[bytes]:
    return [b"key-%012d" % i for i in range(n)]  # 16 bytes


def load(url: str, settings: Settings, keys: list[bytes]) -> None:
    with Db.open(url, settings=settings) as db:
        for first in range(0, len(keys), 1000):
            batch = WriteBatch()
            for key in keys[first : first + 1000]:
                batch.put(key, VALUE)
            db.write(batch)
    policy = CompactionPolicy(l0_trigger=1)
    Compactor(open_store(url, settings), settings=settings, policy=policy).run_until_idle()


def timed(count: Callable[[], int], n: int, repeat: int) -> tuple[float, float]:
    """(cold rows/s, best warm rows/s)."""
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        rows = count()
        elapsed = time.perf_counter() - started
        assert rows == n, (rows, n)
        rates.append(rows / elapsed)
    return rates[0], max(rates[1:] or rates)


def slatepy_ways(db: Db) -> dict[str, Callable[[], int]]:
    return {
        "scan": lambda: sum(1 for _ in db.scan()),
        "scan(reverse)": lambda: sum(1 for _ in db.scan(reverse=True)),
        "iter": lambda: sum(1 for _ in db.iter()),
        "scan_batches(rows)": lambda: sum(len(b) for b in db.scan_batches(batch_size=4096)),
        "scan_batches(rows, reverse)": lambda: sum(
            len(b) for b in db.scan_batches(batch_size=4096, reverse=True)
        ),
        "scan_batches(columns)": lambda: sum(
            len(k) for k, _ in db.scan_batches(batch_size=4096, format="columns")
        ),
        "scan_batches(arrow)": lambda: sum(
            b.num_rows for b in db.scan_batches(batch_size=4096, format="arrow")
        ),
    }


WAYS = [
    "scan",
    "scan(reverse)",
    "iter",
    "scan_batches(rows)",
    "scan_batches(rows, reverse)",
    "scan_batches(columns)",
    "scan_batches(arrow)",
]


def rocksdict_rate(keys: list[bytes], repeat: int) -> tuple[float, float] | None:
    try:
        import rocksdict
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        opts = rocksdict.Options(raw_mode=True)
        rdb = rocksdict.Rdict(str(Path(tmp) / "rocks"), opts)
        for first in range(0, len(keys), 1000):
            wb = rocksdict.WriteBatch(raw_mode=True)
            for key in keys[first : first + 1000]:
                wb.put(key, VALUE)
            rdb.write(wb)
        rdb.flush()
        rdb.compact_range(None, None)
        try:
            return timed(lambda: sum(1 for _ in rdb.items()), len(keys), repeat)
        finally:
            rdb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    keys = keys_of(args.keys)
    settings = Settings(compactor="off")
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/db"
        load(url, settings, keys)
        cold: dict[str, float] = {}
        for name in WAYS:  # each on a freshly opened database: nothing cached
            with Db.open(url, settings=settings) as db:
                cold[name] = timed(slatepy_ways(db)[name], args.keys, 1)[0]
        warm = dict.fromkeys(WAYS, 0.0)
        with Db.open(url, settings=settings) as db:
            ways = slatepy_ways(db)
            for _ in range(args.repeat):  # interleaved rounds, best of each: load noise
                for name in WAYS:
                    warm[name] = max(warm[name], timed(ways[name], args.keys, 1)[0])
        results = {name: (cold[name], warm[name]) for name in WAYS}
    rocks = rocksdict_rate(keys, args.repeat)
    if rocks is not None:
        results["rocksdict items()"] = rocks
    print(f"full scan of {args.keys} keys (16 B keys, 100 B values, file://), rows/s")
    print(f"{'way':32} {'cold':>12} {'warm':>12} {'warm / rocksdict':>18}")
    for name, (cold, warm) in results.items():
        ratio = f"{warm / rocks[1]:.2f}" if rocks else "-"
        print(f"{name:32} {cold:12,.0f} {warm:12,.0f} {ratio:>18}")


if __name__ == "__main__":
    main()
