"""Awaited batches of 1,000 on ``file://``: rate, CPU, fsyncs and PUTs per batch (issue 33).

    python -m bench.durable_batches --batches 100 --file-sync fsync fsync-file

Compactor off; 16-byte keys, 100-byte values. fsyncs are counted by wrapping ``os.fsync``
(every fsync slatepy issues goes through it), PUTs by the store's metrics. To compare two
trees, run it alternately with each tree first on ``PYTHONPATH`` (RFC 0006, issue 33).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from slatepy import Db, Settings, WriteBatch


def run(batches: int, file_sync: str) -> str:
    calls = [0]
    real = os.fsync

    def counting(fd: int) -> None:
        calls[0] += 1
        real(fd)

    os.fsync = counting
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(compactor="off", file_sync=file_sync)  # type: ignore[arg-type]
            with Db.open(f"file://{tmp}/db", settings=settings) as db:
                written = []
                for b in range(batches):
                    batch = WriteBatch()
                    for i in range(b * 1000, (b + 1) * 1000):
                        batch.put(b"key%013d" % i, b"v" * 100)
                    written.append(batch)
                db.metrics.reset()
                calls[0] = 0
                cpu, start = time.process_time(), time.perf_counter()
                for batch in written:
                    db.write(batch)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu
                puts = db.metrics.snapshot()["put"].requests
    finally:
        os.fsync = real
    return (
        f"| {file_sync} | {batches / elapsed:.1f} | {elapsed / batches * 1e3:.2f} "
        f"| {cpu / batches * 1e3:.2f} | {calls[0] / batches:.2f} | {puts / batches:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--file-sync", nargs="+", default=["fsync"], choices=["fsync", "fsync-file", "off"]
    )
    args = parser.parse_args()
    print("| file_sync | batches/s | ms/batch | CPU ms/batch | fsyncs/batch | PUTs/batch |")
    print("|---|---|---|---|---|---|")
    for _ in range(args.repeat):
        for file_sync in args.file_sync:  # interleaved
            print(run(args.batches, file_sync), flush=True)


if __name__ == "__main__":
    main()
