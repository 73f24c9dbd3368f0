"""Reopen cost before and after compaction (and GC), and the space it takes.

    python -m bench.reopen --keys 1000000 --backend file

Writes ``--keys`` keys in awaited batches of 1,000 with the compactor off, so the whole
database is WAL; reopens it (time, objects read); compacts and collects garbage; reopens
again. Object reads are GETs, ranged GETs and LISTs counted by the store wrapper.
"""

from __future__ import annotations

import argparse
import time

from bench.common import location
from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.gc import GarbageCollector
from slatepy.store import open_store


def reopen(url: str, settings: Settings) -> str:
    start = time.perf_counter()
    with Db.open(url, settings=settings) as db:
        elapsed = time.perf_counter() - start
        ops = db.metrics.snapshot()
        reads = {k: v.requests for k, v in ops.items() if k != "put"}
        sample = db.get(b"key%012d" % 4242)
        assert sample == b"value-%012d" % 4242, sample
        return (
            f"{elapsed:.2f} s, replayed {db.replayed_ssts} WAL SSTs, reads {reads}, "
            f"memtable {len(db._memtable)} keys"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--backend", default="file")
    args = parser.parse_args()
    with location(args.backend) as (url, settings):
        start = time.perf_counter()
        with Db.open(url, settings=settings) as db:
            for first in range(0, args.keys, 1000):
                batch = WriteBatch()
                for i in range(first, min(first + 1000, args.keys)):
                    batch.put(b"key%012d" % i, b"value-%012d" % i)
                db.write(batch)
        print(f"wrote {args.keys} keys in {time.perf_counter() - start:.1f} s")
        print(f"reopen before compaction: {reopen(url, settings)}")
        store = open_store(url, settings)
        start = time.perf_counter()
        rounds = Compactor(store, settings=settings).run_until_idle()
        print(f"compaction: {rounds} rounds in {time.perf_counter() - start:.1f} s")
        report = GarbageCollector(store, settings=settings, min_age=0).collect()
        stored = sum(m.size for m in store.list(""))
        live = args.keys * (15 + 18)
        print(
            f"gc: deleted {len(report.deletions)} objects ({report.bytes} bytes); store holds "
            f"{stored} bytes for {live} bytes of keys+values ({stored / live:.2f}x)"
        )
        print(f"reopen after compaction: {reopen(url, settings)}")


if __name__ == "__main__":
    main()
