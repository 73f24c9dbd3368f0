"""How long after a durable put a snapshot reader in another process sees it.

    python -m bench.reader_lag --backends file s3 --writes 60

The writer (this process, in-process compactor on) puts a counter at random intervals of
20-200 ms; a ``DbReader`` child process polls ``get`` every millisecond and prints when
each value appears. Lag = seen time - acknowledged time (same machine clock). Values the
reader skipped because two writes fell into one poll interval are not counted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time

import msgspec

from bench.common import location
from slatepy import Db, DbReader, Settings


def reader_main(url: str, settings_json: str) -> None:
    settings = Settings.from_dict(json.loads(settings_json))
    with DbReader.open(url, settings=settings) as reader:
        print("READY", flush=True)
        last = None
        while True:
            value = reader.get(b"lag")
            if value != last:
                print(f"{value.decode() if value else '-'} {time.time():.6f}", flush=True)
                last = value
            time.sleep(0.001)


def run(name: str, writes: int, poll: float) -> str:
    with (
        location(name, compactor="in-process", reader_poll_interval=poll) as (url, settings),
        Db.open(url, settings=settings) as db,
    ):
        db.put(b"lag", b"start")
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.reader_lag",
                "--reader",
                url,
                json.dumps(msgspec.to_builtins(settings)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        seen: dict[str, float] = {}
        ready = threading.Event()

        def pump() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                if line.startswith("READY"):
                    ready.set()
                    continue
                value, at = line.split()
                seen.setdefault(value, float(at))

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(60)
        acked: dict[str, float] = {}
        rng = random.Random(7)
        for i in range(writes):
            time.sleep(rng.uniform(0.02, 0.2))
            db.put(b"lag", b"%d" % i)
            acked[str(i)] = time.time()
        deadline = time.monotonic() + 10
        while str(writes - 1) not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        child.kill()
        child.wait()
    lags = sorted((seen[v] - acked[v]) * 1e3 for v in acked if v in seen)
    p90 = lags[int(len(lags) * 0.9) - 1]
    return (
        f"| {name} | {poll * 1e3:.0f} | {len(lags)}/{writes} | {statistics.median(lags):.1f} "
        f"| {p90:.1f} | {lags[-1]:.1f} |"
    )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--reader":
        reader_main(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", nargs="+", default=["file", "s3"])
    parser.add_argument("--writes", type=int, default=60)
    parser.add_argument("--poll", type=float, default=0.1, help="reader_poll_interval, s")
    args = parser.parse_args()
    print("| store | poll ms | writes seen | lag p50 ms | lag p90 ms | lag max ms |")
    print("|---|---|---|---|---|---|")
    for name in args.backends:
        print(run(name, args.writes, args.poll), flush=True)


if __name__ == "__main__":
    main()
