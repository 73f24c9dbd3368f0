"""Peak memory while ingesting many keys with default settings (in-process compactor on).

    python -m bench.ingest_rss --keys 2000000

Target (issue 6): peak RSS below ``max_unflushed_bytes`` + ``block_cache_bytes`` + 300 MB;
``python -m bench.write_rss`` measures the write patterns of issue 33 against 256 MB, and
docs/performance.md ("Memory") says what each budget bounds.
``--trace`` prints RSS, the memtable's accounted bytes and L0 every 200,000 keys (where the
memory goes, RFC 0011).
"""

from __future__ import annotations

import argparse
import resource
import time

from bench.common import location
from slatepy import Db, WriteBatch


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    base = rss_mb()
    with location("file", compactor="in-process") as (url, settings):
        budget = (settings.max_unflushed_bytes + settings.block_cache_bytes) / 2**20 + 300
        start = time.perf_counter()
        peak = 0.0
        with Db.open(url, settings=settings) as db:
            for first in range(0, args.keys, 1000):
                batch = WriteBatch()
                for i in range(first, min(first + 1000, args.keys)):
                    batch.put(b"key%013d" % i, b"v" * 100)
                db.write(batch)
                if first % 100_000 == 0:
                    peak = max(peak, rss_mb())
                if args.trace and first % 200_000 == 0:
                    print(
                        f"{first:>9} keys: RSS {rss_mb():.0f} MB, memtable "
                        f"{db._memtable.size_bytes / 2**20:.0f} MB accounted "
                        f"({len(db._memtable)} entries), L0 {len(db._view.l0)} SSTs "
                        f"{sum(h.object_size for h in db._view.l0) / 2**20:.0f} MB",
                        flush=True,
                    )
            elapsed = time.perf_counter() - start
            memtable = db._memtable.size_bytes / 2**20
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.keys} keys in {elapsed:.1f} s ({args.keys / elapsed:,.0f} rows/s); RSS at start "
        f"{base:.0f} MB, sampled peak {peak:.0f} MB, max RSS {max_rss:.0f} MB; memtable at "
        f"the end {memtable:.0f} MB accounted; budget {budget:.0f} MB "
        f"({'met' if max_rss <= budget else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
